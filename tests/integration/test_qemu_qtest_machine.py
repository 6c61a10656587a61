"""QEMU's own CXL test machine (bios-tables-test's test_acpi_q35_cxl), booted from its pfcxl
topology: QEMU hands the guest its golden CEDT, and Linux finds the four pmem devices."""

from pathlib import Path

import pytest

from pfcxl.device.topology.units import MiB
from pfcxl.firmware_tables import generate, table_files
from pfcxl.host_tools.vm import discovery

from .conftest import guest_file, load

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parent.parent / "data"
QTEST = DATA / "topologies" / "qemu-qtest-cxl.toml"
GOLDEN_CEDT = DATA / "golden" / "CEDT.cxl"


@pytest.mark.pfcxl(topology=str(QTEST))
def test_qemu_qtest_machine_boots_with_qemus_golden_cedt(pfcxl_machine):
    topo, vm = load(str(QTEST)), pfcxl_machine
    # QEMU gives the guest, for this topology's command line, its own golden table byte for byte
    # (CHBS in QEMU's order); ours differs only in that order.
    seen = guest_file(vm, "/sys/firmware/acpi/tables/CEDT")
    assert seen == GOLDEN_CEDT.read_bytes()
    assert table_files.compare_cedt(generate.tables_for(topo).cedt, seen) == []
    found = discovery.discover(vm)
    assert [c for c in discovery.compare(topo, found) if not c.ok] == []
    sizes = sorted((m["serial"], m.get("pmem_size"), m.get("ram_size")) for m in found["memdevs"])
    assert sizes == [(n, 256 * MiB, None) for n in (1, 2, 3, 4)]
