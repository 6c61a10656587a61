"""The topology: the one object that flows through pfcxl (see DESIGN.md).

A TOML file is read once into an immutable, validated `Topology`. Every mistake found is
reported, one line each, naming the field and the rule; nothing downstream re-checks.

File shape (see device/topologies/*.toml for complete examples):

    name = "pf-nic"                      # optional, defaults to the file's stem
    description = "..."
    timing = "pf"                        # optional: CDAT/HMAT timing profile (fabric_constants)
    [guest]       memory, maxmem, slots, cpus, cmdline
    [[host_bridge]]  id, bus_nr
    [[root_port]]    id, host_bridge, port, chassis, slot
    [[switch]]       id, root_port, downstream = [{id, port, chassis, slot}, ...]
    [[device]]       id, port (a root or downstream port), volatile, serial
    [[window]]       id, size, targets = [host bridge ids], granularity, arithmetic, restrictions, qtg_id
    [[region]]       window, devices = [device ids in interleave order], size, granularity, mode
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pfcxl.errors import TopologyError

from . import fabric_constants
from .units import GiB, MiB, KiB, human, parse_size

TOPOLOGY_DIR = Path(__file__).parent / "topologies"
DEFAULT_TOPOLOGY = "pf-nic"

VALID_WAYS = (1, 2, 3, 4, 6, 8, 12, 16)    # CXL 3.1 HDM decoder / CFMWS ENIW encodings
MIN_GRANULARITY = 256                       # CFMWS HBIG 0 .. 6
MAX_GRANULARITY = 16 * KiB
MAX_WINDOW_TARGETS = 16
REGION_ALIGN = 256 * MiB                    # HDM decoder and CFMWS size/base unit
REGION_MODES = ("devdax", "system-ram")
WINDOW_ARITHMETIC = ("modulo", "xor")
MAX_RESTRICTIONS = 0x3F                     # CFMWS restriction bits 0-5 (CXL 3.1)
BACKEND_PREFIX = "backend-"                 # memory-backend ids: backend-<device id>
_QEMU_ID = re.compile(r"^[A-Za-z][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Guest:
    memory: int
    maxmem: int
    slots: int
    cpus: int
    cmdline: str


@dataclass(frozen=True)
class HostBridge:
    id: str
    bus_nr: int


@dataclass(frozen=True)
class RootPort:
    id: str
    host_bridge: str
    port: int
    chassis: int
    slot: int


@dataclass(frozen=True)
class DownstreamPort:
    id: str
    switch: str
    port: int
    chassis: int
    slot: int


@dataclass(frozen=True)
class Switch:
    id: str
    root_port: str
    downstream: tuple[DownstreamPort, ...]


@dataclass(frozen=True)
class Device:
    """A CXL Type 3 memory device (the PF-NIC, or a module behind an electrical switch)."""

    id: str
    port: str
    volatile: int
    serial: int


@dataclass(frozen=True)
class Window:
    """A CXL fixed memory window (one CFMWS entry, one root decoder in Linux)."""

    id: str
    size: int
    targets: tuple[str, ...]
    granularity: int
    arithmetic: str = "modulo"      # CFMWS interleave arithmetic: modulo or xor
    restrictions: int = 0x000F      # CFMWS window restriction bits (QEMU always writes 0x000F)
    qtg_id: int = 0                 # CFMWS QoS throttling group

    @property
    def ways(self) -> int:
        return len(self.targets)

    @property
    def qemu_expressible(self) -> bool:
        """QEMU 10 writes modulo windows with restrictions 0x000F and QTG 0, nothing else."""
        return self.arithmetic == "modulo" and self.restrictions == 0x000F and self.qtg_id == 0


@dataclass(frozen=True)
class Region:
    id: str
    window: str
    devices: tuple[str, ...]
    size: int
    granularity: int
    mode: str

    @property
    def ways(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class Topology:
    name: str
    description: str
    source: str
    guest: Guest
    host_bridges: tuple[HostBridge, ...]
    root_ports: tuple[RootPort, ...]
    switches: tuple[Switch, ...]
    devices: tuple[Device, ...]
    windows: tuple[Window, ...]
    regions: tuple[Region, ...]
    timing: str | None = None       # fabric_constants profile for CDAT and HMAT, or QEMU's defaults

    @property
    def downstream_ports(self) -> tuple[DownstreamPort, ...]:
        return tuple(p for s in self.switches for p in s.downstream)

    def device(self, device_id: str) -> Device:
        return next(d for d in self.devices if d.id == device_id)

    def window(self, window_id: str) -> Window:
        return next(w for w in self.windows if w.id == window_id)

    def host_bridge_of(self, device_id: str) -> str:
        """The host bridge a device sits under, through any switch."""
        port = self.device(device_id).port
        for sw in self.switches:
            if any(p.id == port for p in sw.downstream):
                port = sw.root_port
        return next(rp.host_bridge for rp in self.root_ports if rp.id == port)

    @property
    def needs_kmem(self) -> bool:
        return any(r.mode == "system-ram" for r in self.regions)


# --------------------------------------------------------------------------- reading


class _Problems:
    """Collects one line per mistake; raised together at the end of loading."""

    def __init__(self, source: str):
        self.source = source
        self.lines: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.lines.append(f"{self.source}: {where}: {message}")

    def raise_if_any(self) -> None:
        if self.lines:
            raise TopologyError("\n".join(self.lines))


def _type_name(kind: Any) -> str:
    return {int: "an integer", str: "a string", list: "a list", dict: "a table", "size": "a size"}[kind]


class _Table:
    """Reads one TOML table against a declared set of keys, recording mistakes."""

    def __init__(self, problems: _Problems, where: str, data: Any, fields: dict[str, tuple[Any, Any]]):
        # fields: key -> (kind, default); default REQUIRED means the key must be present
        self.problems, self.where, self.ok = problems, where, True
        self.values: dict[str, Any] = {}
        if not isinstance(data, dict):
            problems.add(where, f"must be a table, got {type(data).__name__}")
            self.ok = False
            return
        for key in data:
            if key not in fields:
                known = ", ".join(fields)
                problems.add(where, f"unknown key '{key}' (known keys: {known})")
                self.ok = False
        for key, (kind, default) in fields.items():
            if key not in data:
                if default is REQUIRED:
                    problems.add(where, f"missing required key '{key}'")
                    self.ok = False
                self.values[key] = None if default is REQUIRED else default
                continue
            value = self._convert(key, kind, data[key])
            self.values[key] = value
            if value is None:
                self.ok = False

    def _convert(self, key: str, kind: Any, raw: Any) -> Any:
        if kind == "size":
            if isinstance(raw, int) and not isinstance(raw, bool):
                return raw
            if isinstance(raw, str):
                try:
                    return parse_size(raw)
                except ValueError as exc:
                    self.problems.add(f"{self.where}.{key}", str(exc))
                    return None
        elif isinstance(raw, kind) and not isinstance(raw, bool):
            return raw
        self.problems.add(f"{self.where}.{key}",
                          f"must be {_type_name(kind)}, got {type(raw).__name__} {raw!r}")
        return None

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


REQUIRED = object()


def _entries(problems: _Problems, doc: dict, key: str) -> list:
    value = doc.get(key, [])
    if not isinstance(value, list):
        problems.add(key, f"must be an array of tables ([[{key}]]), got {type(value).__name__}")
        return []
    return value


def _read_guest(problems: _Problems, doc: dict) -> Guest | None:
    t = _Table(problems, "guest", doc.get("guest", {}), {
        "memory": ("size", 1 * GiB), "maxmem": ("size", 2 * GiB), "slots": (int, 4),
        "cpus": (int, 1), "cmdline": (str, ""),
    })
    if not t.ok:
        return None
    if t["memory"] < 256 * MiB or t["memory"] % MiB:
        problems.add("guest.memory", f"{t['memory']} must be a whole number of MiB, at least 256 MiB")
    if t["maxmem"] % MiB:
        problems.add("guest.maxmem", f"{t['maxmem']} must be a whole number of MiB")
    if t["maxmem"] <= t["memory"]:
        # PLATFORM.md: without maxmem above memory (and slots) Linux cannot add the CXL region.
        problems.add("guest.maxmem", f"{human(t['maxmem'])} must be larger than guest.memory "
                     f"({human(t['memory'])}): region setup needs memory hotplug room")
    if not 1 <= t["slots"] <= 256:
        problems.add("guest.slots", f"{t['slots']} must be between 1 and 256")
    if not 1 <= t["cpus"] <= 64:
        problems.add("guest.cpus", f"{t['cpus']} must be between 1 and 64")
    return Guest(t["memory"], t["maxmem"], t["slots"], t["cpus"], t["cmdline"])


def _read_list(problems: _Problems, doc: dict, key: str, fields: dict,
               build: Callable[[_Table, str], Any]) -> list:
    out = []
    for i, raw in enumerate(_entries(problems, doc, key)):
        label = raw.get("id") if isinstance(raw, dict) and isinstance(raw.get("id"), str) else f"#{i}"
        where = f"{key} '{label}'" if not label.startswith("#") else f"{key}[{i}]"
        t = _Table(problems, where, raw, fields)
        if t.ok:
            item = build(t, where)
            if item is not None:
                out.append(item)
    return out


def _string_list(problems: _Problems, where: str, value: Any) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.add(where, f"must be a list of ids (strings), got {value!r}")
        return None
    return tuple(value)


def load(path: str | Path) -> Topology:
    """Read and validate a topology file. Raises TopologyError listing every mistake."""
    path = Path(path)
    source = path.name
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise TopologyError(f"{path}: no such topology file") from None
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(f"{source}: not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"{path}: cannot read: {exc}") from None
    return from_dict(doc, source=source, default_name=path.stem)


def resolve(name_or_path: str | Path | None) -> Path:
    """A topology argument: a path to a file, or the name of a shipped topology."""
    if name_or_path is None:
        name_or_path = DEFAULT_TOPOLOGY
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or candidate.exists():
        return candidate
    shipped = TOPOLOGY_DIR / f"{name_or_path}.toml"
    if shipped.exists():
        return shipped
    names = ", ".join(sorted(p.stem for p in TOPOLOGY_DIR.glob("*.toml")))
    raise TopologyError(f"no topology named '{name_or_path}' (shipped: {names}; or give a path to a .toml file)")


def shipped_topologies() -> list[Path]:
    return sorted(TOPOLOGY_DIR.glob("*.toml"))


def from_dict(doc: dict, *, source: str = "<topology>", default_name: str = "topology") -> Topology:
    problems = _Problems(source)
    top = _Table(problems, "top level", {k: v for k, v in doc.items() if not isinstance(v, (list, dict))
                                         or k in ("name", "description", "timing")},
                 {"name": (str, default_name), "description": (str, ""), "timing": (str, None)})
    if top.ok and top["timing"] is not None and top["timing"] not in fabric_constants.PROFILES:
        problems.add("timing", f"'{top['timing']}' is not a timing profile "
                     f"(known: {', '.join(fabric_constants.PROFILES)})")
    for key, value in doc.items():
        if isinstance(value, (list, dict)) and key not in _SECTIONS:
            problems.add("top level", f"unknown section '{key}' (known: {', '.join(_SECTIONS)})")

    guest = _read_guest(problems, doc)
    bridges = _read_list(problems, doc, "host_bridge", {"id": (str, REQUIRED), "bus_nr": (int, REQUIRED)},
                         lambda t, w: HostBridge(t["id"], t["bus_nr"]))
    port_fields = {"id": (str, REQUIRED), "port": (int, REQUIRED), "chassis": (int, REQUIRED),
                   "slot": (int, REQUIRED)}
    root_ports = _read_list(problems, doc, "root_port", {**port_fields, "host_bridge": (str, REQUIRED)},
                            lambda t, w: RootPort(t["id"], t["host_bridge"], t["port"], t["chassis"], t["slot"]))

    def build_switch(t: _Table, where: str) -> Switch | None:
        ports = []
        if not isinstance(t["downstream"], list):
            problems.add(f"{where}.downstream", "must be a list of tables {id, port, chassis, slot}")
            return None
        for j, raw in enumerate(t["downstream"]):
            pt = _Table(problems, f"{where}.downstream[{j}]", raw, port_fields)
            if pt.ok:
                ports.append(DownstreamPort(pt["id"], t["id"], pt["port"], pt["chassis"], pt["slot"]))
        return Switch(t["id"], t["root_port"], tuple(ports))

    switches = _read_list(problems, doc, "switch", {"id": (str, REQUIRED), "root_port": (str, REQUIRED),
                                                    "downstream": (list, REQUIRED)}, build_switch)
    devices = _read_list(problems, doc, "device", {"id": (str, REQUIRED), "port": (str, REQUIRED),
                                                   "volatile": ("size", REQUIRED), "serial": (int, REQUIRED)},
                         lambda t, w: Device(t["id"], t["port"], t["volatile"], t["serial"]))

    def build_window(t: _Table, where: str) -> Window | None:
        targets = _string_list(problems, f"{where}.targets", t["targets"])
        return None if targets is None else Window(t["id"], t["size"], targets, t["granularity"],
                                                   t["arithmetic"], t["restrictions"], t["qtg_id"])

    windows = _read_list(problems, doc, "window", {"id": (str, REQUIRED), "size": ("size", REQUIRED),
                                                   "targets": (list, REQUIRED), "granularity": ("size", 256),
                                                   "arithmetic": (str, "modulo"), "restrictions": (int, 0x000F),
                                                   "qtg_id": (int, 0)},
                         build_window)

    raw_regions = _entries(problems, doc, "region")
    regions = []
    for i, raw in enumerate(raw_regions):
        t = _Table(problems, f"region[{i}]", raw, {
            "window": (str, REQUIRED), "devices": (list, REQUIRED), "size": ("size", None),
            "granularity": ("size", None), "mode": (str, "devdax")})
        if not t.ok:
            continue
        devs = _string_list(problems, f"region[{i}].devices", t["devices"])
        if devs is not None:
            regions.append((i, t, devs))

    problems.raise_if_any()   # structure first: the rules below assume well-typed entries
    assert guest is not None
    topo_regions = _check(problems, bridges, root_ports, switches, devices, windows, regions)
    problems.raise_if_any()
    return Topology(top["name"], top["description"], source, guest, tuple(bridges), tuple(root_ports),
                    tuple(switches), tuple(devices), tuple(windows), tuple(topo_regions), top["timing"])


_SECTIONS = ("guest", "host_bridge", "root_port", "switch", "device", "window", "region")


# --------------------------------------------------------------------------- rules


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _check(problems: _Problems, bridges, root_ports, switches, devices, windows, raw_regions) -> list[Region]:
    downstream = [p for s in switches for p in s.downstream]
    named = ([("host_bridge", b.id) for b in bridges] + [("root_port", p.id) for p in root_ports]
             + [("switch", s.id) for s in switches] + [("downstream port", p.id) for p in downstream]
             + [("device", d.id) for d in devices] + [("window", w.id) for w in windows])
    seen: dict[str, str] = {}
    for kind, ident in named:
        if ident.startswith(BACKEND_PREFIX):
            problems.add(f"{kind} '{ident}'", f"ids starting with '{BACKEND_PREFIX}' are reserved for "
                         "the memory backends pfcxl creates")
        if not _QEMU_ID.match(ident):
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
        if d.volatile <= 0 or d.volatile % REGION_ALIGN:
            problems.add(f"{where}.volatile", f"{d.volatile} bytes is not a positive multiple of 256 MiB "
                         "(the CXL HDM decoder unit)")
        if not 0 <= d.serial < 1 << 64:
            problems.add(f"{where}.serial", f"{d.serial} does not fit in 64 bits")
        if d.serial in serials:
            problems.add(f"{where}.serial", f"{d.serial} collides with device '{serials[d.serial]}'")
        serials.setdefault(d.serial, d.id)

    if not windows:
        problems.add("window", "at least one [[window]] (CXL fixed memory window) is needed")
    for w in windows:
        where = f"window '{w.id}'"
        _check_granularity(problems, f"{where}.granularity", w.granularity)
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


def _check_granularity(problems: _Problems, where: str, value: int) -> None:
    if not (_is_pow2(value) and MIN_GRANULARITY <= value <= MAX_GRANULARITY):
        problems.add(where, f"{value} must be a power of two from 256 to 16K bytes")


def _check_regions(problems: _Problems, topo: Topology, raw_regions) -> list[Region]:
    device_ids = {d.id for d in topo.devices}
    window_ids = {w.id for w in topo.windows}
    used_by: dict[str, str] = {}
    window_use: dict[str, int] = {}
    regions = []
    for i, t, devs in raw_regions:
        where = f"region[{i}]"
        rid = f"region{i}"
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
        _check_granularity(problems, f"{where}.granularity", granularity)
        if window.ways > 1 and granularity != window.granularity:
            problems.add(f"{where}.granularity", f"{granularity} must equal window '{window.id}' "
                         f"granularity {window.granularity} when the window interleaves host bridges")
            ok = False
        smallest = min(topo.device(d).volatile for d in devs)
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
        if ok:
            regions.append(Region(rid, window.id, devs, size, granularity, t["mode"]))
    return regions
