"""The timeline file that keeps several timed hosts in one virtual timeline (--clock virtual on an
appliance). Each host's TCG plugin maps it and runs in quanta (device/plugin/pfcxl_timeline.h
says how); this side creates it, says how many hosts to wait for, and reads its telemetry.
The ctypes structures mirror struct tl_file (device/plugin/pfcxl_timeline_file.h) field for field;
the plugin refuses a file of any other size.

    timeline.create(path, quantum_ns=1000, expected=2)
    timeline.read(path)       # {"virtual_ns": ..., "quantum_ns": ..., "hosts": [...], ...}
"""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

from pfcxl.errors import PfcxlError

MAGIC = 0x31304C5458434650          # "PFCXLT01" little endian
VERSION = 1
HOSTS = 16
REQS = 16384
QUEUES = 256
STAGES = 2 * 4 + 1                  # the plugin's VT_MAX_STAGES write and read stages, and the memory
DEFAULT_QUANTUM_NS = 1000
# the quantum's bounds: below 100 ns a barrier comes every few requests; above 100 us one quantum's
# requests of a streaming host overflow the plugin's TL_REQS (16,384 a quantum at 6.5 ns each)
MIN_QUANTUM_NS, MAX_QUANTUM_NS = 100, 100_000
DEFAULT_JOIN_TIMEOUT_S = 60      # host seconds a round waits for its hosts to join
STATES = ("free", "in", "left", "gone")


class _Req(ctypes.Structure):
    _fields_ = [("t_ps", ctypes.c_uint32), ("local_ps", ctypes.c_uint32), ("module", ctypes.c_uint16),
                ("write", ctypes.c_uint8), ("hit", ctypes.c_uint8), ("stalls", ctypes.c_uint8),
                ("pad", ctypes.c_uint8 * 3)]


class _Slot(ctypes.Structure):
    _fields_ = [("state", ctypes.c_uint32), ("pid", ctypes.c_uint32),
                *((name, ctypes.c_uint64) for name in (
                    "arrived", "n_reqs", "charge_ps", "time_ps", "quanta", "requests", "overflow",
                    "contention_ps", "wait_ns", "joined_epoch", "left_epoch", "spent_ps")),
                ("pad", ctypes.c_uint64 * 2)]


class _Head(ctypes.Structure):
    """struct tl_file less its request buffers."""
    _fields_ = [("magic", ctypes.c_uint64), ("version", ctypes.c_uint32), ("expected", ctypes.c_uint32),
                ("quantum_ps", ctypes.c_uint64), ("join_timeout_ms", ctypes.c_uint64), ("digest", ctypes.c_uint64),
                ("lock", ctypes.c_uint32), ("lock_pid", ctypes.c_uint32),
                ("started", ctypes.c_uint32), ("epoch_word", ctypes.c_uint32),
                ("epoch", ctypes.c_uint64), ("merged", ctypes.c_uint64), ("leader_ns", ctypes.c_uint64),
                ("gone", ctypes.c_uint64),
                ("free_ps", (ctypes.c_uint64 * QUEUES) * STAGES),
                ("slots", _Slot * HOSTS)]


class _File(_Head):
    _fields_ = [("reqs", (_Req * REQS) * HOSTS)]


SIZE = ctypes.sizeof(_File)


FILE = "timeline"


def path_in(run_dir: Path) -> Path:
    """Where an appliance's run directory keeps its timeline (pfcxl appliance start --clock virtual)."""
    return Path(run_dir) / FILE


def check_quantum(quantum_ns: object) -> int:
    """The quantum in ns, or one line saying why it is refused."""
    if isinstance(quantum_ns, bool) or not isinstance(quantum_ns, int) or not MIN_QUANTUM_NS <= quantum_ns <= MAX_QUANTUM_NS:
        raise PfcxlError(f"quantum {quantum_ns!r}: the timeline's quantum is a whole number of ns of virtual time "
                         f"from {MIN_QUANTUM_NS} to {MAX_QUANTUM_NS:,} (default {DEFAULT_QUANTUM_NS})")
    return quantum_ns


def create(path: Path, quantum_ns: int = DEFAULT_QUANTUM_NS, expected: int = 1,
           join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S) -> Path:
    """A new timeline at `path` (replacing one there): hosts start at time 0 once `expected` have joined."""
    check_quantum(quantum_ns)
    if not 1 <= expected <= HOSTS:
        raise PfcxlError(f"{expected} hosts: a timeline holds 1 to {HOSTS}")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as out:
            out.truncate(SIZE)          # sparse: the request buffers are touched only as hosts fill them
            head = _File(magic=MAGIC, version=VERSION, expected=expected, quantum_ps=quantum_ns * 1000,
                         join_timeout_ms=int(join_timeout_s * 1000))
            out.write(bytes(head)[:_File.free_ps.offset])
        os.replace(tmp, path)           # whole or not at all: a plugin never maps a half-written header
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _mapped(path: Path) -> tuple[mmap.mmap, _Head]:
    """The file mapped, and a copy of its header (nothing of the mapping stays exported)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise PfcxlError(f"timeline {path}: {exc.strerror}") from None
    try:
        if os.fstat(fd).st_size != SIZE:
            raise PfcxlError(f"timeline {path}: {os.fstat(fd).st_size} bytes, not a timeline ({SIZE})")
        m = mmap.mmap(fd, SIZE)
    finally:
        os.close(fd)
    f = _Head.from_buffer_copy(m)
    if f.magic != MAGIC or f.version != VERSION:
        m.close()
        raise PfcxlError(f"timeline {path}: not a version {VERSION} pfcxl timeline")
    return m, f


def expect(path: Path, hosts: int) -> None:
    """The next round starts once `hosts` hosts have joined it (between rounds only)."""
    if not 1 <= hosts <= HOSTS:
        raise PfcxlError(f"{hosts} hosts: a timeline holds 1 to {HOSTS}")
    m, f = _mapped(Path(path))
    try:
        if f.started:
            raise PfcxlError(f"timeline {path}: a round is under way (hosts are in it): the hosts the next "
                             "one waits for can be set once it ends")
        m[_Head.expected.offset:_Head.expected.offset + 4] = hosts.to_bytes(4, "little")
    finally:
        m.close()


def read(path: Path) -> dict:
    """The timeline's state: the virtual time it has reached, the quantum, and per host its state,
    lag behind the timeline, the host time it waited at barriers and its contention charge."""
    m, f = _mapped(Path(path))
    try:
        quantum_ns = f.quantum_ps / 1000
        now_ns = f.epoch * quantum_ns
        hosts = []
        for h, s in enumerate(f.slots):
            if s.state == 0 and not s.quanta:
                continue
            hosts.append({"host": h, "state": STATES[s.state] if s.state < len(STATES) else str(s.state),
                          "pid": s.pid, "virtual_ns": s.time_ps / 1000, "lag_ns": max(0.0, now_ns - s.time_ps / 1000),
                          "quanta": s.quanta, "requests": s.requests, "overflow": s.overflow,
                          "contention_ns": s.contention_ps / 1000, "wait_s": s.wait_ns / 1e9,
                          "joined_quantum": s.joined_epoch,
                          "left_quantum": s.left_epoch if s.state in (STATES.index("left"), STATES.index("gone")) else None})
        return {"quantum_ns": quantum_ns, "expected": f.expected, "started": bool(f.started),
                "virtual_ns": now_ns, "quanta": f.epoch, "merged_requests": f.merged,
                "merge_s": f.leader_ns / 1e9, "gone": [h["host"] for h in hosts if h["state"] == "gone"],
                "hosts": hosts}
    finally:
        m.close()
