"""QEMU's own CXL test machine (tests/qtest/bios-tables-test.c, test_acpi_q35_cxl) as a pfcxl
topology, tests/data/topologies/qemu-qtest-cxl.toml: its command line, and its CEDT against
QEMU's golden table, with the differences explained."""

import pytest
from pfcxl.device.topology import address_map
from pfcxl.device import topology
from pfcxl.device.topology.units import GiB, KiB, MiB
from pfcxl.firmware_tables import cedt, table_files

from tests.topology_data import GOLDEN_CEDT, QTEST, argv_of, doc_of, values_of


# tests/qtest/bios-tables-test.c, test_acpi_q35_cxl (QEMU 10.0.2): its bridges and ports, verbatim.
QTEST_BUSES = ["pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.1", "pxb-cxl,bus_nr=222,bus=pcie.0,id=cxl.2",
               "cxl-rp,port=0,bus=cxl.1,id=rp1,chassis=0,slot=2", "cxl-rp,port=1,bus=cxl.1,id=rp2,chassis=0,slot=3",
               "cxl-rp,port=0,bus=cxl.2,id=rp3,chassis=0,slot=5", "cxl-rp,port=1,bus=cxl.2,id=rp4,chassis=0,slot=6"]

pytestmark = pytest.mark.unit


def test_qtest_machine_renders_the_qtest_command_line():
    topo = topology.load(QTEST)
    argv = argv_of(topo, "/r")
    assert values_of(argv, "-device", "pxb-cxl") + values_of(argv, "-device", "cxl-rp") == QTEST_BUSES
    type3 = values_of(argv, "-device", "cxl-type3")
    # the qtest's devices have no id or serial; everything else is theirs
    assert [t.split(",id=")[0] for t in type3] == [
        f"cxl-type3,bus=rp{n},persistent-memdev=backend-cxl-pmem{n},lsa=lsa-backend-cxl-pmem{n}" for n in (1, 2, 3, 4)]
    sizes = [o.rsplit("size=", 1)[1] for o in values_of(argv, "-object", "memory-backend-file")]
    assert sizes == [str(256 * MiB)] * 8
    assert argv[argv.index("-m") + 1] == "256M"
    assert [(w.size, w.targets, w.granularity) for w in topo.windows] == [
        (4 * GiB, ("cxl.1",), 8 * KiB), (4 * GiB, ("cxl.1", "cxl.2"), 8 * KiB)]


def _chbs_in_order(table: bytes, uids: list[int]) -> bytes:
    """The same CEDT with its CHBS structures in the order of `uids` (they lead the table)."""
    decoded = cedt.decode_table(table)
    chbs = {s.values["uid"]: table[s.offset:s.offset + s.length] for s in decoded.subtables if s.layout is cedt.CHBS}
    first = min(s.offset for s in decoded.subtables)
    return table[:first] + b"".join(chbs[u] for u in uids) + table[first + sum(map(len, chbs.values())):]


def test_qtest_machine_cedt_equals_qemus_golden_table():
    golden = GOLDEN_CEDT.read_bytes()
    ours = cedt.from_topology(topology.load(QTEST))
    assert cedt.decode_table(golden).violations == []
    assert table_files.compare_cedt(ours, golden) == []
    # Documented difference 1: CHBS order. QEMU lists the host bridges in the order of an internal
    # GLib hash of their ids (cxl.2 first here); we list them as the topology does. Put in
    # QEMU's order, our table is QEMU's byte for byte, header and checksum included.
    assert ours != golden
    golden_order = [s.values["uid"] for s in cedt.decode_table(golden).subtables if s.layout is cedt.CHBS]
    assert golden_order == [222, 12]
    assert _chbs_in_order(ours, golden_order) == golden


def test_qtest_machine_with_hotplug_room_moves_every_base_by_the_dimm_area():
    # Documented difference 2 (before guests could go without hotplug room): the pfcxl default
    # guest (1 GiB, maxmem 2 GiB, 4 slots) puts 1 GiB + 4 x 1 GiB of DIMM area below the CXL
    # base. Every CHBS and CFMWS base then moves by exactly that; nothing else changes.
    doc = doc_of(QTEST)
    doc["guest"] = {"memory": "1G", "maxmem": "2G", "slots": 4}
    shifted = cedt.decode_table(cedt.from_topology(topology.from_dict(doc)))
    golden = cedt.decode_table(GOLDEN_CEDT.read_bytes())
    delta = 5 * GiB
    assert address_map.cxl_base(topology.from_dict(doc)) == 4 * GiB + delta
    base_field = {"CHBS": "base", "CFMWS": "base_hpa"}
    pairs = sorted(shifted.subtables, key=lambda s: (s.layout is not cedt.CHBS, s.values.get("uid", 0), s.offset))
    expect = sorted(golden.subtables, key=lambda s: (s.layout is not cedt.CHBS, s.values.get("uid", 0), s.offset))
    assert len(pairs) == len(expect) == 4
    for ours, theirs in zip(pairs, expect):
        field = base_field[ours.layout.name]
        assert ours.values[field] == theirs.values[field] + delta
        assert {k: v for k, v in ours.values.items() if k != field} == \
            {k: v for k, v in theirs.values.items() if k != field}


def test_host_bridge_that_no_window_targets_is_accepted():
    # QEMU accepts a CXL host bridge outside every window; it gets its CHBS and no CFMWS.
    doc = doc_of(QTEST)
    doc["host_bridge"].append({"id": "cxl.3", "bus_nr": 100})
    topo = topology.from_dict(doc)
    table = cedt.decode_table(cedt.from_topology(topo))
    assert sorted(s.values["uid"] for s in table.subtables if s.layout is cedt.CHBS) == [12, 100, 222]
    targeted = {t["uid"] for s in table.subtables if s.layout is cedt.CFMWS for t in s.values["targets"]}
    assert targeted == {12, 222}
    assert "pxb-cxl,bus_nr=100,bus=pcie.0,id=cxl.3" in values_of(argv_of(topo), "-device", "pxb-cxl")
