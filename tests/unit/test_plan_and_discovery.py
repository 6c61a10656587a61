"""The guest plan a topology renders, and the comparison of what a guest found with the prediction."""

import copy
import tomllib

import pytest

from pfcxl.device.topology import address_map
from pfcxl.device import topology
from pfcxl.device.topology.units import MiB
from pfcxl.guest import plan
from pfcxl.host_tools.vm import discovery

pytestmark = pytest.mark.unit


def shipped_doc(name: str) -> dict:
    return tomllib.loads(topology.resolve(name).read_text())


def load(name: str) -> topology.Topology:
    return topology.load(topology.resolve(name))


def with_region(name: str, **changes) -> topology.Topology:
    doc = copy.deepcopy(shipped_doc(name))
    doc["region"][0].update(changes)
    return topology.from_dict(doc, source=f"{name}-changed.toml")


# --------------------------------------------------------------------------- plan


MODULES = ["cxl_acpi", "cxl_pci", "cxl_mem", "dax_cxl", "device_dax"]


def plan_lines(topo: topology.Topology, modules=MODULES) -> list[list[str]]:
    text = plan.render(topo, modules)
    assert text.endswith("\n")
    lines = text.splitlines()
    assert lines[0] == f"# pfcxl plan for topology {topo.name}"
    return [line.split() for line in lines[1:]]


def test_plan_sections_in_order():
    topo = load("electrical-switch")
    kinds = [words[0] for words in plan_lines(topo)]
    assert kinds == ["module"] * len(MODULES) + ["device"] * len(topo.devices) + ["region"] * len(topo.regions)
    assert [w[1] for w in plan_lines(topo) if w[0] == "module"] == MODULES


def test_plan_devices_are_hex_serials():
    topo = load("electrical-switch")
    devices = [w for w in plan_lines(topo) if w[0] == "device"]
    assert [w[1] for w in devices] == [hex(d.serial) for d in topo.devices]
    assert [int(w[1], 16) for w in devices] == [d.serial for d in topo.devices]
    assert all(len(w) == 2 for w in devices)


def test_plan_region_line():
    topo = load("electrical-switch")
    [region] = topo.regions
    [words] = [w for w in plan_lines(topo) if w[0] == "region"]
    decoder = address_map.window_placements(topo)[0].name
    assert decoder == "decoder0.0"
    assert words[1:7] == [decoder, "ram", str(region.ways), str(region.granularity), str(region.size),
                          region.mode]
    assert [int(s, 16) for s in words[7:]] == [topo.device(d).serial for d in region.devices]
    assert len(words[7:]) == region.ways == 4


def test_plan_region_serials_follow_region_order_not_device_order():
    topo = with_region("electrical-switch", devices=["mem2", "mem0", "mem3", "mem1"])
    [words] = [w for w in plan_lines(topo) if w[0] == "region"]
    assert [int(s, 16) for s in words[7:]] == [topo.device(d).serial for d in ("mem2", "mem0", "mem3", "mem1")]
    devices = [int(w[1], 16) for w in plan_lines(topo) if w[0] == "device"]
    assert devices == [d.serial for d in topo.devices]


def test_plan_region_names_its_own_window():
    doc = copy.deepcopy(shipped_doc("two-hb-interleave"))
    doc["window"].insert(0, {"id": "first", "size": "1G", "targets": ["cxl.1"], "granularity": "256"})
    topo = topology.from_dict(doc)
    [words] = [w for w in plan_lines(topo) if w[0] == "region"]
    assert words[1] == "decoder0.1"


def test_kmem_only_for_system_ram():
    devdax = load("electrical-switch")
    assert plan.KMEM_MODULE not in plan.modules_needed(devdax)
    assert plan.modules_needed(devdax) == list(plan.CXL_MODULES)
    ram = with_region("electrical-switch", mode="system-ram")
    needed = plan.modules_needed(ram)
    assert needed == list(plan.CXL_MODULES) + [plan.KMEM_MODULE]
    lines = plan_lines(ram, needed)
    assert ["module", "kmem"] in lines
    [words] = [w for w in lines if w[0] == "region"]
    assert words[6] == "system-ram"
    assert ["module", "kmem"] not in plan_lines(devdax, plan.modules_needed(devdax))


# --------------------------------------------------------------------------- discovery


def predicted_found(topo: topology.Topology) -> dict:
    """What a guest that matches every prediction would report, shaped like pfcxl-discover's JSON."""
    memdev = {d.id: f"mem{i}" for i, d in enumerate(topo.devices)}
    hb_of_rp = {rp.id: rp.host_bridge for rp in topo.root_ports}
    hb_ports = []
    for k, hb in enumerate(topo.host_bridges):
        port = {"port": f"port{k + 1}", "host": hb.id, "depth": 1}
        switches = [{"port": f"port{10 + j}", "host": sw.id, "depth": 2}
                    for j, sw in enumerate(topo.switches) if hb_of_rp[sw.root_port] == hb.id]
        if switches:
            port[f"ports:{port['port']}"] = switches
        hb_ports.append(port)
    windows = address_map.window_placements(topo)
    return {
        "root_decoders": [{"decoder": p.name, "resource": p.base, "size": p.size, "interleave_ways": p.ways}
                          for p in windows],
        "ports": [{"port": "root0", "depth": 0, "ports:root0": hb_ports}],
        "memdevs": [{"memdev": memdev[d.id], "serial": d.serial, "ram_size": d.volatile} for d in topo.devices],
        "regions": [{"region": p.name, "resource": p.base, "size": p.size, "interleave_ways": p.ways,
                     "interleave_granularity": p.granularity, "type": "ram", "decode_state": "commit",
                     "mappings": [{"position": i, "memdev": memdev[d]} for i, d in enumerate(r.devices)]}
                    for p, r in zip(address_map.region_placements(topo), topo.regions)],
        "dax": [{"chardev": p.name, "size": p.size, "mode": r.mode}
                for p, r in zip(address_map.dax_placements(topo), topo.regions)],
        # sysfs prints hex strings for addresses and plain numbers for ways and granularity
        "sysfs_root_decoders": [{"decoder": p.name, "start": hex(p.base), "size": hex(p.size),
                                 "interleave_ways": p.ways, "interleave_granularity": p.granularity,
                                 "target_list": ",".join(str(i) for i in range(p.ways))}
                                for p in windows],
    }


def failures(topo, found) -> set[tuple[str, str]]:
    return {(c.item, c.field) for c in discovery.compare(topo, found) if not c.ok}


@pytest.mark.parametrize("name", [p.stem for p in topology.shipped_topologies()])
def test_matching_guest_passes_every_check(name):
    topo = load(name)
    checks = discovery.compare(topo, predicted_found(topo))
    assert [c for c in checks if not c.ok] == []
    items = {c.item for c in checks}
    assert {"CXL ports", "decoder0.0", "region0", "dax0.0"} <= items
    assert {f"memdev sn {d.serial:#x}" for d in topo.devices} <= items
    positions = [c for c in checks if c.item == "region0" and c.field.startswith("position")]
    assert len(positions) == topo.regions[0].ways


def test_empty_guest_fails_every_check():
    topo = load("electrical-switch")
    checks = discovery.compare(topo, {})
    assert checks and all(not c.ok for c in checks)


def test_hex_string_serials_still_match():
    topo = load("two-hb-interleave")
    found = predicted_found(topo)
    for m in found["memdevs"]:
        m["serial"] = hex(m["serial"])
    assert failures(topo, found) == set()


def _device_at(topo, position: int):
    return topo.device(topo.regions[0].devices[position])


def _set_position(found, position: int, name: str) -> None:
    found["regions"][0]["mappings"][position]["memdev"] = name


def _drop_memdev(found, serial: int) -> None:
    found["memdevs"] = [m for m in found["memdevs"] if m["serial"] != serial]


def _drop_switch_ports(found) -> None:
    for hb in found["ports"][0]["ports:root0"]:
        for key in [k for k in hb if k.startswith("ports:")]:
            del hb[key]


SW = load("electrical-switch")
# (what changes, mutation of the found dict, the exact set of checks that must fail)
PERTURBATIONS = [
    ("region base", lambda f: f["regions"][0].update(resource=f["regions"][0]["resource"] + 256 * MiB),
     {("region0", "base")}),
    ("region size", lambda f: f["regions"][0].update(size=f["regions"][0]["size"] // 2), {("region0", "size")}),
    ("region not committed", lambda f: f["regions"][0].update(decode_state="reset"),
     {("region0", "decode state")}),
    ("dax mode", lambda f: f["dax"][0].update(mode="system-ram"), {("dax0.0", "mode")}),
    ("position mapping", lambda f: _set_position(f, 0, "mem1"), {("region0", "position 0")}),
    ("positions swapped", lambda f: (_set_position(f, 1, "mem2"), _set_position(f, 2, "mem1")),
     {("region0", "position 1"), ("region0", "position 2")}),
    ("root decoder granularity in sysfs",
     lambda f: f["sysfs_root_decoders"][0].update(interleave_granularity=512),
     {("decoder0.0", "granularity (sysfs)")}),
    ("root decoder start in sysfs",
     lambda f: f["sysfs_root_decoders"][0].update(start=hex(int(f["sysfs_root_decoders"][0]["start"], 16) + MiB)),
     {("decoder0.0", "base (sysfs)")}),
    ("root decoder ways", lambda f: f["root_decoders"][0].update(interleave_ways=2),
     {("decoder0.0", "interleave ways")}),
    ("memdev size", lambda f: f["memdevs"][3].update(ram_size=f["memdevs"][3]["ram_size"] * 2),
     {(f"memdev sn {SW.devices[3].serial:#x}", "ram size")}),
    # a missing memdev also leaves its region position unaccounted for
    ("missing memdev", lambda f: _drop_memdev(f, _device_at(SW, 2).serial),
     {(f"memdev sn {_device_at(SW, 2).serial:#x}", "ram size"), ("region0", "position 2")}),
    ("missing switch port", _drop_switch_ports, {("CXL ports", "switches (depth 2)")}),
]


@pytest.mark.parametrize("what,mutate,expected", PERTURBATIONS, ids=[p[0] for p in PERTURBATIONS])
def test_each_perturbation_fails_exactly_its_check(what, mutate, expected):
    found = predicted_found(SW)
    assert failures(SW, found) == set()
    mutate(found)
    assert failures(SW, found) == expected


def test_flatten_ports():
    ports = [
        {"port": "root0", "depth": 0, "ports:root0": [
            {"port": "port1", "depth": 1, "ports:port1": [
                {"port": "port2", "depth": 2, "ports:port2": [{"port": "port4", "depth": 3}]},
                {"port": "port3", "depth": 2},
            ]},
            {"port": "port5", "depth": 1, "ports:port5": "not a list"},
        ]},
        "not a port",
        {"port": "root1", "depth": 0, "endpoints:root1": [{"endpoint": "endpoint9", "depth": 1}]},
    ]
    flat = discovery.flatten_ports(ports)
    assert [p["port"] for p in flat] == ["root0", "port1", "port2", "port4", "port3", "port5", "root1"]
    assert discovery.flatten_ports([]) == []


def test_one_way_root_decoder_reports_the_minimum_granularity():
    # Linux sets a 1-way root decoder's granularity to 256 B whatever the CFMWS HBIG says (so any
    # region granularity fits under it); seen booting QEMU's qtest machine, whose 1-way fmw0 is 8 KiB.
    doc = copy.deepcopy(shipped_doc("two-hb-interleave"))
    doc["window"].append({"id": "solo", "size": "1G", "targets": ["cxl.1"], "granularity": "8K"})
    topo = topology.from_dict(doc)
    found = predicted_found(topo)
    solo = found["sysfs_root_decoders"][1]
    assert solo["interleave_granularity"] == 8192
    solo["interleave_granularity"] = 256
    assert failures(topo, found) == set()
    # a 2-way window keeps its own granularity: 256 there is a real mismatch
    found["sysfs_root_decoders"][0]["interleave_granularity"] = 256
    assert failures(topo, found) == {("decoder0.0", "granularity (sysfs)")}
