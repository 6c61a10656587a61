"""Options renamed so that one word means one thing keep their old spelling: `appliance start
--timing SYSTEM` and `kv replay --timing SYSTEM` are now `--fabric SYSTEM` (the fabric system the
appliance models, as multihost's --fabric), and `--timing` stays the TCG plugin's mode (count,
trace, inject); `multihost --appliance-dir` is now `--run-dir`, the appliance's run directory as in
the appliance and kv commands."""

from __future__ import annotations

import pytest

from pfcxl.device.fabric.modes import APPLIANCE_FABRICS
from pfcxl.host_tools.cli import main as cli

pytestmark = pytest.mark.unit


COMMANDS = [["appliance", "start"], ["kv", "replay", "trace.jsonl", "--on", "guests"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("system", tuple(APPLIANCE_FABRICS))
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


@pytest.mark.parametrize("spelling", ["--run-dir", "--appliance-dir"])
def test_multihost_names_the_appliance_directory_run_dir_as_appliance_and_kv_do(spelling, capsys, tmp_path):
    args = cli.parser().parse_args(["multihost", "-n", "2", spelling, str(tmp_path), "--", "true"])
    assert args.appliance_dir == str(tmp_path)
    from pfcxl.host_tools.vm.boot_options import from_args
    assert from_args(args).appliance == str(tmp_path) and from_args(args).run_dir is None   # not the hosts' own
    err = capsys.readouterr().err
    assert err == ("pfcxl: notice: --appliance-dir is now --run-dir (the old spelling still works)\n"
                   if spelling == "--appliance-dir" else "")
