"""The structural rules of a topology: ids, buses, slots, ports, windows and regions.

Run after every entry has been read and typed (topology_reader); each broken rule is one line.
The limits below are the CXL 3.1 and QEMU ones the rules enforce.
"""

from __future__ import annotations

import re

from pfcxl.device.facts.cxl_spec import (CFMWS_GRANULE, MAX_GRANULARITY, MAX_WINDOW_TARGETS, MIN_GRANULARITY,
                                            RESTRICTION_MASK, VALID_WAYS)

from pfcxl.device.topology import limits as topology_limits
from pfcxl.device.topology.model import Device, Guest, HostBridge, Region, RootPort, Switch, Topology, Window, region_name
from pfcxl.device.topology.reader import Problems, Table
from pfcxl.device.topology.units import KiB, MiB, human

REGION_ALIGN = CFMWS_GRANULE                # HDM decoder and CFMWS size/base unit
REGION_MODES = ("devdax", "system-ram")
PMEM_REGION_MODES = ("devdax",)             # a pmem region is used through a devdax namespace
# Label storage area: at least 128 KiB, the label area QEMU gives an NVDIMM at the least; Linux
# reads all of it through the mailbox when the nvdimm probes, so larger areas boot slowly.
MIN_LSA = 128 * KiB
MAX_LSA = 256 * MiB                         # what QEMU's own CXL test machine gives each device
LSA_ALIGN = 4 * KiB                         # a memory backend is whole host pages
WINDOW_ARITHMETIC = ("modulo", "xor")
MAX_RESTRICTIONS = RESTRICTION_MASK          # CFMWS restriction bits 0-5 (CXL 3.1)
BACKEND_PREFIX = "backend-"                 # memory-backend ids: backend-<device id>
LSA_PREFIX = "lsa-backend-"                 # label storage area backends: lsa-backend-<device id>
DIRECT_PREFIX = "direct-"                   # the direct path's NVDIMM backends: direct-<device id>
_QEMU_ID = re.compile(r"[A-Za-z][A-Za-z0-9._-]*")    # fullmatch: `$` lets "x\n" through


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


# A region entry that read well: its index in the file, its table and its device ids.
RawRegion = tuple[int, Table, tuple[str, ...]]


def check(problems: Problems, bridges: list[HostBridge], root_ports: list[RootPort], switches: list[Switch],
          devices: list[Device], windows: list[Window], raw_regions: list[RawRegion]) -> list[Region]:
    """Check how the entries fit together; the regions that pass, once nothing else is wrong."""
    downstream = [p for s in switches for p in s.downstream]
    named = ([("host_bridge", b.id) for b in bridges] + [("root_port", p.id) for p in root_ports]
             + [("switch", s.id) for s in switches] + [("downstream port", p.id) for p in downstream]
             + [("device", d.id) for d in devices] + [("window", w.id) for w in windows])
    seen: dict[str, str] = {}
    for kind, ident in named:
        if ident.startswith(BACKEND_PREFIX):
            problems.add(f"{kind} '{ident}'", f"ids starting with '{BACKEND_PREFIX}' are reserved for "
                         "the memory backends pfcxl creates")
        if not _QEMU_ID.fullmatch(ident):
            problems.add(f"{kind} '{ident}'", "id must start with a letter and use only letters, "
                         "digits, '.', '-', '_' (QEMU's id rule)")
        if ident in seen:
            problems.add(f"{kind} '{ident}'", f"id collides with {seen[ident]} '{ident}'")
        seen.setdefault(ident, kind)

    if not bridges:
        problems.add("host_bridge", "at least one [[host_bridge]] is needed")
    bus_owner: dict[int, str] = {}
    for b in bridges:
        if not 1 <= b.bus_nr <= 255:
            problems.add(f"host_bridge '{b.id}'.bus_nr", f"{b.bus_nr} must be between 1 and 255")
        if b.bus_nr in bus_owner:
            problems.add(f"host_bridge '{b.id}'.bus_nr",
                         f"{b.bus_nr} collides with host_bridge '{bus_owner[b.bus_nr]}'")
        bus_owner.setdefault(b.bus_nr, b.id)

    # PCIe slots are named by (chassis, slot) across all root and downstream ports.
    slot_owner: dict[tuple[int, int], str] = {}
    for p in [*root_ports, *downstream]:
        kind = "root_port" if isinstance(p, RootPort) else "downstream port"
        if (p.chassis, p.slot) in slot_owner:
            problems.add(f"{kind} '{p.id}'", f"chassis {p.chassis} slot {p.slot} collides with "
                         f"'{slot_owner[(p.chassis, p.slot)]}'")
        slot_owner.setdefault((p.chassis, p.slot), p.id)
        if not 0 <= p.port <= 255:
            problems.add(f"{kind} '{p.id}'.port", f"{p.port} must be between 0 and 255")

    topology_limits.check_ports(problems, bridges, root_ports, switches, devices)

    bridge_ids = {b.id for b in bridges}
    port_numbers: dict[tuple[str, int], str] = {}
    for rp in root_ports:
        if rp.host_bridge not in bridge_ids:
            problems.add(f"root_port '{rp.id}'.host_bridge", f"'{rp.host_bridge}' is not a host_bridge id")
        key = (rp.host_bridge, rp.port)
        if key in port_numbers:
            problems.add(f"root_port '{rp.id}'.port", f"port {rp.port} is already used by root_port "
                         f"'{port_numbers[key]}' on host bridge '{rp.host_bridge}'")
        port_numbers.setdefault(key, rp.id)

    root_port_ids = {rp.id for rp in root_ports}
    occupied: dict[str, str] = {}   # port id -> what hangs below it
    for sw in switches:
        if sw.root_port not in root_port_ids:
            problems.add(f"switch '{sw.id}'.root_port", f"'{sw.root_port}' is not a root_port id")
        elif sw.root_port in occupied:
            problems.add(f"switch '{sw.id}'.root_port", f"root port '{sw.root_port}' already has "
                         f"{occupied[sw.root_port]} below it")
        occupied.setdefault(sw.root_port, f"switch '{sw.id}'")
        if not sw.downstream:
            problems.add(f"switch '{sw.id}'.downstream", "a switch needs at least one downstream port")
        numbers = [p.port for p in sw.downstream]
        for n in {n for n in numbers if numbers.count(n) > 1}:
            problems.add(f"switch '{sw.id}'.downstream", f"port number {n} is used twice")

    port_ids = root_port_ids | {p.id for p in downstream}
    serials: dict[int, str] = {}
    for d in devices:
        where = f"device '{d.id}'"
        if d.port not in port_ids:
            problems.add(f"{where}.port", f"'{d.port}' is not a root_port or switch downstream port id")
        elif d.port in occupied:
            problems.add(f"{where}.port", f"port '{d.port}' already has {occupied[d.port]} below it")
        occupied.setdefault(d.port, f"device '{d.id}'")
        if d.capacity <= 0 or d.capacity % REGION_ALIGN:
            problems.add(f"{where}.{d.kind}", f"{d.capacity} bytes is not a positive multiple of 256 MiB "
                         "(the CXL HDM decoder unit)")
        if d.kind == "persistent" and not MIN_LSA <= d.lsa <= MAX_LSA:
            problems.add(f"{where}.lsa", f"{d.lsa} bytes must be from {human(MIN_LSA)} (room for the "
                         f"label index and namespace labels) to {human(MAX_LSA)}")
        elif d.lsa % LSA_ALIGN:
            problems.add(f"{where}.lsa", f"{d.lsa} bytes is not a multiple of {human(LSA_ALIGN)}")
        if not 0 <= d.serial < 1 << 64:
            problems.add(f"{where}.serial", f"{d.serial} does not fit in 64 bits")
        if d.serial in serials:
            problems.add(f"{where}.serial", f"{d.serial} collides with device '{serials[d.serial]}'")
        serials.setdefault(d.serial, d.id)

    if not windows:
        problems.add("window", "at least one [[window]] (CXL fixed memory window) is needed")
    for w in windows:
        where = f"window '{w.id}'"
        if _check_granularity(problems, f"{where}.granularity", w.granularity) and w.ways in VALID_WAYS:
            topology_limits.check_window_granularity(problems, w)
        if len(w.targets) > MAX_WINDOW_TARGETS:
            problems.add(f"{where}.targets", f"{len(w.targets)} targets: a window has at most "
                         f"{MAX_WINDOW_TARGETS}")
        elif w.ways not in VALID_WAYS:
            problems.add(f"{where}.targets", f"{w.ways} targets means {w.ways}-way interleave; "
                         f"ways must be one of {', '.join(map(str, VALID_WAYS))}")
        for t in (w.targets if len(w.targets) <= MAX_WINDOW_TARGETS else ()):
            if t not in bridge_ids:
                problems.add(f"{where}.targets", f"'{t}' is not a host_bridge id")
        for t in sorted({t for t in w.targets if w.targets.count(t) > 1}):
            if len(w.targets) <= MAX_WINDOW_TARGETS:
                problems.add(f"{where}.targets", f"host bridge '{t}' is listed twice")
        if w.arithmetic not in WINDOW_ARITHMETIC:
            problems.add(f"{where}.arithmetic", f"'{w.arithmetic}' must be one of {', '.join(WINDOW_ARITHMETIC)}")
        if not 0 <= w.restrictions <= MAX_RESTRICTIONS:
            problems.add(f"{where}.restrictions", f"{w.restrictions:#x} sets bits outside the CFMWS "
                         f"restriction bits 0-5 (mask {MAX_RESTRICTIONS:#x})")
        if not 0 <= w.qtg_id <= 0xFFFF:
            problems.add(f"{where}.qtg_id", f"{w.qtg_id} does not fit in 16 bits")
        unit = REGION_ALIGN * max(w.ways, 1)
        if w.size <= 0 or w.size % unit:
            problems.add(f"{where}.size", f"{human(w.size) if w.size > 0 else w.size} is not a multiple "
                         f"of 256 MiB x {w.ways} ways ({human(unit)})")

    if problems.lines:
        return []
    # Topology without regions yet, to ask structural questions below.
    partial = Topology("", "", "", Guest(0, 0, 0, 0, ""), tuple(bridges), tuple(root_ports),
                       tuple(switches), tuple(devices), tuple(windows), ())
    return _check_regions(problems, partial, raw_regions)


def _check_granularity(problems: Problems, where: str, value: int) -> bool:
    if not (_is_pow2(value) and MIN_GRANULARITY <= value <= MAX_GRANULARITY):
        problems.add(where, f"{value} must be a power of two from 256 to 16K bytes")
        return False
    return True


def _check_regions(problems: Problems, topo: Topology, raw_regions: list[RawRegion]) -> list[Region]:
    device_ids = {d.id for d in topo.devices}
    window_ids = {w.id for w in topo.windows}
    used_by: dict[str, str] = {}
    window_use: dict[str, int] = {}
    regions = []
    for i, t, devs in raw_regions:
        where = f"region[{i}]"
        rid = region_name(i)
        ok = True
        if t["window"] not in window_ids:
            problems.add(f"{where}.window", f"'{t['window']}' is not a window id")
            continue
        window = topo.window(t["window"])
        if len(devs) not in VALID_WAYS:
            problems.add(f"{where}.devices", f"{len(devs)} devices means {len(devs)}-way interleave; "
                         f"ways must be one of {', '.join(map(str, VALID_WAYS))}")
            ok = False
        for d in devs:
            if d not in device_ids:
                problems.add(f"{where}.devices", f"'{d}' is not a device id")
                ok = False
            elif d in used_by:
                problems.add(f"{where}.devices", f"device '{d}' is already used by {used_by[d]}")
                ok = False
            used_by.setdefault(d, where)
        if not ok:
            continue
        # Linux checks each position against the window: position i must sit under the host
        # bridge the window routes granule i to (targets[i mod window ways]).
        if len(devs) % window.ways:
            problems.add(f"{where}.devices", f"{len(devs)} devices cannot spread evenly over the "
                         f"{window.ways} host bridges of window '{window.id}'")
            continue
        for pos, d in enumerate(devs):
            want = window.targets[pos % window.ways]
            have = topo.host_bridge_of(d)
            if have != want:
                problems.add(f"{where}.devices", f"position {pos} is device '{d}' under host bridge "
                             f"'{have}', but window '{window.id}' routes position {pos} to '{want}' "
                             f"(list devices in the window's target order)")
                ok = False
                break   # one misordered list is one mistake
        granularity = t["granularity"] if t["granularity"] is not None else window.granularity
        if _check_granularity(problems, f"{where}.granularity", granularity) and ok:
            topology_limits.check_region_decoders(problems, where, topo, window, devs, granularity)
        if window.ways > 1 and granularity != window.granularity:
            problems.add(f"{where}.granularity", f"{granularity} must equal window '{window.id}' "
                         f"granularity {window.granularity} when the window interleaves host bridges")
            ok = False
        kinds = {topo.device(d).kind for d in devs}
        if len(kinds) > 1:
            problems.add(f"{where}.devices", "mixes volatile and persistent devices: a region is "
                         "either RAM or pmem")
            continue
        kind = kinds.pop()
        smallest = min(topo.device(d).capacity for d in devs)
        size = t["size"] if t["size"] is not None else smallest * len(devs)
        unit = REGION_ALIGN * len(devs)
        if size <= 0 or size % unit:
            problems.add(f"{where}.size", f"{size} is not a multiple of 256 MiB x {len(devs)} ways "
                         f"({human(unit)})")
            ok = False
        elif size // len(devs) > smallest:
            problems.add(f"{where}.size", f"{human(size)} needs {human(size // len(devs))} from each "
                         f"device, more than the smallest device has ({human(smallest)})")
            ok = False
        window_use[window.id] = window_use.get(window.id, 0) + size
        if window_use[window.id] > window.size:
            problems.add(f"{where}.size", f"regions in window '{window.id}' need "
                         f"{human(window_use[window.id])}, more than the window's {human(window.size)}")
            ok = False
        if t["mode"] not in REGION_MODES:
            problems.add(f"{where}.mode", f"'{t['mode']}' must be one of {', '.join(REGION_MODES)}")
            ok = False
        elif kind == "persistent" and t["mode"] not in PMEM_REGION_MODES:
            problems.add(f"{where}.mode", f"'{t['mode']}' is not offered for a persistent region: it "
                         f"becomes a {', '.join(PMEM_REGION_MODES)} namespace")
            ok = False
        if ok:
            regions.append(Region(rid, window.id, devs, size, granularity, t["mode"], kind))
    return regions
