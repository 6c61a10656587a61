"""Bad numbers, choices and names on the command line are refused before anything boots: one
line (the error and where the usage is, not the usage itself), exit 2."""

import subprocess
import sys

import pytest

from . import bounded_cli

pytestmark = pytest.mark.component


def pfcxl(*args: str) -> subprocess.CompletedProcess:
    # a wrong answer would boot a guest or start an appliance: the timeout bounds that
    return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", *args], capture_output=True,
                          text=True, timeout=120)


BAD_NUMBERS = [
    (["run", "--timeout", "-1", "--", "true"], "argument --timeout: -1 seconds: must be a finite number above 0"),
    (["run", "--timeout", "0", "--", "true"], "argument --timeout: 0 seconds: must be"),
    (["run", "--command-timeout", "-5", "--", "true"], "argument --command-timeout: -5 seconds"),
    (["boot", "--timeout", "nan"], "argument --timeout: nan seconds: must be a finite number above 0"),
    (["demo", "--timeout", "soon"], "argument --timeout: 'soon' is not a number of seconds"),
    (["bench", "--timeout", "-3"], "argument --timeout: -3 seconds"),
    (["multihost", "-n", "0", "--", "true"], "argument --hosts/-n: 0: must be at least 1"),
    (["multihost", "-n", "-1", "--", "true"], "argument --hosts/-n: -1: must be at least 1"),
    (["multihost", "-n", "2", "--timeout", "-1", "--", "true"], "argument --timeout: -1 seconds"),
    (["multihost", "-n", "2", "--command-timeout", "-1", "--", "true"], "argument --command-timeout: -1"),
]


def test_bad_numbers_are_refused_in_one_line():
    # every case through pfcxl's main() in one child process (bounded_cli: the imports paid once;
    # a wrong answer that went on to boot would hit its time limit)
    outcomes = bounded_cli.run([args for args, _ in BAD_NUMBERS], limit=1 << 30)
    assert len(outcomes) == len(BAD_NUMBERS)
    for done, (args, rule) in zip(outcomes, BAD_NUMBERS):
        assert done.rc == 2, (args, done.rc, done.stderr)
        assert rule in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr, args
        errors = [line for line in done.stderr.splitlines() if "error:" in line]
        assert len(errors) == 1, (args, done.stderr)


BAD_CHOICES = [
    (["run", "--timing", "x", "--", "true"], "pfcxl run: error: argument --timing: invalid choice: 'x'"),
    (["bench", "--suite", "quik"], "pfcxl bench: error: argument --suite: no suite 'quik' (shipped: quick, full"),
    (["kv"], "pfcxl kv: error: the following arguments are required: ACTION"),
    (["nosuch"], "pfcxl: error: argument COMMAND: invalid choice: 'nosuch'"),
    (["appliance", "start", "--fabric", "photonic"], "pfcxl appliance start: error: argument --fabric"),
]


def test_a_bad_choice_is_one_line_and_points_at_the_help():
    outcomes = bounded_cli.run([args for args, _ in BAD_CHOICES], limit=1 << 30)
    for done, (args, said) in zip(outcomes, BAD_CHOICES):
        lines = done.stderr.strip().splitlines()
        assert done.rc == 2 and len(lines) == 1, (args, done.rc, done.stderr)
        prog = said.split(": error:")[0]
        assert lines[0].startswith(said) and lines[0].endswith(f"; see {prog} --help"), (args, lines)


def _parsed(*argv: str):
    from pfcxl.host_tools.cli import main as cli
    args, extra = cli.parse(cli.parser(), list(argv))
    assert extra == []
    return args


@pytest.mark.parametrize("argv", [
    ["exec", "m1", "--command-timeout", "3", "--", "sleep 20"],       # after the name
    ["exec", "--command-timeout", "3", "m1", "--", "sleep 20"],       # before it, as always
])
def test_exec_options_are_options_wherever_they_stand_before_the_command(argv):
    args = _parsed(*argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    assert (args.name, args.command_timeout, command) == ("m1", 3.0, ["sleep 20"])


def test_what_follows_the_double_dash_is_the_command_word_for_word():
    args = _parsed("exec", "m1", "--", "sh", "-c", "echo --command-timeout", "--", "x")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command     # main drops a leading --
    assert (args.command_timeout, command) == (600, ["sh", "-c", "echo --command-timeout", "--", "x"])


@pytest.mark.parametrize("args, rule", [
    (["exec", "m1", "--command-timeout", "3", "sleep 20"], "--command-timeout after the positional arguments"),
    (["exec", "m1", "--bogus", "--", "true"], "unrecognized arguments: --bogus"),
])
def test_options_after_the_name_without_double_dash_or_unknown_are_refused(args, rule):
    done = pfcxl(*args)
    assert done.returncode == 2, done.stderr
    assert rule in done.stderr and "Traceback" not in done.stderr
