"""The capture side of fabric timing: pfcxl's TCG plugin (device/plugin/pfcxl_plugin.c), its
shared-memory trace ring (device/trace_format.py) and the QEMU options that load it.

    session = TimingSession(topo, run_dir, TimingConfig("trace"))
    vm = boot_ready(topo, image, run_dir, extra_args=session.qemu_args())
    session.start()                       # drains the ring in a thread (trace mode)
    vm.run("cxl_touch --reads 1000 --writes 500")
    records = session.stop()              # numpy array of trace records
    session.phases()                      # the plugin's per-phase counters (JSON lines)

Modes: count (per-vCPU request counters), trace (one record per cache-line request), inject
(the vCPU busy-waits the modelled latency minus the calibrated emulator baseline).

Phases: the plugin records nothing until the guest stores 1 into the DOORBELL, the last 64-byte
line of the first DAX device (guest/include/pfcxl_mark.h; `pfcxl_mark start|stop` in the
guest), and stops at a store of 2. Its host physical address is doorbell_hpa(topo).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pfcxl.device import address_map
from pfcxl.device import trace_format as tf
from pfcxl.device.topology import Topology
from pfcxl.errors import VMError

from . import cache
from .qemu import qemu_opt

PLUGIN_DIR = Path(__file__).resolve().parent.parent / "device" / "plugin"
PLUGIN_SOURCES = ("pfcxl_plugin.c", "qemu_plugin_api.h")
PLUGIN_CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden")
MODES = ("count", "trace", "inject")
DEFAULT_CAPACITY = 1 << 20          # records (24 MiB of ring)
# header: magic u64, version u32, record_size u32, capacity u64, head u64, tail u64, dropped u64
_HEADER = struct.Struct("<QIIQQQQ")
_HEAD, _TAIL, _DROPPED = 24, 32, 40


class TimingError(VMError):
    """The plugin cannot be built or loaded, or a ring file is not what it should be."""


# ---------------------------------------------------------------------------- plugin build

def plugin_dir() -> Path:
    return cache.cache_dir() / "plugin"


def build_plugin(out_dir: Path | None = None) -> Path:
    """The plugin .so, compiled into the cache and reused until its source or flags change."""
    digest = hashlib.sha256(" ".join(PLUGIN_CFLAGS).encode())
    for name in PLUGIN_SOURCES:
        digest.update((PLUGIN_DIR / name).read_bytes())
    out_dir = out_dir or plugin_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    so = out_dir / f"pfcxl_plugin-{digest.hexdigest()[:16]}.so"
    if so.exists():
        return so.resolve()
    tmp = out_dir / f".{so.name}.{os.getpid()}.tmp"
    try:
        done = subprocess.run(["gcc", *PLUGIN_CFLAGS, "-o", str(tmp), str(PLUGIN_DIR / "pfcxl_plugin.c")],
                              capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise TimingError("building the TCG plugin needs gcc, which is not installed") from exc
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise TimingError(f"gcc could not build {PLUGIN_DIR / 'pfcxl_plugin.c'} "
                          f"(status {done.returncode}):\n{done.stderr.strip()[-3000:]}")
    os.replace(tmp, so)   # atomic: a concurrent build of the same source lands on the same name
    return so.resolve()


# ---------------------------------------------------------------------------- doorbell

def doorbell_hpa(topo: Topology) -> int:
    """Host physical address of the marker line: the last 64 bytes of the first DAX device
    (the guest side, guest/include/pfcxl_mark.h, stores to device offset size - 64)."""
    placements = address_map.dax_placements(topo)
    if not placements:
        raise TimingError(f"topology '{topo.name}' has no region, so no DAX device for the doorbell")
    dax = placements[0]
    return dax.base + dax.size - tf.LINE


# ---------------------------------------------------------------------------- ring

def _dtype():
    import numpy as np   # the engine's dependency; imported only where records are handled
    return np.dtype(tf.RECORD_FIELDS)


class Ring:
    """The trace ring file, mapped shared: the plugin produces at head, we consume at tail."""

    def __init__(self, path: Path, file, mm: mmap.mmap, capacity: int) -> None:
        self.path, self._file, self._mm, self.capacity = Path(path), file, mm, capacity
        # Single aligned 8-byte loads and stores (the plugin reads tail while we write it):
        # ctypes views, not struct.pack_into, whose byte copy is not promised to be one store.
        self._head = ctypes.c_uint64.from_buffer(mm, _HEAD)
        self._tail = ctypes.c_uint64.from_buffer(mm, _TAIL)
        self._dropped = ctypes.c_uint64.from_buffer(mm, _DROPPED)

    @classmethod
    def create(cls, path: Path, capacity: int = DEFAULT_CAPACITY) -> "Ring":
        """A new, empty ring (an existing file is replaced: a ring holds one run)."""
        if capacity <= 0:
            raise TimingError(f"ring capacity must be positive, not {capacity}")
        path = Path(path)
        with open(path, "wb") as f:
            f.write(_HEADER.pack(tf.RING_MAGIC, tf.RING_VERSION, tf.RECORD_SIZE, capacity, 0, 0, 0))
            f.truncate(tf.HEADER_SIZE + capacity * tf.RECORD_SIZE)   # sparse
        return cls.open(path)

    @classmethod
    def open(cls, path: Path) -> "Ring":
        path = Path(path)
        f = open(path, "r+b")
        try:
            size = os.fstat(f.fileno()).st_size
            if size < tf.HEADER_SIZE:
                raise TimingError(f"{path} is too small ({size} bytes) for a ring header")
            mm = mmap.mmap(f.fileno(), size)
            magic, version, record_size, capacity, *_ = _HEADER.unpack_from(mm, 0)
            if (magic, version, record_size) != (tf.RING_MAGIC, tf.RING_VERSION, tf.RECORD_SIZE):
                mm.close()
                raise TimingError(f"{path} is not a version-{tf.RING_VERSION} trace ring "
                                  f"(magic {magic:#x}, version {version}, record size {record_size})")
            if capacity <= 0 or size < tf.HEADER_SIZE + capacity * tf.RECORD_SIZE:
                mm.close()
                raise TimingError(f"{path}: header claims {capacity} records, file holds {size} bytes")
        except BaseException:
            f.close()
            raise
        return cls(path, f, mm, capacity)

    @property
    def head(self) -> int:
        return self._head.value

    @property
    def tail(self) -> int:
        return self._tail.value

    @property
    def dropped(self) -> int:
        return self._dropped.value

    def drain(self):
        """Every record written since the last drain, oldest first, as a numpy array; frees
        their slots for the producer."""
        import numpy as np
        head, tail = self.head, self.tail   # head read first: records before it are complete
        if head < tail or head - tail > self.capacity:
            raise TimingError(f"{self.path}: corrupt ring (head {head}, tail {tail}, capacity {self.capacity})")
        n = head - tail
        first = tail % self.capacity
        count1 = min(n, self.capacity - first)
        base = tf.HEADER_SIZE
        parts = [np.frombuffer(self._mm, _dtype(), count1, base + first * tf.RECORD_SIZE).copy()]
        if n > count1:
            parts.append(np.frombuffer(self._mm, _dtype(), n - count1, base).copy())
        self._tail.value = head   # only now may the producer reuse those slots
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def close(self) -> None:
        if self._mm.closed:
            return
        del self._head, self._tail, self._dropped   # release the buffer exports before closing
        try:
            self._mm.close()
        finally:
            self._file.close()


class Drainer:
    """Moves records out of the ring every `interval` seconds on a thread, keeping them in memory
    and, with `out`, appending their raw 24-byte form to a file (np.fromfile(out, dtype) reads it)."""

    def __init__(self, ring: Ring, out: Path | None = None, interval: float = 0.005) -> None:
        self.ring, self.out, self.interval = ring, out, interval
        self._chunks: list = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def drain_once(self) -> int:
        with self._lock:
            batch = self.ring.drain()
            if len(batch):
                self._chunks.append(batch)
                if self.out is not None:
                    with open(self.out, "ab") as f:
                        f.write(batch.tobytes())
            return len(batch)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.drain_once():
                    self._stop.wait(self.interval)
        except BaseException as exc:   # reported by stop()
            self._error = exc

    def start(self) -> "Drainer":
        self._thread = threading.Thread(target=self._run, name="pfcxl-ring-drainer", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Stop the thread, take what is left, and return every record drained."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise TimingError(f"draining {self.ring.path} failed: {self._error}") from self._error
        self.drain_once()
        return self.records()

    def records(self):
        import numpy as np
        with self._lock:
            return np.concatenate(self._chunks) if self._chunks else np.zeros(0, _dtype())


# ---------------------------------------------------------------------------- a timed run

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

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise TimingError(f"timing mode '{self.mode}' is not one of {', '.join(MODES)}")
        reads, writes = _ns_list(self.read_ns), _ns_list(self.write_ns)
        for name, values in (("read_ns", reads), ("write_ns", writes), ("baseline_ns", (self.baseline_ns,))):
            if not values or len(values) > MAX_PROFILES or any(v < 0 for v in values):
                raise TimingError(f"{name} must be 1 to {MAX_PROFILES} non-negative values, not {values}")
        if len(reads) > 1 and len(writes) > 1 and len(reads) != len(writes):
            raise TimingError(f"read_ns lists {len(reads)} profiles but write_ns {len(writes)}")


def ring_path(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / f"{name}.ring"


def plugin_args(plugin: Path, topo: Topology, run_dir: Path, config: TimingConfig, name: str = "guest") -> list[str]:
    """QEMU's plugin options for a VM named `name` in `run_dir`: -plugin (absolute path, mode,
    doorbell, ring, injected latencies) and -d plugin -D LOG (the plugin's JSON lines go to the
    log). Pure: a dry run prints these, a TimingSession boots with them."""
    opts = [qemu_opt(plugin), f"mode={config.mode}"]
    if config.doorbell:
        opts.append(f"doorbell={doorbell_hpa(topo):#x}")
    if config.mode == "trace":
        opts.append(f"ring={qemu_opt(ring_path(run_dir, name))}")
    if config.mode == "inject":
        opts += ["read_ns=" + ":".join(f"{v:g}" for v in _ns_list(config.read_ns)),
                 "write_ns=" + ":".join(f"{v:g}" for v in _ns_list(config.write_ns)),
                 f"baseline_ns={config.baseline_ns:g}"]
    log = Path(run_dir) / f"{name}.plugin.log"
    return ["-plugin", ",".join(opts), "-d", "plugin", "-D", str(log)]


class TimingSession:
    """The plugin, ring, log and drainer of one VM. qemu_args() goes into VM(extra_args=...)."""

    def __init__(self, topo: Topology, run_dir: Path, config: TimingConfig, name: str = "guest") -> None:
        self.config, self.topo, self.name = config, topo, name
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.plugin = build_plugin()
        self.log = self.run_dir / f"{name}.plugin.log"
        self.log.unlink(missing_ok=True)
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
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("{\"event\""):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass   # a line still being written
        return out

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


# ---------------------------------------------------------------------------- calibration

def guest_json(output: str, tool: str) -> dict:
    """The JSON line a guest tool printed."""
    prefix = f'{{"tool":"{tool}"'
    for line in output.splitlines():
        if line.startswith(prefix):
            return json.loads(line)
    raise TimingError(f"guest {tool} printed no JSON line:\n{output.strip()[-2000:]}")


# A dependent chase over 256 lines 8 KiB apart (2 MiB): it stays in QEMU's softmmu TLB, so what it
# measures is the CXL access path itself, one request per load.
CALIBRATION_COMMAND = "chase --lines 256 --span 2M --loads 30000"


def calibrate_baseline(vm, command: str = CALIBRATION_COMMAND, key: str = "ns_per_load",
                       runs: int = 5) -> dict:
    """The emulator's own cost per CXL request, as the guest's clock sees it: run a CXL workload
    in a VM booted with the plugin in count mode (no latency added) and take its per-access
    time (the median of `runs`). That is what inject mode subtracts (baseline_ns) before it
    spins, so that the guest sees the modelled latency rather than emulator + model. A
    modelled latency below it cannot be shown: the vCPU does not spin at all then."""
    tool = command.split()[0]
    values = []
    for _ in range(runs):
        result = vm.run(command, timeout=600)
        if result.status != 0:
            raise TimingError(f"calibration command failed ({result.status}): {command}\n{result.output}")
        values.append(float(guest_json(result.output, tool)[key]))
    return {"baseline_ns": sorted(values)[len(values) // 2], "runs": values, "command": command, "key": key}
