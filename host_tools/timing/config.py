"""A timed run: what the TCG plugin does (TimingConfig), the QEMU options that load it
(plugin_args) and the session that owns one VM's ring, log and drainer (TimingSession).
The plugin's build is in host_tools/timing/plugin.py, the ring in device/trace/ring.py, the emulator baseline
that inject mode subtracts in calibration.py.

    session = TimingSession(topo, run_dir, TimingConfig("trace"))
    vm = VM(topo, image, run_dir, extra_args=session.qemu_args())   # pfcxl.Machine does all this
    session.start()                       # drains the ring in a thread (trace mode)
    vm.run("cxl_touch --reads 1000 --writes 500")
    records = session.stop()              # numpy array of trace records
    session.phases()                      # the plugin's per-phase counters (JSON lines)

Modes: count (per-vCPU request counters), trace (one record per cache-line request), inject
(the vCPU busy-waits the modelled latency minus the calibrated emulator baseline).

Phases: the plugin records nothing until the guest stores 1 into the DOORBELL, the last 64-byte
line of the first DAX device (guest/include/pfcxl_mark.h; `pfcxl_mark start|stop` in the
guest), and stops at a store of 2. Its host physical address is doorbell_hpa(topo). With a direct
path each direct device has its own doorbell (doorbell_hpas), and the plugin counts and traces
accesses to the direct windows (address_map.direct_placements) like CXL ones: trace records
then carry the direct window's guest physical address.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pfcxl.device.topology import address_map
from pfcxl.device.topology import data_path
from pfcxl.device.topology import Topology
from pfcxl.errors import TimingError
from pfcxl.host_tools.timing import MODES
from pfcxl.guest.tool_output import json_lines

from pfcxl.host_tools.timing import vtime
from pfcxl.host_tools.timing.plugin import build_plugin, doorbell_hpa, doorbell_hpas
from pfcxl.device.trace.ring import DEFAULT_CAPACITY, Drainer, Ring

if TYPE_CHECKING:
    import numpy as np


MAX_PROFILES = 8   # the plugin's limit


def _ns_list(value: float | tuple[float, ...] | list[float]) -> tuple[float, ...]:
    return tuple(float(v) for v in value) if isinstance(value, (tuple, list)) else (float(value),)


@dataclass(frozen=True)
class TimingConfig:
    """What the plugin does. read_ns/write_ns may list several latency profiles (inject): the
    guest selects profile k with `pfcxl_mark profile k` (or chase --profile k); 0 is the default."""

    mode: str = "count"
    read_ns: float | tuple[float, ...] = 0.0    # inject: modelled latency per cache-line read
    write_ns: float | tuple[float, ...] = 0.0   # inject: per cache-line write
    baseline_ns: float = 0.0      # inject: emulator cost already paid per request
    capacity: int = DEFAULT_CAPACITY
    doorbell: bool = True         # False: record everything from boot on
    clock: str = "emulator"       # "virtual": the guest's clock carries the fabric's latencies (vtime.py)
    fabric: str = "pf"            # virtual: the fabric its CXL requests are charged by
    fabric_params: tuple[str, ...] = ()   # what-if NAME=VALUE changes to the fabric model (virtual and trace)
    timeline: str = ""            # virtual: the appliance's timeline file (device/appliance/timeline.py)
    timeline_host: int = 0        # and this guest's host id in it

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise TimingError(f"timing mode '{self.mode}' is not one of {', '.join(MODES)}")
        vtime.check_clock(self.clock)
        vtime.check_fabric(self.fabric)
        object.__setattr__(self, "fabric_params", tuple(self.fabric_params))
        vtime.params(self.fabric_params)
        if self.timeline and self.clock != "virtual":
            raise TimingError("a timeline keeps timed hosts in step: it needs --clock virtual")
        if self.clock == "virtual" and self.mode == "inject":
            raise TimingError("--clock virtual charges the guest's own clock; --timing inject spins on host "
                              "time instead: use one of them")
        reads, writes = _ns_list(self.read_ns), _ns_list(self.write_ns)
        for name, values in (("read_ns", reads), ("write_ns", writes), ("baseline_ns", (self.baseline_ns,))):
            if not values or len(values) > MAX_PROFILES or any(v < 0 for v in values):
                raise TimingError(f"{name} must be 1 to {MAX_PROFILES} non-negative values, not {values}")
        if len(reads) > 1 and len(writes) > 1 and len(reads) != len(writes):
            raise TimingError(f"read_ns lists {len(reads)} profiles but write_ns {len(writes)}")


def bracket(command: str, ready: dict) -> str:
    """Bracket a guest command with the phase markers on the first DAX device (`ready`: the
    guest's PFCXL-READY record); keep its exit status, and its output alone (the markers' lines go
    to /dev/null: a benchmark's JSON line must be the first of the output)."""
    dax = next((f" --dax {d['path']}" for d in ready.get("dax", [])), "")
    return f"pfcxl_mark start{dax} >/dev/null; {command}; rc=$?; pfcxl_mark stop{dax} >/dev/null; (exit $rc)"


_MARKED = re.compile(r"--mark-rows(=|\s+)1\b")


def marks_rows(command: str) -> bool:
    """Does this command make each of its rows a plugin phase (the guest tools' --mark-rows 1)?"""
    return bool(_MARKED.search(command))


def split_rows(records: "np.ndarray", phases: list[dict]) -> "list[np.ndarray]":
    """The records of each phase (the plugin's phase events of this run, in order)."""
    import numpy as np            # only when a run's records are split
    counts = [int(p["reads"]) + int(p["writes"]) for p in phases]
    if sum(counts) != len(records):
        raise TimingError(f"the plugin reported {sum(counts)} requests in {len(phases)} phases but "
                          f"{len(records)} records were drained")
    return np.split(records, np.cumsum(counts)[:-1]) if counts else []


def ring_path(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / f"{name}.ring"


def vtime_path(run_dir: Path, name: str) -> Path:
    """The virtual-time model file of the VM named `name` (clock virtual)."""
    return Path(run_dir) / f"{name}.vtime"


def plugin_log(run_dir: Path, name: str) -> Path:
    """Where the plugin of the VM named `name` writes its JSON lines (-D)."""
    return Path(run_dir) / f"{name}.plugin.log"


def plugin_events(log: Path) -> list[dict]:
    """The plugin's JSON lines in `log` so far (start, one per finished phase, exit)."""
    try:
        text = Path(log).read_text(errors="replace")
    except FileNotFoundError:
        return []
    return json_lines(text, '{"event"', bad="skip")     # skip: the last line may be still being written


def plugin_args(plugin: Path, topo: Topology, run_dir: Path, config: TimingConfig, name: str = "guest",
                ring: str | None = None) -> list[str]:
    """QEMU's plugin options for a VM named `name` in `run_dir`: -plugin (absolute path, mode,
    doorbell, ring, injected latencies) and -d plugin -D LOG (the plugin's JSON lines go to the
    log). `ring`: where a ring someone else owns is (a timed appliance's: /proc/self/fd/N), instead
    of the run directory's ring file. Pure: a dry run prints these, a TimingSession boots with them."""
    from pfcxl.host_tools.vm.qemu import qemu_opt      # jinja2 with it: only when a boot is planned
    opts = [qemu_opt(plugin), f"mode={config.mode}"]
    if config.doorbell:
        doorbell_hpa(topo)          # one line saying why there is none
        opts += [f"doorbell={hpa:#x}" for hpa in doorbell_hpas(topo)]
    if data_path.has_direct(topo):  # the direct path's accesses are guest RAM: known by address
        opts += [f"direct={p.base:#x}:{p.size:#x}" for p in address_map.direct_placements(topo)]
    if config.mode == "trace":
        opts.append(f"ring={qemu_opt(ring or ring_path(run_dir, name))}")
    if config.mode == "inject":
        opts += ["read_ns=" + ":".join(f"{v:g}" for v in _ns_list(config.read_ns)),
                 "write_ns=" + ":".join(f"{v:g}" for v in _ns_list(config.write_ns)),
                 f"baseline_ns={config.baseline_ns:g}"]
    clock: list[str] = []
    if config.clock == "virtual":
        opts += ["clock=virtual", f"vtime={qemu_opt(vtime_path(run_dir, name))}"]
        if config.timeline:
            opts += [f"timeline={qemu_opt(config.timeline)}", f"timeline_host={config.timeline_host}"]
        clock = list(vtime.QEMU_ICOUNT)
    log = plugin_log(run_dir, name)
    return ["-plugin", ",".join(opts), "-d", "plugin", "-D", str(log), *clock]


class TimingSession:
    """The plugin, ring, log and drainer of one VM. qemu_args() goes into VM(extra_args=...)."""

    def __init__(self, topo: Topology, run_dir: Path, config: TimingConfig, name: str = "guest") -> None:
        self.config, self.topo, self.name = config, topo, name
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.plugin = build_plugin()
        self.log = plugin_log(self.run_dir, name)
        self.log.unlink(missing_ok=True)
        if config.clock == "virtual":
            vtime_path(self.run_dir, name).write_text(
                vtime.model_text(topo, config.fabric, what_if=vtime.params(config.fabric_params)))
        self.ring: Ring | None = None
        self.trace_file: Path | None = None
        self.drainer: Drainer | None = None
        if config.mode == "trace":
            self.ring = Ring.create(ring_path(self.run_dir, name), config.capacity)
            self.trace_file = self.run_dir / f"{name}.trace"
            self.trace_file.unlink(missing_ok=True)

    def qemu_args(self) -> list[str]:
        return plugin_args(self.plugin, self.topo, self.run_dir, self.config, self.name)

    def start(self) -> None:
        """Begin draining the ring (trace mode; nothing to do otherwise). Call after launch."""
        if self.ring is not None and self.drainer is None:
            self.drainer = Drainer(self.ring, self.trace_file).start()

    def stop(self):
        """Stop draining; every record of the run (numpy array), or None outside trace mode."""
        if self.drainer is None:
            return None
        records = self.drainer.stop()
        self.drainer = None
        return records

    def close(self) -> None:
        if self.drainer is not None:
            self.stop()
        if self.ring is not None:
            self.ring.close()
            self.ring = None

    def __enter__(self) -> "TimingSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- what the plugin said

    def events(self) -> list[dict]:
        """The plugin's JSON lines so far (start, one per finished phase, exit)."""
        return plugin_events(self.log)

    def phases(self) -> list[dict]:
        return [e for e in self.events() if e.get("event") == "phase"]

    def wait_phases(self, n: int, timeout: float = 30) -> list[dict]:
        """Wait until the plugin has reported `n` finished phases (its log is written as they end)."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.phases()
            if len(got) >= n or time.monotonic() > deadline:
                if len(got) < n:
                    raise TimingError(f"the plugin reported {len(got)} phases, expected {n} "
                                      f"(log {self.log})")
                return got
            time.sleep(0.05)


