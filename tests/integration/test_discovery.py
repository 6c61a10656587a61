"""Each shipped topology booted once: the guest's real CXL subsystem finds what the topology
predicts, and the firmware tables it sees are the ones we generate (QEMU's CEDT equals ours;
every endpoint and switch serves our CDAT). Console commands and a guest's close() are checked
on test_sharing.py's two guests."""

import base64

import pytest

from pfcxl.firmware_tables import cdat, cedt, generate, table_files
from pfcxl.host_tools.vm import discovery

from .conftest import guest_file

pytestmark = pytest.mark.integration

TOPOLOGIES = ["pf-nic", "two-hb-interleave", "electrical-switch"]


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_guest_sees_the_predicted_topology_and_our_tables(shared_machine, name):
    vm = shared_machine(name)              # reads only: the session's guest of this topology
    topo = vm.topology

    found = discovery.discover(vm)
    checks = discovery.compare(topo, found)
    diffs = [c for c in checks if not c.ok]
    assert not diffs, "\n".join(f"{c.item} {c.field}: predicted {c.predicted!r}, guest {c.observed!r}"
                                for c in diffs)
    items = {c.item for c in checks}
    assert {"decoder0.0", "region0", "dax0.0"} <= items           # every kind really compared
    assert sum(c.item.startswith("memdev") for c in checks) == len(topo.devices)
    assert vm.ready["regions"] == [{"region": "region0", "type": "ram", "dax": "dax0.0", "mode": "devdax"}]
    assert vm.run("test -c /dev/dax0.0").status == 0

    # QEMU's CEDT, as the guest kernel read it, equals ours (CHBS compared as a set by UID)
    theirs = guest_file(vm, "/sys/firmware/acpi/tables/CEDT")
    ours = cedt.from_topology(topo)
    assert cedt.decode_table(theirs).violations == []
    assert table_files.compare_cedt(ours, theirs) == []

    # every device and switch serves exactly our CDAT (cdat= files), as read by Linux over DOE
    tables = generate.tables_for(topo)
    lines = vm.check("for e in /sys/bus/cxl/devices/endpoint*; do m=$(basename $(readlink $e/uport)); "
                     "echo \"$(cat /sys/bus/cxl/devices/$m/serial) $(base64 $e/CDAT | tr -d '\\n')\"; done")
    served = {int(s, 16): base64.b64decode(b) for s, b in (l.split() for l in lines.splitlines() if l.strip())}
    assert served == {d.serial: tables.device_cdat[d.id] for d in topo.devices}
    for data in served.values():
        assert cdat.decode_table(data).violations == []
    if tables.switch_cdat:
        ports = vm.check("for p in /sys/bus/cxl/devices/port*; do if [ -e $p/CDAT ]; then echo $p; fi; done").split()
        assert [guest_file(vm, f"{p}/CDAT") for p in ports] == list(tables.switch_cdat.values())
