"""Machines that stay up, without booting: names, the --reuse key, and one-line errors for
machines that are not there."""

import pytest

from pfcxl.device import topology
from pfcxl.errors import PfcxlError, VMError
from pfcxl.host_tools.fleet import detached
from pfcxl.host_tools.vm.boot_options import BootOptions
from pfcxl.host_tools.cli.main import main

pytestmark = pytest.mark.unit



@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PFCXL_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("name", ["", "a/b", "..", "-x", "x" * 65, "sp ace"])
def test_bad_names_are_refused_in_one_line(name):
    with pytest.raises(PfcxlError, match="must be 1-64 letters, digits"):
        detached.machine_dir(name)


def test_no_machine_up_means_nothing_to_reuse_list_or_exec(capsys):
    assert detached.names() == [] and detached.find_reusable(topology.resolve("pf-nic"), BootOptions()) is None
    with pytest.raises(PfcxlError, match="no machine 'm1' is up") as raised:
        detached.exec_command("m1", "true")
    assert type(raised.value) is PfcxlError          # a wrong name: not VMError, QEMU's failure code
    assert main(["exec", "m1", "--", "true"]) == PfcxlError.exit_code != VMError.exit_code
    assert main(["down", "m1"]) == PfcxlError.exit_code
    assert main(["down"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["pfcxl: error: no machine 'm1' is up (pfcxl ps lists them)"] * 2 + [
        "pfcxl: error: pfcxl down: give a machine name or --all"]
    assert main(["ps"]) == 0
    assert capsys.readouterr().out.strip() == "no machines are up (pfcxl up starts one)"


def test_up_refuses_run_only_options_before_starting_anything(tmp_path, capsys):
    assert main(["up", "--run-dir", str(tmp_path / "r")]) == 1
    assert "--run-dir is not for up" in capsys.readouterr().err
    assert not detached.machines_dir().exists()


def test_a_dead_machine_is_reported_not_waited_for(tmp_path):
    where = detached.machine_dir("m2")
    where.mkdir(parents=True)
    (where / detached.REQUEST).write_text('{"topology_name": "pf-nic"}')
    (where / detached.DAEMON).write_text('{"pid": 999999999, "started": 0}')
    assert detached.describe("m2")["state"].startswith("dead")
    with pytest.raises(VMError, match="machine 'm2' is dead"):
        detached.exec_command("m2", "true")
    detached.down("m2")
    assert not where.exists()
