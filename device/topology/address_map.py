"""Predicted host physical address map of a topology under QEMU 10 q35, and interleave decode.

The rules are QEMU's and Linux's, read from their sources and checked on booted guests
(docs/notes/qemu-10-facts.md, "Where QEMU 10.0.2 puts things"); integration tests compare every
prediction here against what the guest reports.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pfcxl.errors import TopologyError

from pfcxl.device.facts.cxl_spec import CFMWS_GRANULE as WINDOW_ALIGN

from pfcxl.device.facts.qemu import (CHBS_LENGTH, CXL_BASE_ALIGN, FOUR_GIB, HOTPLUG_SLOT_SIZE, LOWMEM_LIMIT, LOWMEM_SPLIT,
                         WINDOW_GAP)
from pfcxl.device.topology.model import Region, Topology, Window, dax_name, region_name


def _round_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align


def _above_4g_end(topo: Topology) -> int:
    ram = topo.guest.memory
    lowmem = LOWMEM_SPLIT if ram >= LOWMEM_LIMIT else LOWMEM_LIMIT
    return FOUR_GIB + max(ram - lowmem, 0)


def device_memory_base(topo: Topology) -> int:
    """Where q35's DIMM hotplug area starts (hw/i386/pc.c: RAM above 4 GiB, rounded up to 1 GiB)."""
    return _round_up(_above_4g_end(topo), CXL_BASE_ALIGN)


def cxl_base(topo: Topology) -> int:
    """Where q35 starts the CXL host bridge registers and windows (after RAM and hotplug space)."""
    if topo.guest.hotplug_room:
        return device_memory_base(topo) + (topo.guest.maxmem - topo.guest.memory) + topo.guest.slots * HOTPLUG_SLOT_SIZE
    return _above_4g_end(topo)


def direct_placements(topo: Topology) -> list[Placement]:
    """The direct path's NVDIMMs, one per device in device order (name: the device id). QEMU
    plugs each at the lowest free address of the hotplug area, aligned to its backend's page
    size; every device is a whole number of 256 MiB, so they follow each other without gaps."""
    base, out = device_memory_base(topo), []
    for d in topo.devices:
        out.append(Placement(d.id, d.id, base, d.capacity, 1, d.capacity))
        base += d.capacity
    return out


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
    base = _round_up(cxl_base(topo) + WINDOW_GAP, WINDOW_ALIGN)
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
        out.append(Placement(region_name(n), r.id, next_free[r.window], r.size, r.ways, r.granularity))
        next_free[r.window] += r.size
    return out


def dax_placements(topo: Topology) -> list[Placement]:
    """A CXL RAM region gets one DAX device covering all of it, named after the region."""
    return [Placement(dax_name(n), p.what, p.base, p.size, p.ways, p.granularity)
            for n, p in enumerate(region_placements(topo))]


def interleave(address, granularity: int, ways: int, base: int = 0):
    """The interleave decoder: (target index, offset inside that target) of `address`.

    QEMU's rule for a window and for every HDM decoder below it (hw/cxl/cxl-host.c): the target
    is (address / granularity) mod ways, counted on the absolute address, not from `base`. A
    target keeps the decoder's range [base, ...) with the way-select bits squeezed out
    (hw/mem/cxl_type3.c, CXL 3.1 HDM decode, 3/6/12 ways included):
    o = address - base  ->  (o / (granularity x ways)) x granularity + o mod granularity.
    Takes ints or numpy integer arrays.
    """
    offset = address - base
    return (address // granularity) % ways, offset // (granularity * ways) * granularity + offset % granularity


@dataclass(frozen=True)
class Decoder:
    """The HDM decoder Linux programs in a host bridge or switch for one region."""

    granularity: int
    targets: tuple[str, ...]       # what each target index leads to: a switch id or a device id


def region_decoders(topo: Topology, region: Region) -> dict[str, Decoder]:
    """Host bridge / switch id -> its decoder for `region`, as Linux 6.12 sets them up
    (cxl_port_setup_targets): targets in the order region positions first reach them; the
    granularity is the parent's granularity x the parent's ways, starting from the region's
    granularity x the window's ways with a factor 3 counted as 1 (3/6/12 ways route modulo)."""
    reach: dict[str, list[str]] = {}
    parent: dict[str, str] = {}
    for device in region.devices:
        port = topo.device(device).port
        hb = topo.host_bridge_of(device)
        switch = next((s for s in topo.switches if any(p.id == port for p in s.downstream)), None)
        hops = [(hb, device)]
        if switch is not None:
            hops = [(hb, switch.id), (switch.id, device)]
            parent[switch.id] = hb
        for node, child in hops:
            if child not in reach.setdefault(node, []):
                reach[node].append(child)
    window = topo.window(region.window)
    root_ways = window.ways // 3 if window.ways % 3 == 0 else window.ways
    out: dict[str, Decoder] = {}
    for node in sorted(reach, key=lambda n: n in parent):      # host bridges before switches
        if node in parent:
            up = out[parent[node]]
            granularity = up.granularity * len(up.targets)
        else:
            granularity = region.granularity * root_ways
        out[node] = Decoder(granularity, tuple(reach[node]))
    return out


def locate(topo: Topology, region: Region, offset: int) -> tuple[str, int]:
    """Region offset -> (device id, device physical address), the way QEMU routes the byte.

    The window picks a host bridge from the absolute address, each host bridge and switch
    decoder picks the next hop from it too, and the device squeezes the region's interleave out
    of the offset from the region's base. Regions use devices from DPA 0 (one region per device).
    """
    if not 0 <= offset < region.size:
        raise ValueError(f"offset {offset:#x} is outside {region.id} (size {region.size:#x})")
    window = topo.window(region.window)
    if window.arithmetic != "modulo":
        raise TopologyError(f"window '{window.id}' uses {window.arithmetic} arithmetic: its bytes follow the "
                            "CXIMS maps, and locate() decodes modulo windows only (all QEMU 10 can boot)")
    base, decoders = _route(topo, region)
    hpa = base + offset
    node = window.targets[interleave(hpa, window.granularity, window.ways)[0]]
    while node in decoders:
        d = decoders[node]
        node = d.targets[interleave(hpa, d.granularity, len(d.targets))[0]]
    return node, interleave(hpa, region.granularity, region.ways, base)[1]


@functools.lru_cache(maxsize=64)
def _route(topo: Topology, region: Region) -> tuple[int, dict[str, Decoder]]:
    base = next(p.base for p in region_placements(topo) if p.what == region.id)
    return base, region_decoders(topo, region)


def window_of(topo: Topology, region: Region) -> Window:
    return topo.window(region.window)
