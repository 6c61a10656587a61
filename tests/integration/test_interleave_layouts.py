"""Every interleave layout kept in tests/data/topologies boots (3-, 6-, 12- and 16-way, 8-way
behind a switch, two windows, two regions in one window). In one boot per layout the guest fills
every region with a seeded pattern, Linux's host bridge and switch decoders are compared with
address_map.region_decoders(), and the host rebuilds each region byte for byte from the device
backing files through address_map.locate(), the decoder that follows QEMU's routing."""

from pathlib import Path

import pytest

from pfcxl.device.topology import address_map
from pfcxl.device import topology
from pfcxl.device.topology.units import MiB
from pfcxl.guest import pattern
from pfcxl.host_tools.vm import qemu

from .conftest import daxio, read_region_from_backing

pytestmark = pytest.mark.integration

LAYOUTS = Path(__file__).parents[1] / "data" / "topologies"
SIZE = 4 * MiB
# Every switch-type decoder (host bridge, switch) with a region: its name, granularity and ways.
# Shell builtins only (read, ${d##*/}): under TCG each fork and exec of cat costs QEMU tens of ms.
DECODERS = ("for d in /sys/bus/cxl/devices/decoder*; do if [ -e $d/target_list ] && [ -e $d/region ]; then "
            "read -r r < $d/region; read -r g < $d/interleave_granularity; read -r w < $d/interleave_ways; "
            "echo \"${d##*/} $r $g $w\"; fi; done")


def ram_layouts() -> list[str]:
    """The kept layouts with RAM regions (pmem and QEMU's qtest machine have tests of their own:
    a devdax namespace's data does not start at the region's byte 0)."""
    names = []
    for path in sorted(LAYOUTS.glob("*.toml")):
        topo = topology.load(path)
        if topo.regions and all(d.kind == "volatile" for d in topo.devices):
            names.append(path.stem)
    return names


@pytest.mark.parametrize("name", ram_layouts())
def test_layout_boots_and_the_host_rebuilds_every_region(boot, tmp_path, name):
    topo = topology.load(LAYOUTS / f"{name}.toml")
    run_dir = tmp_path / "run"
    vm = boot(topo, run_dir=run_dir)
    dax = [p.name for p in address_map.dax_placements(topo)]
    assert [r["dax"] for r in vm.ready["regions"]] == dax

    seeds = {}
    for n, (region, device) in enumerate(zip(topo.regions, dax)):
        seeds[region.id] = 40 + n
        wrote = daxio(vm, f"fill /dev/{device} --size {SIZE} --seed {seeds[region.id]}")
        assert wrote["status"] == 0 and wrote["size"] == SIZE, wrote

    # Linux's decoders for each region, as (granularity, ways), against the prediction.
    programmed: dict[str, list[tuple[int, int]]] = {}
    for line in vm.check(DECODERS).splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[1].startswith("region"):
            programmed.setdefault(parts[1], []).append((int(parts[2]), int(parts[3])))
    for n, region in enumerate(topo.regions):
        want = sorted((d.granularity, len(d.targets)) for d in address_map.region_decoders(topo, region).values())
        assert sorted(programmed.get(f"region{n}", [])) == want, (region.id, programmed)

    backing = qemu.backing_paths(topo, run_dir)
    for region in topo.regions:
        expected = pattern.pattern_bytes(seeds[region.id], 0, SIZE)
        on_host = read_region_from_backing(topo, region, backing, SIZE)
        if on_host != expected:
            bad = next(i for i in range(0, SIZE, 8) if on_host[i:i + 8] != expected[i:i + 8])
            pytest.fail(f"{name} {region.id}: backing files differ from the guest's pattern first at region "
                        f"offset {bad:#x} (granule {bad // region.granularity}, read from "
                        f"{address_map.locate(topo, region, bad)})")
