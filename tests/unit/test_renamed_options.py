"""Options renamed so that one word means one thing keep their old spelling: `appliance start
--timing SYSTEM` and `kv replay --timing SYSTEM` are now `--fabric SYSTEM` (the fabric system the
appliance models, as multihost's --fabric), and `--timing` stays the TCG plugin's mode (count,
trace, inject)."""

from __future__ import annotations

import pytest

from pfcxl.device.fabric.modes import SYSTEMS
from pfcxl.host_tools.cli import main as cli

pytestmark = pytest.mark.unit


COMMANDS = [["appliance", "start"], ["kv", "replay", "trace.jsonl", "--on", "guests"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("system", tuple(SYSTEMS))
@pytest.mark.parametrize("spelling", ["--fabric", "--timing"])
def test_either_spelling_reads_the_fabric(command, spelling, system, capsys):
    args = cli.parser().parse_args([*command, spelling, system])
    assert args.fabric == system and "timing" not in vars(args)
    err = capsys.readouterr().err
    if spelling == "--timing":
        assert err == "pfcxl: notice: --timing is now --fabric (the old spelling still works)\n"
    else:
        assert err == ""


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("spelling", ["--fabric", "--timing"])
def test_the_old_spelling_checks_its_value_as_the_new_one_does(command, spelling, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.parser().parse_args([*command, spelling, "trace"])
    assert exit.value.code == 2
    assert f"argument {spelling}: invalid choice: 'trace'" in capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_the_help_names_the_old_spelling_as_such(command, capsys):
    with pytest.raises(SystemExit):
        cli.parser().parse_args([*command[:2], "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--fabric {pf,electrical}" in out and "--timing FABRIC the old spelling of --fabric" in out


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_without_either_the_appliance_is_untimed(command):
    assert cli.parser().parse_args(command).fabric is None


def test_the_plugin_mode_keeps_its_name():
    args = cli.parser().parse_args(["run", "--timing", "trace", "--", "true"])
    assert args.timing == "trace"
