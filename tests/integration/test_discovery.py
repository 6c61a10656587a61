"""The guest's real CXL subsystem finds what the topology predicts, for every shipped topology."""

import pytest

from pfcxl.host_tools import discovery

from .conftest import load, pid_alive

pytestmark = pytest.mark.integration

TOPOLOGIES = ["pf-nic", "two-hb-interleave", "electrical-switch"]


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_guest_matches_prediction(boot, name):
    vm = boot(name)
    found = discovery.discover(vm)
    checks = discovery.compare(load(name), found)
    diffs = [c for c in checks if not c.ok]
    assert not diffs, "\n".join(f"{c.item} {c.field}: predicted {c.predicted!r}, guest {c.observed!r}"
                                for c in diffs)
    # every kind of object was really compared, not an empty list
    items = {c.item for c in checks}
    assert {"decoder0.0", "region0", "dax0.0"} <= items
    assert sum(c.item.startswith("memdev") for c in checks) == len(load(name).devices)
    assert vm.ready_info["regions"] == [{"region": "region0", "dax": "dax0.0", "mode": "devdax"}]
    # device-DAX really usable: a character device that daxio can map
    assert vm.run("test -c /dev/dax0.0").status == 0


def test_console_commands_and_lifecycle(boot):
    vm = boot("pf-nic")
    assert vm.run("echo hello; echo world").output == "hello\nworld\n"
    failed = vm.run("ls /nonexistent-path")
    assert failed.status != 0 and "nonexistent-path" in failed.output
    assert vm.run("(exit 3)").status == 3
    status = vm.qmp("query-status")
    assert status["running"] is True
    pid = vm.pid
    vm.shutdown()
    vm.shutdown()   # harmless twice
    assert not pid_alive(pid)
