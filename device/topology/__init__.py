"""The topology: the one object that flows through pfcxl (see docs/ARCHITECTURE.md).

A TOML file is read once into an immutable, validated `Topology`. Every mistake found is
reported, one line each, naming the field and the rule; nothing downstream re-checks.

File shape (see device/topologies/*.toml for complete examples):

    name = "pf-nic"                      # optional, defaults to the file's stem
    description = "..."
    profile = "pf"                       # optional: the profile (device/fabric/constants.py) the CDAT and HMAT
                                         # carry (its old name `timing` is read with a notice)
    [guest]       memory, maxmem, slots, cpus, cmdline, data_path (cxl, direct or both)
    [[host_bridge]]  id, bus_nr
    [[root_port]]    id, host_bridge, port, chassis, slot
    [[switch]]       id, root_port, downstream = [{id, port, chassis, slot}, ...]
    [[device]]       id, port (a root or downstream port), volatile or persistent + lsa, serial
    [[window]]       id, size, targets = [host bridge ids], granularity, arithmetic, restrictions, qtg_id
    [[region]]       window, devices = [device ids in interleave order], size, granularity, mode

The objects live in topology_model, the typed TOML reading in topology_reader and the rules
across entries in topology_rules; import them all from here.
"""

from __future__ import annotations

import difflib
import logging
import re
from pathlib import Path

from pfcxl.errors import TopologyError
from pfcxl.text_files import read_toml

from pfcxl.device.topology import data_path
from pfcxl.device.fabric import constants as fabric_constants
from pfcxl.device.facts import qemu as qemu_facts
from pfcxl.device.topology import limits as topology_limits
from pfcxl.device.topology.model import (ApplianceSpec, Device, DownstreamPort, Guest, HostBridge, Region, RootPort, Switch,
                             Topology, Window)
from pfcxl.device.topology.appliance_section import check_appliance_devices, read_appliance
from pfcxl.device.topology.reader import REQUIRED, Problems, TomlTable, entries, read_list, string_list
from pfcxl.device.topology.rules import (BACKEND_PREFIX, DIRECT_PREFIX, LSA_PREFIX, MAX_GRANULARITY, MAX_RESTRICTIONS, MAX_WINDOW_TARGETS,
                             MIN_GRANULARITY, REGION_ALIGN, REGION_MODES, VALID_WAYS, WINDOW_ARITHMETIC,
                             check)
from pfcxl.device.topology.units import GiB, MiB, human

TOPOLOGY_DIR = Path(__file__).parent.parent / "topologies"
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the checkout, for an editable install
DEFAULT_TOPOLOGY = "pf-nic"
__all__ = [
    "BACKEND_PREFIX", "DEFAULT_TOPOLOGY", "DIRECT_PREFIX", "LSA_PREFIX", "MAX_GRANULARITY", "MAX_RESTRICTIONS", "MAX_WINDOW_TARGETS",
    "MIN_GRANULARITY", "REGION_ALIGN", "REGION_MODES", "TOPOLOGY_DIR", "VALID_WAYS", "WINDOW_ARITHMETIC",
    "ApplianceSpec", "Device", "DownstreamPort", "Guest", "HostBridge", "Region", "RootPort", "Switch", "Topology",
    "TopologyError", "Window", "from_dict", "load", "resolve", "shipped_topologies",
]

log = logging.getLogger("pfcxl.topology")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SECTIONS = ("guest", "host_bridge", "root_port", "switch", "device", "window", "region", "appliance")


def _read_guest(problems: Problems, doc: dict) -> Guest | None:
    t = TomlTable(problems, "guest", doc.get("guest", {}), {
        "memory": ("size", 1 * GiB), "maxmem": ("size", 2 * GiB), "slots": (int, 4),
        "cpus": (int, 1), "cmdline": (str, ""), "data_path": (str, "cxl"),
    })
    if not t.ok:
        return None
    if t["memory"] < 256 * MiB or t["memory"] % MiB:
        problems.add("guest.memory", f"{t['memory']} must be a whole number of MiB, at least 256 MiB")
    if t["maxmem"] % MiB:
        problems.add("guest.maxmem", f"{t['maxmem']} must be a whole number of MiB")
    if t["maxmem"] < t["memory"]:
        problems.add("guest.maxmem", f"{human(t['maxmem'])} must not be below guest.memory "
                     f"({human(t['memory'])}); equal to it means no memory hotplug room")
    if not 1 <= t["slots"] <= 256:
        problems.add("guest.slots", f"{t['slots']} must be between 1 and 256")
    if not 1 <= t["cpus"] <= 64:
        problems.add("guest.cpus", f"{t['cpus']} must be between 1 and 64")
    if t["data_path"] not in data_path.DATA_PATHS:
        problems.add("guest.data_path", f"'{t['data_path']}' is not one of {', '.join(data_path.DATA_PATHS)}")
    return Guest(t["memory"], t["maxmem"], t["slots"], t["cpus"], t["cmdline"], t["data_path"])


def load(path: str | Path) -> Topology:
    """Read and validate a topology file. Raises TopologyError listing every mistake."""
    path = Path(path)
    source = path.name
    doc = read_toml(path, TopologyError, f"topology file {path}")
    return from_dict(doc, source=source, default_name=path.stem)


def resolve(name_or_path: str | Path | None) -> Path:
    """A topology argument: a path to a file, or the name of a shipped topology. A relative path
    that is not in the current directory is looked up in the pfcxl checkout, so the documented
    `tests/data/topologies/...` examples work from anywhere."""
    if name_or_path is None:
        name_or_path = DEFAULT_TOPOLOGY
    candidate = Path(name_or_path)
    if candidate.exists():
        return candidate
    if not candidate.is_absolute() and (SOURCE_ROOT / candidate).is_file():
        return SOURCE_ROOT / candidate
    if candidate.suffix == ".toml":
        return candidate
    shipped = TOPOLOGY_DIR / f"{name_or_path}.toml"
    if shipped.exists():
        return shipped
    names = sorted(p.stem for p in TOPOLOGY_DIR.glob("*.toml"))
    close = difflib.get_close_matches(str(name_or_path), names, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise TopologyError(f"no topology named '{name_or_path}' ({hint}shipped: {', '.join(names)}; "
                        "or give a path to a .toml file)")


def shipped_topologies() -> list[Path]:
    return sorted(TOPOLOGY_DIR.glob("*.toml"))


# Keys renamed since topologies were first written: old -> new. The old key is still read (a
# user's file keeps working), with one notice per file saying what to write instead.
OLD_KEYS = {"timing": "profile"}
_noticed: set[tuple[str, str]] = set()


def _old_names(problems: Problems, doc: dict, source: str) -> dict:
    renamed = dict(doc)
    for old, new in OLD_KEYS.items():
        if old not in doc:
            continue
        if new in doc:
            problems.add(old, f"'{old}' is the old name of '{new}': give '{new}' only")
            continue
        renamed[new] = renamed.pop(old)
        if (source, old) not in _noticed:
            _noticed.add((source, old))
            log.warning("pfcxl: notice: %s: the topology key '%s' is now '%s' (the old name still works)",
                        source, old, new)
    return renamed


def from_dict(doc: dict, *, source: str = "<topology>", default_name: str = "topology") -> Topology:
    problems = Problems(source)
    doc = _old_names(problems, doc, source)
    top = TomlTable(problems, "top level", {k: v for k, v in doc.items() if not isinstance(v, (list, dict))
                                            or k in ("name", "description", "profile")},
                    {"name": (str, default_name), "description": (str, ""), "profile": (str, None)})
    if top.ok and not _NAME.fullmatch(top["name"]):
        # The name becomes a directory and file name (appliance run directory, tables output).
        problems.add("name" if "name" in doc else "name (the file's stem)",
                     f"{top['name']!r} must be 1 to 64 letters, digits, '.', '-' or '_', starting with a "
                     "letter or digit (it is used in file names)")
    if top.ok and top["profile"] is not None and top["profile"] not in fabric_constants.PROFILES:
        problems.add("profile", f"'{top['profile']}' is not a fabric profile "
                     f"(known: {', '.join(fabric_constants.PROFILES)})")
    for key, value in doc.items():
        if isinstance(value, (list, dict)) and key not in _SECTIONS:
            problems.add("top level", f"unknown section '{key}' (known: {', '.join(_SECTIONS)})")

    guest = _read_guest(problems, doc)
    bridges = read_list(problems, doc, "host_bridge", {"id": (str, REQUIRED), "bus_nr": (int, REQUIRED)},
                        lambda t, w: HostBridge(t["id"], t["bus_nr"]))
    port_fields = {"id": (str, REQUIRED), "port": (int, REQUIRED), "chassis": (int, REQUIRED),
                   "slot": (int, REQUIRED)}
    root_ports = read_list(problems, doc, "root_port", {**port_fields, "host_bridge": (str, REQUIRED)},
                           lambda t, w: RootPort(t["id"], t["host_bridge"], t["port"], t["chassis"], t["slot"]))

    def build_switch(t: TomlTable, where: str) -> Switch | None:
        ports = []
        if not isinstance(t["downstream"], list):
            problems.add(f"{where}.downstream", "must be a list of tables {id, port, chassis, slot}")
            return None
        for j, raw in enumerate(t["downstream"]):
            pt = TomlTable(problems, f"{where}.downstream[{j}]", raw, port_fields)
            if pt.ok:
                ports.append(DownstreamPort(pt["id"], t["id"], pt["port"], pt["chassis"], pt["slot"]))
        return Switch(t["id"], t["root_port"], tuple(ports))

    switches = read_list(problems, doc, "switch", {"id": (str, REQUIRED), "root_port": (str, REQUIRED),
                                                   "downstream": (list, REQUIRED)}, build_switch)
    def build_device(t: TomlTable, where: str) -> Device | None:
        volatile, persistent, lsa = t["volatile"], t["persistent"], t["lsa"]
        if (volatile is None) == (persistent is None):
            problems.add(where, "give exactly one of 'volatile' and 'persistent' (the device's memory "
                         "size; pfcxl gives a device one kind of memory)")
            return None
        if persistent is not None and lsa is None:
            problems.add(f"{where}.lsa", "missing: a persistent device needs a label storage area "
                         "(QEMU refuses persistent-memdev without lsa)")
            return None
        if volatile is not None and lsa is not None:
            problems.add(f"{where}.lsa", "only a persistent device has a label storage area")
            return None
        if persistent is not None and t["appliance"] is not None:
            problems.add(f"{where}.appliance", "the appliance serves volatile memory; a persistent "
                         "device keeps its memory in the run directory")
            return None
        return Device(t["id"], t["port"], volatile or 0, t["serial"], t["appliance"], persistent or 0, lsa or 0)

    devices = read_list(problems, doc, "device", {"id": (str, REQUIRED), "port": (str, REQUIRED),
                                                  "volatile": ("size", None), "persistent": ("size", None),
                                                  "lsa": ("size", None), "serial": (int, REQUIRED),
                                                  "appliance": (str, None)},
                        build_device)
    appliance = read_appliance(problems, doc)
    check_appliance_devices(problems, appliance, devices)

    def build_window(t: TomlTable, where: str) -> Window | None:
        targets = string_list(problems, f"{where}.targets", t["targets"])
        return None if targets is None else Window(t["id"], t["size"], targets, t["granularity"],
                                                   t["arithmetic"], t["restrictions"], t["qtg_id"])

    windows = read_list(problems, doc, "window", {"id": (str, REQUIRED), "size": ("size", REQUIRED),
                                                  "targets": (list, REQUIRED), "granularity": ("size", 256),
                                                  "arithmetic": (str, "modulo"), "restrictions": (int, qemu_facts.RESTRICTIONS),
                                                  "qtg_id": (int, 0)},
                        build_window)

    raw_regions = entries(problems, doc, "region")
    regions = []
    for i, raw in enumerate(raw_regions):
        t = TomlTable(problems, f"region[{i}]", raw, {
            "window": (str, REQUIRED), "devices": (list, REQUIRED), "size": ("size", None),
            "granularity": ("size", None), "mode": (str, "devdax")})
        if not t.ok:
            continue
        devs = string_list(problems, f"region[{i}].devices", t["devices"])
        if devs is not None:
            regions.append((i, t, devs))

    problems.raise_if_any()   # structure first: the rules below assume well-typed entries
    assert guest is not None
    topo_regions = check(problems, bridges, root_ports, switches, devices, windows, regions)
    problems.raise_if_any()
    topo = Topology(top["name"], top["description"], source, guest, tuple(bridges), tuple(root_ports),
                    tuple(switches), tuple(devices), tuple(windows), tuple(topo_regions), top["profile"],
                    appliance)
    topology_limits.check_address_space(problems, topo)
    topology_limits.check_interrupt_vectors(problems, topo)
    for message in data_path.problems(topo):
        problems.add("guest.data_path", message)
    problems.raise_if_any()
    return topo

