"""Commands on a booted guest's console (issue 11, items 1, 4, 5 and 14): long commands, bad
syntax, stdin readers, exit statuses and large output, all on the session's shared pf-nic guest."""

import os
import subprocess
import sys

import pytest

from pfcxl.errors import CommandError
from pfcxl.host_tools.vm import VMState

from .conftest import pfcxl_cli

pytestmark = pytest.mark.integration


@pytest.fixture
def vm(shared_machine):
    """The session's pf-nic guest: these tests only run commands and leave nothing behind."""
    return shared_machine("pf-nic")


def test_long_commands_run_as_written(vm):
    # ~1,000 characters used to hang until the command timeout: busybox's line editor drops them
    result = vm.run(f"echo {'a' * 1100} | wc -c", timeout=60)
    assert (result.status, result.output.strip()) == (0, "1101")
    script = "\n".join(f"echo line {i} 'quoted \"{i}\"'" for i in range(3000))    # ~100 kB
    result = vm.run(script, timeout=300)
    assert result.status == 0
    assert result.output.splitlines() == [f'line {i} quoted "{i}"' for i in range(3000)]


def test_bad_syntax_and_stdin_readers_fail_fast(vm):
    with pytest.raises(CommandError, match=r"not valid shell syntax \(sh -n\): .*unterminated quoted string"):
        vm.run("echo 'unbalanced", timeout=30)
    # the command gets /dev/null as stdin: cat sees the end at once rather than waiting forever
    assert vm.run("cat; echo after cat", timeout=30).output == "after cat\n"
    assert vm.state is VMState.READY and vm.run("echo still here", timeout=30).output == "still here\n"


def test_exit_status_is_the_commands(vm):
    assert vm.run("exit 7", timeout=30).status == 7
    assert vm.run(["sh", "-c", "exit 3"], timeout=30).status == 3
    assert vm.run(["echo", "a  b", "$HOME", "it's"], timeout=30).output == "a  b $HOME it's\n"
    assert vm.run("echo alive", timeout=30).output == "alive\n"     # exit 7 did not take the shell along


def test_a_mebibyte_of_output_arrives_byte_exact(vm):
    """Large output through the real serial line, byte for byte. That capture stays linear in
    the output's size (each byte read a bounded number of times, which 3 MiB once took minutes
    without) is proven on 8 MiB without a guest: tests/unit/test_console.py. The serial line under
    TCG moves ~100-250 kB/s here, so 8 MiB through it cost a worker about a minute of the suite."""
    size = 1 << 20
    line = b"pfcxl 0123456789 abcdefghijklmnopqrstuvwxyz\n"
    result = vm.run(f"yes '{line.decode().strip()}' | head -c {size}", timeout=240)
    assert result.status == 0
    assert result.output.encode() == (line * (size // len(line) + 1))[:size]


def test_run_exits_with_the_commands_status_on_a_shared_fresh_run_dir(tmp_path):
    # Two runs at once on one fresh --run-dir: both create the backing file (no FileExistsError),
    # and `pfcxl run` exits with the guest command's status, not 5.
    run_dir = tmp_path / "shared"
    procs = [subprocess.Popen([sys.executable, "-m", "pfcxl.host_tools.cli", "run", "--run-dir", str(run_dir),
                               "--", "exit", str(code)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for code in (7, 9)]
    outcomes = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    assert [rc for rc, _ in outcomes] == [7, 9], outcomes
    assert not any("Traceback" in e for _, e in outcomes)


def test_multihost_keeps_quoting():
    # joined with spaces this was `sh -c exit 3`: status 0, and "1 of 1 hosts ok"
    done = pfcxl_cli("multihost", "-n", "1", "--", "sh", "-c", "exit 3", timeout=900)
    assert done.returncode == 1, done.stderr
    assert "0 of 1 hosts ok" in done.stderr and "exit 3" in done.stderr


# a JSON line of 300 characters, rich markup, a run of spaces: data a script reads
GUEST_LINE = '{"key": "' + "x" * 280 + '", "tag": "[bold]a[/bold]   b"}'


@pytest.mark.parametrize("command", [["run"], ["multihost", "-n", "1"]])
def test_guest_output_goes_out_as_the_guest_wrote_it(command):
    """stdout a pipe (not a terminal): no rewrapping at any width, no markup eaten."""
    done = pfcxl_cli(*command, "--", "printf", "%s\\n", GUEST_LINE, timeout=900, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    assert GUEST_LINE in done.stdout.splitlines(), done.stdout
