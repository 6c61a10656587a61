"""The one interleave decoder (device.address_map.interleave) against QEMU's rule, and the
topology-level locate() that rebuilds a region from the devices' backing files."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pfcxl.device.topology import address_map
from pfcxl.device.fabric import engine as fabric_engine
from pfcxl.device.appliance import pool
from pfcxl.device import topology
from pfcxl.device.topology.units import GiB, KiB, MiB
from pfcxl.errors import TopologyError

LAYOUTS = Path(__file__).parents[1] / "data" / "topologies"
WAYS = (1, 2, 3, 4, 6, 8, 12, 16)

pytestmark = pytest.mark.unit


def layout(name: str) -> topology.Topology:
    return topology.load(LAYOUTS / f"{name}.toml")


def qemu_target(hpa: int, granularity: int, ways: int) -> int:
    """hw/cxl/cxl-host.c: the window's target index comes from the absolute host address."""
    return (hpa // granularity) % ways


def qemu_dpa(hpa_offset: int, granularity: int, ways: int) -> int:
    """hw/mem/cxl_type3.c, written with bit fields as QEMU does: keep the low 8+IG bits; above
    them drop the IW way-select bits (power-of-two ways), or for 3/6/12 ways take the bits above
    IG+8+log2(ways/3) and divide by 3."""
    ig_bits = granularity.bit_length() - 1            # 8 + IG
    low = hpa_offset & (granularity - 1)
    if ways & (ways - 1) == 0:
        iw = ways.bit_length() - 1
        return low | ((hpa_offset >> (ig_bits + iw)) << ig_bits)
    iw = (ways // 3).bit_length() - 1
    return low | (((hpa_offset >> (ig_bits + iw)) // 3) << ig_bits)


@settings(max_examples=400, deadline=None)
@given(base_units=st.integers(0, 1 << 14), ways=st.sampled_from(WAYS), g_log=st.integers(8, 14),
       data=st.data())
def test_decoder_follows_qemu(base_units, ways, g_log, data):
    g = 1 << g_log
    base = base_units * 256 * MiB                     # CFMWS bases are 256 MiB aligned, any multiple
    offset = data.draw(st.integers(0, 4 * GiB - 1))
    hpa = base + offset
    assert address_map.interleave(hpa, g, ways, base) == (qemu_target(hpa, g, ways), qemu_dpa(offset, g, ways))


@settings(max_examples=50, deadline=None)
@given(base_units=st.integers(0, 1 << 14), ways=st.sampled_from(WAYS), g_log=st.integers(8, 14))
def test_decoder_on_arrays_equals_decoder_on_ints(base_units, ways, g_log):
    g, base = 1 << g_log, base_units * 256 * MiB
    hpa = base + np.arange(0, 64 * ways * g, 64, dtype=np.int64)
    target, offset = address_map.interleave(hpa, g, ways, base)
    assert [(int(t), int(o)) for t, o in zip(target, offset)] == \
        [address_map.interleave(int(a), g, ways, base) for a in hpa]


def test_three_way_window_starts_on_the_second_device():
    """Base 0x2_5000_0000 is not a multiple of 3 x 4 KiB, so granule 0 of the region is
    routed to target 1, and granule 1 to target 2."""
    topo = layout("three-hb-3way")
    region = topo.regions[0]
    assert address_map.region_placements(topo)[0].base == 0x2_5000_0000
    assert address_map.locate(topo, region, 0) == ("mem2", 0)
    assert address_map.locate(topo, region, 4 * KiB + 5) == ("mem3", 5)
    assert address_map.locate(topo, region, 2 * 4 * KiB) == ("mem1", 0)
    assert address_map.locate(topo, region, 3 * 4 * KiB) == ("mem2", 4 * KiB)


@pytest.mark.parametrize("name", sorted(p.stem for p in LAYOUTS.glob("*.toml")))
def test_every_region_byte_has_its_own_device_byte(name):
    """Across the first granules of every region, each (device, DPA) is hit once, only by the
    region's devices, and every device gets its share: no aliasing, whatever the levels."""
    topo = layout(name)
    for region in topo.regions:
        g, span = region.granularity, 4 * region.ways * 12
        seen = [address_map.locate(topo, region, k * g) for k in range(span)]
        assert len(set(seen)) == span
        assert {d for d, _ in seen} == set(region.devices)
        assert all(dpa % g == 0 and dpa < span // region.ways * g for _, dpa in seen)


def test_six_way_over_three_bridges_routes_both_levels_by_address():
    """Root 3-way at 4 KiB picks the host bridge; each bridge's decoder (Linux: granularity 4 KiB
    x 1, the 3 counting as 1) picks its root port from the same granule number, mod 2."""
    topo = layout("six-way-three-hb")
    region = topo.regions[0]
    base = address_map.region_placements(topo)[0].base
    g = region.granularity
    for k in range(24):
        device, _ = address_map.locate(topo, region, k * g)
        granule = base // g + k
        hb = topo.window(region.window).targets[granule % 3]
        ports = [rp.id for rp in topo.root_ports if rp.host_bridge == hb]
        assert topo.device(device).port == ports[granule % 2]


def test_switch_decoder_uses_the_region_granularity():
    topo = topology.load(topology.resolve("electrical-switch"))
    region = topo.regions[0]
    g = region.granularity
    assert [address_map.locate(topo, region, k * g)[0] for k in range(8)] == list(region.devices) * 2


def test_pool_and_fabric_model_use_the_decoder():
    """The appliance interleaves its modules over pool offsets; the fabric model maps a window
    address to the pool offset it holds. Both give what the decoder gives."""
    a = topology.load(topology.resolve("pf-appliance")).appliance
    base = 0x4_0000_0000
    offsets = np.arange(0, 3 * a.modules * a.granularity, 192, dtype=np.int64)
    module, moff = fabric_engine.locate(np.asarray(base + offsets, np.uint64), base, a.granularity, a.modules)
    for o, m, mo in zip(offsets.tolist(), module.tolist(), moff.tolist()):
        want = address_map.interleave(o, a.granularity, a.modules)
        assert (m, mo) == want
        assert (pool.where(a, o)["module"], pool.where(a, o)["module_offset"]) == want


def test_xor_windows_are_refused_not_decoded_as_modulo():
    """QEMU 10 routes every window modulo; an XOR window's bytes would be placed by the CXIMS
    maps, which locate() does not model, so it refuses instead of answering wrongly."""
    topo = topology.load(topology.resolve("two-hb-interleave"))
    xor = dataclasses.replace(topo, windows=(dataclasses.replace(topo.windows[0], arithmetic="xor"),))
    with pytest.raises(TopologyError, match="window 'fmw0' uses xor arithmetic"):
        address_map.locate(xor, xor.regions[0], 0)
