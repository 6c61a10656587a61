"""Predicted host physical address map of a topology under QEMU 10 q35, and interleave decode.

The rules are QEMU's and Linux's, read from their sources and checked on booted guests
(shared/PLATFORM.md, "Where QEMU 10.0.2 puts things"); integration tests compare every
prediction here against what the guest reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from .topology import Region, Topology, Window
from .units import GiB, MiB

CHBS_LENGTH = 0x10000          # QEMU's component register block per host bridge
LOWMEM_SPLIT = 0x8000_0000     # q35: RAM above this goes above 4 GiB when RAM >= 0xB000_0000
LOWMEM_LIMIT = 0xB000_0000
FOUR_GIB = 4 * GiB
WINDOW_ALIGN = 256 * MiB


def _round_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align


def cxl_base(topo: Topology) -> int:
    """Where q35 starts the CXL host bridge registers and windows (after RAM and hotplug space)."""
    ram = topo.guest.memory
    lowmem = LOWMEM_SPLIT if ram >= LOWMEM_LIMIT else LOWMEM_LIMIT
    above = max(ram - lowmem, 0)
    above_end = FOUR_GIB + above
    if topo.guest.maxmem > ram:
        return _round_up(above_end, GiB) + (topo.guest.maxmem - ram) + topo.guest.slots * GiB
    return above_end


@dataclass(frozen=True)
class Placement:
    """One named address range with its interleave."""

    name: str          # Linux's name: decoder0.N, regionN, daxN.0
    what: str          # window / region / dax id in the topology
    base: int
    size: int
    ways: int
    granularity: int


def chbs_bases(topo: Topology) -> dict[str, int]:
    """Host bridge id -> CHBS register base. QEMU hands them out from the top, in creation order."""
    base, n = cxl_base(topo), len(topo.host_bridges)
    return {hb.id: base + (n - 1 - k) * CHBS_LENGTH for k, hb in enumerate(topo.host_bridges)}


def window_placements(topo: Topology) -> list[Placement]:
    """One root decoder per window, in CFMWS order, packed from just above the CHBS area."""
    base = _round_up(cxl_base(topo) + MiB, WINDOW_ALIGN)
    out = []
    for i, w in enumerate(topo.windows):
        out.append(Placement(f"decoder0.{i}", w.id, base, w.size, w.ways, w.granularity))
        base += w.size
    return out


def region_placements(topo: Topology) -> list[Placement]:
    """Regions in creation order; Linux allocates each from the lowest free address of its window."""
    next_free = {p.what: p.base for p in window_placements(topo)}
    out = []
    for n, r in enumerate(topo.regions):
        out.append(Placement(f"region{n}", r.id, next_free[r.window], r.size, r.ways, r.granularity))
        next_free[r.window] += r.size
    return out


def dax_placements(topo: Topology) -> list[Placement]:
    """A CXL RAM region gets one DAX device covering all of it, named after the region."""
    return [Placement(f"dax{n}.0", p.what, p.base, p.size, p.ways, p.granularity)
            for n, p in enumerate(region_placements(topo))]


def locate(topo: Topology, region: Region, offset: int) -> tuple[str, int]:
    """Region offset -> (device id, device physical address).

    Granule g of the region goes to interleave position g mod ways; inside that device the
    interleave bits are squeezed out (CXL 3.1 HDM decode), so DPA = (g div ways) x gran + rest.
    Regions use devices from DPA 0 (one region per device, the volatile partition first).
    """
    if not 0 <= offset < region.size:
        raise ValueError(f"offset {offset:#x} is outside {region.id} (size {region.size:#x})")
    granule, rest = divmod(offset, region.granularity)
    position = granule % region.ways
    dpa = (granule // region.ways) * region.granularity + rest
    return region.devices[position], dpa


def window_of(topo: Topology, region: Region) -> Window:
    return topo.window(region.window)
