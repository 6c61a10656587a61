"""Persistent memory: a pmem region made with cxl create-region -t pmem, used through a devdax
namespace, whose data and labels live in the run directory and survive a reboot; and guests
without memory hotplug room."""

import json
import tomllib
from pathlib import Path

import pytest

from pfcxl.device import topology
from pfcxl.device.topology.units import MiB
from pfcxl.guest import pattern
from pfcxl.host_tools.vm import discovery
from pfcxl.host_tools.vm import qemu

from .conftest import daxio, load

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parent.parent / "data"
PMEM = DATA / "topologies" / "pmem.toml"
SIZE = 8 * MiB


def namespaces(vm) -> list[dict]:
    return json.loads(vm.check("ndctl list -N"))


def mismatches(topo, found) -> list:
    return [c for c in discovery.compare(topo, found) if not c.ok]


def test_pmem_region_namespace_and_data_survive_a_reboot(boot, tmp_path):
    topo = load(str(PMEM))
    run_dir = tmp_path / "run"

    first = boot(topo, run_dir=run_dir, vm_name="first")
    [ready] = first.ready["regions"]
    assert (ready["region"], ready["type"], ready["mode"]) == ("region0", "pmem", "devdax")
    dax = ready["dax"]
    assert mismatches(topo, discovery.discover(first)) == []
    [ns] = namespaces(first)
    assert (ns["mode"], ns["chardev"]) == ("devdax", dax)
    # The namespace's data starts after its info block: where, in the region, is byte 0 of daxN.M?
    start = int(first.check(f"cat /sys/bus/dax/devices/{dax}/resource"), 16)
    region_start = int(first.check("cat /sys/bus/cxl/devices/region0/resource"), 16)
    offset = start - region_start
    assert 0 < offset < topo.regions[0].size - SIZE
    wrote = daxio(first, f"fill /dev/{dax} --size {SIZE} --seed 44")
    assert wrote["status"] == 0
    first.close()

    # One device, one way: region offset o is byte o of the device's backing file.
    expected = pattern.pattern_bytes(44, 0, SIZE)
    with open(qemu.backing_paths(topo, run_dir)["pmem0"], "rb") as f:
        f.seek(offset)
        assert f.read(SIZE) == expected, "the backing file does not hold what the guest wrote"
    assert (run_dir / "pmem0.lsa").read_bytes().strip(b"\0"), "no namespace labels in the label area"

    # The second boot re-creates the region; the namespace comes back from its labels, not anew.
    second = boot(topo, run_dir=run_dir, vm_name="second")
    [again] = namespaces(second)
    assert (again["uuid"], again["chardev"], again["size"]) == (ns["uuid"], dax, ns["size"])
    check = daxio(second, f"verify /dev/{dax} --size {SIZE} --seed 44")
    assert check["status"] == 0 and check["mismatches"] == 0, check


def _without_hotplug_room() -> topology.Topology:
    doc = tomllib.loads(topology.resolve("pf-nic").read_text())
    doc["guest"] = {"memory": "1G", "maxmem": "1G"}
    return topology.from_dict(doc)


@pytest.mark.pfcxl(topology=_without_hotplug_room())
def test_ram_region_without_memory_hotplug_room(pfcxl_machine):
    # An early note once said region setup needs maxmem above memory; it does not (devdax,
    # system-ram and pmem regions all come up without it).
    topo, vm = pfcxl_machine.topology, pfcxl_machine
    assert not topo.guest.hotplug_room
    assert mismatches(topo, discovery.discover(vm)) == []
    wrote = daxio(vm, "fill /dev/dax0.0 --size 4M --seed 9")
    check = daxio(vm, "verify /dev/dax0.0 --size 4M --seed 9")
    assert wrote["status"] == check["status"] == 0 and check["crc32"] == wrote["crc32"]
