"""Persistent-memory Type 3 devices (persistent + lsa) and guests without memory hotplug room:
reading, rules (one line per mistake), QEMU options, backing files, guest plan, discovery, CDAT."""

import copy

import pytest

from pfcxl.device.topology import address_map
from pfcxl.device import topology
from pfcxl.device.topology.units import GiB, KiB, MiB
from pfcxl.errors import TopologyError, VMError
from pfcxl.firmware_tables import cdat, generate
from pfcxl.guest import plan
from pfcxl.host_tools.vm import discovery
from pfcxl.host_tools.vm import qemu

from tests.topology_data import PMEM, argv_of, doc_of, values_of

pytestmark = pytest.mark.unit


# ------------------------------------------------------------------------ topology fields

def test_persistent_device_loads_with_its_label_area():
    topo = topology.load(PMEM)
    [dev] = topo.devices
    assert (dev.kind, dev.capacity, dev.persistent, dev.volatile, dev.lsa) == (
        "persistent", 512 * MiB, 512 * MiB, 0, 1 * MiB)
    [region] = topo.regions
    assert (region.kind, region.mode, region.size) == ("persistent", "devdax", 512 * MiB)
    assert topo.needs_pmem and not topo.needs_kmem


def test_persistent_device_renders_persistent_memdev_and_lsa():
    topo = topology.load(PMEM)
    argv = argv_of(topo, "/r")
    assert values_of(argv, "-object", "memory-backend-file") == [
        "memory-backend-file,id=backend-pmem0,share=on,mem-path=/r/pmem0.mem,size=536870912",
        "memory-backend-file,id=lsa-backend-pmem0,share=on,mem-path=/r/pmem0.lsa,size=1048576"]
    assert values_of(argv, "-device", "cxl-type3") == [
        "cxl-type3,bus=rp0,persistent-memdev=backend-pmem0,lsa=lsa-backend-pmem0,id=pmem0,sn=1346765313"]
    assert "volatile-memdev" not in " ".join(argv)


def test_volatile_device_renders_as_before():
    argv = argv_of(topology.load(topology.resolve("pf-nic")))
    [dev] = values_of(argv, "-device", "cxl-type3")
    assert "volatile-memdev=backend-pfnic0" in dev and "lsa=" not in dev
    assert not any(".lsa" in a for a in argv)


def test_backing_files_for_memory_and_label_area(tmp_path):
    topo = topology.load(PMEM)
    paths = qemu.prepare_backing(topo, tmp_path)
    assert paths == {"pmem0": tmp_path / "pmem0.mem"}
    assert (tmp_path / "pmem0.mem").stat().st_size == 512 * MiB
    assert (tmp_path / "pmem0.lsa").stat().st_size == 1 * MiB
    # existing files of the right size are reused, never truncated
    (tmp_path / "pmem0.lsa").write_bytes(b"labels".ljust(MiB, b"\0"))
    qemu.prepare_backing(topo, tmp_path)
    assert (tmp_path / "pmem0.lsa").read_bytes()[:6] == b"labels"


def test_wrong_size_label_area_is_refused_before_anything_is_created(tmp_path):
    topo = topology.load(PMEM)
    (tmp_path / "pmem0.lsa").write_bytes(b"\0" * 4096)
    with pytest.raises(VMError, match=r"pmem0.lsa holds 4096 bytes but device 'pmem0' needs 1048576"):
        qemu.prepare_backing(topo, tmp_path)
    assert not (tmp_path / "pmem0.mem").exists()


def _mutate(path, change) -> dict:
    doc = copy.deepcopy(doc_of(path))
    change(doc)
    return doc


def _dev(d: dict) -> dict:
    return d["device"][0]


MISTAKES = [
    ("both kinds", PMEM, lambda d: _dev(d).update(volatile="512M"),
     "device 'pmem0': give exactly one of 'volatile' and 'persistent'"),
    ("neither kind", PMEM, lambda d: (_dev(d).pop("persistent"), _dev(d).pop("lsa")),
     "device 'pmem0': give exactly one of 'volatile' and 'persistent'"),
    ("persistent without lsa", PMEM, lambda d: _dev(d).pop("lsa"),
     "device 'pmem0'.lsa: missing: a persistent device needs a label storage area"),
    ("lsa on a volatile device", topology.resolve("pf-nic"),
     lambda d: _dev(d).update(lsa="1M"), "device 'pfnic0'.lsa: only a persistent device has a label storage area"),
    ("lsa too small", PMEM, lambda d: _dev(d).update(lsa="64K"),
     "device 'pmem0'.lsa: 65536 bytes must be from 128 KiB"),
    ("lsa too large", PMEM, lambda d: _dev(d).update(lsa="512M"),
     "device 'pmem0'.lsa: 536870912 bytes must be from 128 KiB (room for the label index and namespace "
     "labels) to 256 MiB"),
    ("lsa not whole pages", PMEM, lambda d: _dev(d).update(lsa=128 * KiB + 512),
     "device 'pmem0'.lsa: 131584 bytes is not a multiple of 4 KiB"),
    ("lsa not a size", PMEM, lambda d: _dev(d).update(lsa="some"), "device 'pmem0'.lsa: 'some' is not a size"),
    ("persistent not 256M multiple", PMEM, lambda d: _dev(d).update(persistent="100M"),
     "device 'pmem0'.persistent: 104857600 bytes is not a positive multiple of 256 MiB"),
    ("persistent on the appliance", PMEM, lambda d: _dev(d).update(appliance="shared"),
     "device 'pmem0'.appliance: the appliance serves volatile memory"),
    ("pmem region as system-ram", PMEM, lambda d: d["region"][0].update(mode="system-ram"),
     "region[0].mode: 'system-ram' is not offered for a persistent region: it becomes a devdax namespace"),
    ("maxmem below memory", PMEM, lambda d: d["guest"].update(maxmem="512M"),
     "guest.maxmem: 512 MiB must not be below guest.memory (1 GiB)"),
]


@pytest.mark.parametrize("name,path,change,expected", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_pmem_mistake_is_one_clear_line(name, path, change, expected):
    with pytest.raises(TopologyError) as info:
        topology.from_dict(_mutate(path, change), source="t.toml")
    lines = str(info.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith("t.toml: ") and expected in lines[0], lines


def test_region_mixing_volatile_and_persistent_devices_is_refused():
    def add_volatile(d):
        d["root_port"].append({"id": "rp1", "host_bridge": "cxl.1", "port": 1, "chassis": 0, "slot": 3})
        d["device"].append({"id": "ram0", "port": "rp1", "volatile": "512M", "serial": 9})
        d["region"][0]["devices"] = ["pmem0", "ram0"]
    with pytest.raises(TopologyError) as info:
        topology.from_dict(_mutate(PMEM, add_volatile), source="t.toml")
    assert str(info.value) == ("t.toml: region[0].devices: mixes volatile and persistent devices: a region "
                               "is either RAM or pmem")


# ------------------------------------------------------------------------ no hotplug room

def test_guest_without_hotplug_room_gets_plain_memory_and_the_q35_base():
    topo = topology.load(PMEM)
    assert not topo.guest.hotplug_room
    argv = argv_of(topo)
    assert argv[argv.index("-m") + 1] == "1024M"
    # no DIMM area: the CXL host bridge registers start where RAM above 4 GiB ends (none here)
    assert address_map.cxl_base(topo) == 4 * GiB
    room = topology.from_dict(_mutate(PMEM, lambda d: d["guest"].update(maxmem="2G", slots=4)))
    assert room.guest.hotplug_room
    argv = argv_of(room)
    assert argv[argv.index("-m") + 1] == "1024M,maxmem=2048M,slots=4"


# ------------------------------------------------------------------------ guest plan, discovery, CDAT

def test_plan_creates_a_pmem_region_and_loads_the_nvdimm_modules():
    topo = topology.load(PMEM)
    needed = plan.modules_needed(topo)
    assert needed == list(plan.CXL_MODULES) + list(plan.PMEM_MODULES)
    [line] = [l for l in plan.render(topo, needed).splitlines() if l.startswith("region ")]
    assert line.split() == ["region", "decoder0.0", "pmem", "1", "256", str(512 * MiB), "devdax", "0x50460201"]
    # persistent devices without a region leave the nvdimm modules (and their label reads) out
    no_region = topology.from_dict({k: v for k, v in doc_of(PMEM).items() if k != "region"})
    assert plan.modules_needed(no_region) == list(plan.CXL_MODULES)


def test_discovery_checks_pmem_size_and_region_type():
    topo = topology.load(PMEM)
    region = address_map.region_placements(topo)[0]
    found = {"memdevs": [{"memdev": "mem0", "serial": 0x5046_0201, "pmem_size": 512 * MiB}],
             "regions": [{"region": "region0", "resource": region.base, "size": region.size, "type": "pmem",
                          "interleave_ways": 1, "interleave_granularity": 256, "decode_state": "commit",
                          "mappings": [{"position": 0, "memdev": "mem0"}]}]}
    checks = {(c.item, c.field): c for c in discovery.compare(topo, found)}
    assert checks[("memdev sn 0x50460201", "pmem size")].ok
    assert checks[("region0", "type")].predicted == "pmem" and checks[("region0", "type")].ok
    assert not [k for k in checks if k[0].startswith("dax")], "a namespace's DAX device is not predicted"
    found["regions"][0]["type"] = "ram"
    assert not {(c.item, c.field): c for c in discovery.compare(topo, found)}[("region0", "type")].ok


def test_persistent_device_cdat_flags_its_range_non_volatile():
    topo = topology.from_dict({**doc_of(PMEM), "profile": "pf"})
    data = generate.tables_for(topo).device_cdat["pmem0"]
    assert [(d["flags"], d["dpa_length"]) for d in cdat.decode_table(data).of("DSMAS")] == [(1 << 2, 512 * MiB)]
    ram = generate.tables_for(topology.load(topology.resolve("pf-nic"))).device_cdat["pfnic0"]
    assert [d["flags"] for d in cdat.decode_table(ram).of("DSMAS")] == [0]
