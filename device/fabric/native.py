"""The fabric engine's compiled kernel (device/kernel/fabric_network.c), built with gcc into the
cache like the TCG plugin and loaded with ctypes. It serves a FabricModel's queueing network with
the same rules as the numpy solver (fabric_queues) at one C loop per access and stage, and solves
dependent issue in one pass over an event heap instead of by fixed-point iteration.

Memory. A run of N accesses allocates about 40 N bytes of arrays (decoded columns, jitter, issue and
completion times); glibc serves blocks that large with fresh mmap()s, which the OS zeroes page by
page on first touch: with 10 million accesses that was as much system time as the kernel's own
work. Loading the kernel therefore asks glibc (mallopt) to serve blocks up to 1 GiB from its heap
and to keep up to 1 GiB of freed heap, so a process that runs the engine again (the bench: every
row on every system; a curve: every load) reuses the pages its last run touched. Only where the
memory comes from changes, never a result; elsewhere than glibc the settings are skipped.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from pfcxl.device.fabric.model import FabricModel

KERNEL = Path(__file__).resolve().parent.parent / "kernel" / "fabric_network.c"
CFLAGS = ("-shared", "-fPIC", "-O3", "-Wall", "-Wextra", "-Werror", "-fvisibility=default")
_KEYS = {"host": 0, "module": 1, "path": 2, "group": 3}
_I64 = ctypes.POINTER(ctypes.c_int64)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3         # glibc's <malloc.h>
REUSE_BYTES = 1 << 30


class _Stage(ctypes.Structure):
    _fields_ = [("bandwidth_mbs", ctypes.c_int64), ("key", ctypes.c_int32), ("side", ctypes.c_int32),
                ("queues", ctypes.c_int32), ("pad", ctypes.c_int32), ("bytes", _I64), ("busy", _I64),
                ("table", _I64)]


class _Model(ctypes.Structure):
    _fields_ = [("nstages", ctypes.c_int32), ("modules", ctypes.c_int32), ("hosts_per_group", ctypes.c_int32),
                ("cache_bits", ctypes.c_int32), ("stages", ctypes.POINTER(_Stage)),
                *((name, ctypes.c_int64) for name in
                  ("req_w", "mem_w", "resp_w", "req_r", "mem_r", "resp_r", "mem_hit", "hit_bandwidth_mbs")),
                ("cache_state", _I64)]


def reuse_freed_memory() -> bool:
    """glibc: serve blocks up to REUSE_BYTES from the heap and keep that much freed (see above).
    False where the C library has no mallopt or refuses."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, REUSE_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, REUSE_BYTES))


@functools.cache
def library() -> ctypes.CDLL:
    """The kernel, compiled on first use (cached by the hash of its source and flags)."""
    reuse_freed_memory()
    from pfcxl import cache
    from pfcxl.compile import compile_cached
    so = compile_cached(KERNEL, [KERNEL], CFLAGS, cache.cache_dir() / "engine", "fabric_network", ".so")
    lib = ctypes.CDLL(str(so))
    for fn in (lib.network, lib.chase, lib.jitter):
        fn.restype = ctypes.c_int
    lib.decode.restype = ctypes.c_int64
    return lib


def usable(model: FabricModel, accesses: int) -> bool:
    """The kernel keeps one cache order per memory queue, so a cache needs the modules as queues;
    it numbers accesses in 32 bits."""
    return (not model.cache_lines or model.memory.key == "module") and accesses < 1 << 31


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


class _Packed:
    """A model and its per-queue totals as the kernel reads and fills them."""

    def __init__(self, model: FabricModel, cache: tuple | None) -> None:
        sides = [(st, 0) for st in model.write_stages] + [(model.memory, 1)] + [(st, 2) for st in model.read_stages]
        self.totals = {st.name: (np.zeros(model.queues(st), np.int64), np.zeros(model.queues(st), np.int64))
                       for st, _ in sides}
        self.stages = (_Stage * len(sides))(*(
            _Stage(st.bandwidth_mbs, _KEYS[st.key], side, model.queues(st), 0,
                   self.totals[st.name][0].ctypes.data_as(_I64), self.totals[st.name][1].ctypes.data_as(_I64))
            for st, side in sides))
        (req_w, mem_w, resp_w), (req_r, mem_r, resp_r) = model.fixed_ps(True), model.fixed_ps(False)
        cached = cache is not None
        self.state = np.full(cache[3] if cache is not None else 1, -1, np.int64)
        self.model = _Model(len(sides), model.modules, model.hosts_per_group, cache[2] if cache is not None else 0,
                            self.stages, req_w, mem_w, resp_w, req_r, mem_r, resp_r,
                            model.fixed_ps(False, hit=True)[1] if cached else mem_r,
                            model.cache_bandwidth_mbs if cached else 0, self.state.ctypes.data_as(_I64))
        self.lasts = np.full(sum(model.queues(st) for st, _ in sides), np.iinfo(np.int64).min // 4, np.int64)


def _inputs(host, module, size, write, jitter, cache):
    size = np.ascontiguousarray(size)
    arrays = [np.ascontiguousarray(host, np.int32), np.ascontiguousarray(module, np.int32),
              size.view(np.int32) if size.dtype == np.uint32 else size.astype(np.int32),
              np.ascontiguousarray(write).view(np.uint8), np.ascontiguousarray(jitter, np.int32)]
    if cache is not None:
        arrays += [np.ascontiguousarray(cache[0], np.int64), np.ascontiguousarray(cache[1], np.int64)]
    else:
        arrays += [np.zeros(1, np.int64)] * 2
    return arrays


def network(model: FabricModel, issue, host, module, size, write, jitter, cache: tuple | None, phases: bool):
    """Independent issue over accesses numbered in issue order (ties already by trace order).
    `cache`: (slot, key, bits, slots) in that order. Returns complete, hit, per-stage
    (bytes, busy), and (at_memory, mem_done) or None."""
    n = len(issue)
    packed = _Packed(model, cache)
    issue = np.ascontiguousarray(issue, np.int64)
    arrays = _inputs(host, module, size, write, jitter, cache)
    complete, hit = np.empty(n, np.int64), np.zeros(n, np.uint8)
    at_memory, mem_done = (np.empty(n, np.int64), np.empty(n, np.int64)) if phases else (None, None)
    rc = library().network(ctypes.byref(packed.model), ctypes.c_int64(n), _ptr(issue), *map(_ptr, arrays),
                            _ptr(complete), _ptr(hit), None if at_memory is None else _ptr(at_memory),
                            None if mem_done is None else _ptr(mem_done))
    if rc:
        raise MemoryError("the fabric kernel ran out of memory")
    return complete, hit.view(bool), packed.totals, (at_memory, mem_done) if phases else None


def chase(model: FabricModel, stamp, vcpu, host, module, size, write, jitter, cache: tuple | None):
    """Dependent issue in trace order: every vCPU's access issues when its previous one completes,
    plus the instructions in between. Returns issue, complete, hit and per-stage (bytes, busy)."""
    n = len(stamp)
    chain = np.lexsort((np.arange(n), stamp, vcpu))         # each vCPU's accesses in order
    head = np.ones(n, np.uint8)
    nxt = np.full(n, -1, np.int64)
    if n:
        same = vcpu[chain][1:] == vcpu[chain][:-1]
        nxt[chain[:-1][same]] = chain[1:][same]
        head[chain[1:][same]] = 0
    packed = _Packed(model, cache)
    stamp = np.ascontiguousarray(stamp, np.int64)
    arrays = _inputs(host, module, size, write, jitter, cache)
    issue, complete, hit = np.empty(n, np.int64), np.empty(n, np.int64), np.zeros(n, np.uint8)
    rc = library().chase(ctypes.byref(packed.model), ctypes.c_int64(n), _ptr(stamp), _ptr(nxt), _ptr(head),
                          *map(_ptr, arrays), _ptr(packed.lasts), _ptr(issue), _ptr(complete), _ptr(hit))
    if rc:
        raise MemoryError("the fabric kernel ran out of memory")
    return issue, complete, hit.view(bool), packed.totals


def jitter_bits(model: FabricModel, reads: int, writes: int, seed: int) -> list[tuple[np.ndarray, int]]:
    """The random draws behind draw_jitter: per direction (reads, then writes), 16 random bits per
    pair of accesses and the direction's J (ns)."""
    rng = np.random.default_rng(seed)
    out = []
    for count, j in ((reads, model.jitter_read_ns), (writes, model.jitter_write_ns)):
        pairs = (count + 1) // 2
        out.append((rng.bit_generator.random_raw(pairs // 4 + 1).view(np.uint16)[:pairs], j))
    return out


def jitter(model: FabricModel, write: np.ndarray, seed: int) -> np.ndarray:
    """fabric_engine.draw_jitter's values, from the same random bits, in one pass."""
    write = np.ascontiguousarray(write).view(np.uint8)
    writes = int(np.count_nonzero(write))
    (raw_r, j_r), (raw_w, j_w) = jitter_bits(model, len(write) - writes, writes, seed)
    out = np.empty(len(write), np.int32)
    library().jitter(ctypes.c_int64(len(write)), _ptr(write), _ptr(raw_r), _ptr(raw_w), ctypes.c_int32(j_r),
                      ctypes.c_int32(j_w), ctypes.c_int64(writes), _ptr(out))
    return out


def decode(trace: np.ndarray, ns_per_insn_ps: float, base_hpa: int, granularity: int, modules: int):
    """host, module, size, write and issue stamp (ps) of every record, as fabric_engine._prepare
    computes them, in one pass. Returns them and the largest host (-1: an address below the base)."""
    n = len(trace)
    trace = np.ascontiguousarray(trace)
    if trace.dtype.itemsize != 24:
        raise ValueError(f"trace records are {trace.dtype.itemsize} bytes, not 24")
    host, module, size = np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.int32)
    write, stamp, most = np.empty(n, np.uint8), np.empty(n, np.int64), ctypes.c_uint64()
    whole = int(ns_per_insn_ps) if ns_per_insn_ps == int(ns_per_insn_ps) else 0
    top = library().decode(ctypes.c_int64(n), _ptr(trace), ctypes.c_uint64(base_hpa), ctypes.c_int64(granularity),
                            ctypes.c_int32(modules), ctypes.c_int64(whole), ctypes.c_double(ns_per_insn_ps),
                            _ptr(host), _ptr(module), _ptr(size), _ptr(write), _ptr(stamp), ctypes.byref(most))
    if whole and most.value >= (1 << 62) // max(whole, 1):        # would overflow: in floating point
        stamp = np.rint(trace["insn"].astype(np.float64) * ns_per_insn_ps).astype(np.int64)
    return host, module, size.view(np.uint32), write.view(bool), stamp, int(top)
