"""Trace-driven timing engine: runs an access trace (trace_format.RECORD_FIELDS records) through a
fabric_model.FabricModel and returns every access's latency plus per-queue bandwidth and
utilisation. Two solvers give identical results: the compiled kernel (fabric_kernel, C, the
default: one loop per access and stage, over 20 million accesses per CPU second for the PF
appliance without its cache, `python -m pfcxl.host_tools.experiments.fabric_engine`) and the numpy solver
(`kernel=False`, the engine before the kernel, kept for comparison and for models the kernel does
not take). Neither runs a Python loop per access.

Issue times. An access's instruction stamp times `ns_per_insn` is its issue time (independent
issue: the CPU never waits). With `dependent=True` every access of a vCPU (host, vcpu) waits for
the previous one to complete, then for the instructions in between (a pointer chase):
issue_i = stamp_i + sum of the latencies of that vCPU's earlier accesses. The kernel finds that
schedule in one pass, an event heap that issues each access when its predecessor completes (16
hosts x 20k chasing accesses settle on every model). The numpy solver iterates to a fixed point
(issue times -> latencies -> issue times) until it is exact: every round makes exact at least
everything up to the next queue collision between vCPUs, so many vCPUs chasing through shared
queues need about as many rounds as there are collisions in a row (it stops with an error after
`max_iterations`).

Queues. Each FIFO queue serves its arrivals in arrival order; ties go to the access issued first,
then to the earlier trace record (fabric_queues solves them).

Addresses. An access's pool offset is hpa - base_hpa; its module and the module's own offset
come from the one interleave decoder (address_map.interleave), as pool.where() computes them.

HBM cache (write-through, direct-mapped per module, one entry per line): an access's first line
picks the set; every access (read or write) installs its first line and line count there, in the
order accesses reach the module. A read hits when the last access to its set had the same first
line and covered at least as many lines; writes never hit (they always pay the DDR5 path). For
the plugin's one-line records this is an exact line-granular direct-mapped cache; longer synthetic
transfers are tracked by their first line only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from pfcxl.device.fabric import native as fabric_kernel
from pfcxl.device.topology.address_map import interleave
from pfcxl.device.fabric.model import PS_PER_NS, FabricModel, service_ps
from pfcxl.device.fabric.queues import HbmCache, serve_split
from pfcxl.device.trace.records import LINE, RECORD_FIELDS

CHUNK = 1 << 16         # accesses solved together: small enough to stay in the CPU caches
WORKERS = min(2, os.cpu_count() or 1)   # threads per stage (even and odd queues)


def trace_dtype() -> np.dtype:
    return np.dtype(RECORD_FIELDS)


@dataclass(frozen=True)
class StageStats:
    """Per-queue totals of one stage over the run's window (first issue to last completion)."""

    name: str
    bandwidth_mbs: int
    bytes: np.ndarray          # per queue
    busy_ps: np.ndarray        # per queue: sum of service times
    window_ps: int

    @property
    def utilisation(self) -> np.ndarray:
        return self.busy_ps / max(self.window_ps, 1)

    @property
    def achieved_gbs(self) -> np.ndarray:
        return self.bytes / max(self.window_ps, 1) * 1000.0      # bytes/ps = TB/s


@dataclass(frozen=True)
class EngineResult:
    latency_ps: np.ndarray     # per access, in trace order
    issue_ps: np.ndarray
    write: np.ndarray
    hit: np.ndarray            # read served by the HBM cache
    stages: dict[str, StageStats]
    window_ps: int
    iterations: int            # dependent issue: fixed-point rounds (1 when independent)
    phases_ps: np.ndarray | None = None   # (n, 3): T_req, T_mem, T_resp (+ jitter) as simulated

    @property
    def latency_ns(self) -> np.ndarray:
        return self.latency_ps / PS_PER_NS

    def _select(self, op: str | None) -> np.ndarray:
        if op is None:
            return self.latency_ps
        return self.latency_ps[self.write if op == "write" else ~self.write]

    def percentiles(self, op: str | None = None) -> dict[str, float]:
        """p50, p90, p99, p99.9, max and mean latency in ns, of reads, writes or all (op None)."""
        lat = self._select(op)
        if not len(lat):
            return {"count": 0}
        p = np.percentile(lat, [50, 90, 99, 99.9]) / PS_PER_NS
        return {"count": int(len(lat)), "p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2]),
                "p99.9": float(p[3]), "max": float(lat.max()) / PS_PER_NS,
                "mean": float(lat.mean()) / PS_PER_NS}

    def histogram(self, op: str | None = None, bin_ns: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(bin start in ns, count) for bins of `bin_ns`."""
        counts = np.bincount(self._select(op) // (bin_ns * PS_PER_NS))
        return np.arange(len(counts)) * bin_ns, counts

    def fraction_within(self, lo_ns: float, hi_ns: float, op: str | None = None) -> float:
        lat = self._select(op)
        return float(np.count_nonzero((lat >= lo_ns * PS_PER_NS) & (lat <= hi_ns * PS_PER_NS)) / max(len(lat), 1))


def _offsets(hpa: np.ndarray, base_hpa: int) -> np.ndarray:
    if len(hpa) and int(hpa.min()) < base_hpa:
        raise ValueError(f"an access at {int(hpa.min()):#x} lies below the appliance's base {base_hpa:#x}")
    return (hpa - np.uint64(base_hpa)).astype(np.int64)


def locate(hpa: np.ndarray, base_hpa: int, granularity: int, modules: int) -> tuple[np.ndarray, np.ndarray]:
    """(module, offset inside the module) of each address, as pool.where() interleaves them."""
    return interleave(_offsets(hpa, base_hpa), granularity, modules)


def _divmod(x: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """x // d, x % d for non-negative x; shifts and masks when d is a power of two."""
    if d & (d - 1) == 0:
        return x >> (d.bit_length() - 1), x & (d - 1)
    return np.divmod(x, d)


def draw_jitter(model: FabricModel, write: np.ndarray, seed: int, split=None) -> np.ndarray:
    """Per-access jitter (ps, int32), seeded: the k-th pair of reads (and of writes), in trace
    order, gets +v and -v with v uniform in 0..J ns (J by direction) and a random sign; an
    unpaired last access gets 0. Every direction's jitters are thus exactly symmetric, so a
    trace's idle median stays on the paper's figure. `split`: (reads, writes) indices if known.
    (The compiled kernel draws the same values from the same native.jitter_bits.)"""
    write = np.asarray(write, bool)
    jitter = np.zeros(len(write), np.int32)
    ir, iw = split if split is not None else (np.flatnonzero(~write), np.flatnonzero(write))
    for idx, (raw, j) in zip((ir, iw), fabric_kernel.jitter_bits(model, len(ir), len(iw), seed)):
        count = len(idx)
        x = (raw % (2 * (j + 1))).astype(np.int32)
        v = (x >> 1) * (1 - 2 * (x & 1)) * PS_PER_NS
        vals = np.empty(count, np.int32)
        vals[0::2] = v
        vals[1::2] = -v[:count // 2]
        if count % 2:
            vals[-1] = 0
        jitter[idx] = vals
    return jitter


@dataclass
class _Accesses:
    """Per-access inputs of the network, in trace order, in narrow types."""

    host: np.ndarray        # u16 (or i64 beyond 65536 queues)
    write: np.ndarray       # bool
    size: np.ndarray        # u32, at least 1
    module: np.ndarray      # like host
    stamp: np.ndarray       # i64 ps
    jitter: np.ndarray      # i32 ps
    cache: tuple | None     # (slot, key, bits, slots) for HbmCache
    reads: np.ndarray | None    # indices of the reads, of the writes (None for the kernel, which needs none)
    writes: np.ndarray | None

    def new_cache(self, order: np.ndarray | None, write: np.ndarray, bandwidth_mbs: int) -> HbmCache | None:
        """A cold cache over these accesses (reordered by `order`)."""
        if self.cache is None:
            return None
        slot, key, bits, slots = self.cache
        if order is not None:
            slot, key = slot[order], key[order]
        return HbmCache(slot, key, bits, slots, write, bandwidth_mbs)


def _prepare(model: FabricModel, trace: np.ndarray, ns_per_insn: float, base_hpa: int, granularity: int,
             seed: int, chunk: int, kernel: bool = False) -> _Accesses:
    """Decode the trace: whole-array passes where they need no temporaries, a chunk at a time
    otherwise (trace-sized temporaries cost more in page faults than in arithmetic). Queue
    numbers are u16 for numpy's radix sorts, int32 for the kernel (which decodes in C)."""
    n = len(trace)
    if kernel:                                              # one pass in C, int32 queue numbers
        host, module, size, write, stamp, top = fabric_kernel.decode(trace, ns_per_insn * PS_PER_NS, base_hpa,
                                                                     granularity, model.modules)
        if top < 0:
            _offsets(trace["hpa"], base_hpa)                # names the address
    else:
        small = np.uint16 if model.hosts * model.modules < 1 << 16 else np.int64
        host = np.array(trace["host"], dtype=small)
        top = int(host.max()) if n else 0
        write = trace["write"] != 0
        size = np.maximum(trace["size"], np.uint32(1))
        stamp = _stamps(trace["insn"], ns_per_insn * PS_PER_NS)
        module = np.empty(n, small)
    if top >= model.hosts:
        raise ValueError(f"host {top} in the trace; {model.name} has {model.hosts} hosts")
    jittery = bool(model.jitter_read_ns or model.jitter_write_ns)
    if kernel:                                              # the kernel needs no index lists
        ir = iw = None
        jitter = fabric_kernel.jitter(model, write, seed) if jittery else np.zeros(n, np.int32)
    else:
        ir, iw = np.flatnonzero(~write), np.flatnonzero(write)
        jitter = draw_jitter(model, write, seed, (ir, iw)) if jittery else np.zeros(n, np.int32)
    lines = model.cache_lines
    slot: np.ndarray | None = None
    key: np.ndarray | None = None
    slots = model.modules * lines
    if lines and n:
        bits = ((LINE - 1 + int(size.max()) + LINE - 1) // LINE).bit_length()
        span = int(trace["hpa"].max()) - base_hpa
        wide = ((span // granularity // model.modules + 1) * granularity // LINE // lines + 1).bit_length() + bits
        if wide > 62:
            raise ValueError("cache tags and line counts too wide to pack")
        key = np.empty(n, np.int16 if wide <= 14 else np.int32 if wide <= 30 else np.int64)
        slot = np.empty(n, np.uint32 if slots <= 1 << 26 else np.int64)
    for lo in range(0, n if slot is not None or not kernel else 0, chunk):
        sl = slice(lo, min(lo + chunk, n))
        m, moff = locate(trace["hpa"][sl], base_hpa, granularity, model.modules)
        module[sl] = m
        if slot is not None and key is not None:
            first, within = _divmod(moff, LINE)
            tag, line_set = _divmod(first, lines)
            slot[sl] = m.astype(np.int64) * lines + line_set
            key[sl] = tag << bits | (within + size[sl] + LINE - 1) // LINE
    cache = None
    if slot is not None:
        if slots > 1 << 26:                                 # too many to hold: number the used ones
            slot = np.unique(slot, return_inverse=True)[1].astype(np.uint32)
            slots = int(slot.max()) + 1
        cache = (slot, key, bits, slots)
    return _Accesses(host, write, size, module, stamp, jitter, cache, ir, iw)


def _stamps(insn: np.ndarray, factor: float) -> np.ndarray:
    """Instruction stamps -> picoseconds (rounded to nearest), exactly when `factor` is whole."""
    if factor == int(factor) and (not len(insn) or int(insn.max()) < (1 << 62) // max(int(factor), 1)):
        out = insn.astype(np.int64)
        out *= int(factor)
        return out
    return np.rint(insn.astype(np.float64) * factor).astype(np.int64)


def _network(model: FabricModel, acc: _Accesses, issue: np.ndarray, phases: bool, chunk: int, workers: int):
    """One pass through the queueing network. Returns complete, hit, phases, per-stage (bytes, busy)."""
    n = len(issue)
    srt = _issue_order(issue)
    host, write, size, module, jitter = acc.host, acc.write, acc.size, acc.module, acc.jitter
    if srt is not None:                                     # work in issue order; ties keep trace order
        issue, host, write, size, module, jitter = (x[srt] for x in (issue, host, write, size, module, jitter))
    cache = acc.new_cache(srt, write, model.cache_bandwidth_mbs)
    small = host.dtype.type
    keys = {"host": lambda i: host if i is None else host[i],
            "module": lambda i: module if i is None else module[i],
            "path": lambda i: (host * small(model.modules) + module if i is None
                               else host[i] * small(model.modules) + module[i]),
            "group": lambda i: (host if i is None else host[i]) // small(model.hosts_per_group)}
    iw, ir = (acc.writes, acc.reads) if srt is None else (np.flatnonzero(write), np.flatnonzero(~write))
    req_w, mem_w, resp_w = model.fixed_ps(True)
    req_r, mem_r, resp_r = model.fixed_ps(False)
    mem_hit = model.fixed_ps(False, hit=True)[1] if cache is not None else mem_r
    totals = {}

    def run_stages(stages, idx, t):
        sz = size[idx]
        for st in stages:
            t, nbytes, busy = serve_split(t, keys[st.key](idx), model.queues(st), sz, st.bandwidth_mbs,
                                          chunk=chunk, workers=workers)
            totals[st.name] = (nbytes, busy)
        return t

    # requests (write payloads) to the memory
    t = run_stages(model.write_stages, iw, issue[iw])
    t += req_w
    arrive = issue + req_r
    arrive[iw] = t
    at_memory = arrive.copy() if phases else None
    # the memory, with its cache: `arrive` becomes the time the memory's queue is left
    done, nbytes, busy = serve_split(arrive, keys[model.memory.key](None), model.queues(model.memory), size,
                                     model.memory.bandwidth_mbs, cache=cache, chunk=chunk,
                                     workers=workers if cache is None or model.memory.key == "module" else 1)
    totals[model.memory.name] = (nbytes, busy)
    hit = cache.hit if cache is not None else np.zeros(n, bool)
    # responses (read payloads) back to the hosts, after the rest of T_mem (DDR5 or HBM3E)
    t = done[ir]
    t += mem_r
    if cache is not None:
        t[hit[ir]] += mem_hit - mem_r
    mem_done = None
    if phases:
        mem_done = done + mem_w
        mem_done[ir] = t
    t = run_stages(model.read_stages, ir, t)
    t += resp_r - mem_w - resp_w
    complete = done
    complete[ir] = t
    complete += mem_w + resp_w
    complete += jitter
    ph = (np.stack([at_memory - issue, mem_done - at_memory, complete - mem_done], axis=1)
          if at_memory is not None and mem_done is not None else None)   # both made when phases
    return (*_trace_order(srt, complete, hit, ph), totals)


def _chains(acc: _Accesses, trace: np.ndarray, chains: np.ndarray | None) -> np.ndarray:
    """Each access's dependency chain: its (host, vcpu) unless the caller numbered them."""
    if chains is None:
        return acc.host.astype(np.int64) * 256 + trace["vcpu"]
    if len(chains) != len(trace):
        raise ValueError(f"{len(chains)} chain numbers for {len(trace)} accesses")
    return np.asarray(chains, np.int64)


def _issue_order(issue: np.ndarray) -> np.ndarray | None:
    """The permutation that puts accesses in issue order (ties keep trace order); None if they are."""
    return None if len(issue) < 2 or bool(np.all(issue[1:] >= issue[:-1])) else np.argsort(issue, kind="stable")


def _trace_order(srt: np.ndarray | None, complete, hit, ph):
    """complete, hit and phases (or None) back from issue order to trace order."""
    if srt is None:
        return complete, hit, ph
    back = np.empty_like(srt)
    back[srt] = np.arange(len(srt))
    return complete[back], hit[back], None if ph is None else ph[back]


def _idle_latency(model: FabricModel, write, size, jitter) -> np.ndarray:
    """Latency of each access alone in the network (no waiting), the dependent iteration's start."""
    lat = np.where(write, sum(model.fixed_ps(True)), sum(model.fixed_ps(False))) + jitter
    lat += service_ps(size, model.memory.bandwidth_mbs)
    for st in model.write_stages:
        lat[write] += service_ps(size[write], st.bandwidth_mbs)
    for st in model.read_stages:
        lat[~write] += service_ps(size[~write], st.bandwidth_mbs)
    return lat


def _kernel_network(model: FabricModel, acc: _Accesses, issue: np.ndarray, phases: bool):
    """_network() in the compiled kernel: the same results."""
    srt = _issue_order(issue)
    cols = [issue, acc.host, acc.module, acc.size, acc.write, acc.jitter]
    cache = acc.cache
    if srt is not None:                                     # number accesses in issue order
        cols = [x[srt] for x in cols]
        cache = cache if cache is None else (cache[0][srt], cache[1][srt], *cache[2:])
    issue_, host, module, size, write, jitter = cols
    complete, hit, totals, ph = fabric_kernel.network(model, issue_, host, module, size, write, jitter, cache, phases)
    if phases:
        at_memory, mem_done = ph
        ph = np.stack([at_memory - cols[0], mem_done - at_memory, complete - mem_done], axis=1)
    return (*_trace_order(srt, complete, hit, ph), totals)


def run(model: FabricModel, trace: np.ndarray, *, ns_per_insn: float = 1.0, dependent: bool = False,
        base_hpa: int = 0, granularity: int = 4096, seed: int = 0, phases: bool = False,
        max_iterations: int = 200, chunk: int = CHUNK, workers: int = WORKERS, kernel: bool = True,
        chains: np.ndarray | None = None) -> EngineResult:
    """Time every access of `trace` on `model`. See the module docstring for the rules. `chains`
    (dependent issue only): each access's chain number, instead of its (host, vcpu); an access
    alone in its chain issues at its stamp, so one trace can hold a pointer chase and independent
    traffic beside it (host_tools/bench/model.py). `chunk`
    (accesses solved together, for cache locality) and `workers` (threads per stage) change the
    speed, never the result. `kernel` (default) solves in the compiled kernel (fabric_kernel);
    False runs the numpy solver, the same results more slowly (dependent issue by iteration)."""
    kernel = kernel and fabric_kernel.usable(model, len(trace))
    acc = _prepare(model, trace, ns_per_insn, base_hpa, granularity, seed, chunk, kernel)
    n, stamp, write = len(trace), acc.stamp, acc.write
    args = (phases, chunk, workers)
    if kernel:
        rounds = 1
        if not dependent:
            issue = stamp
            complete, hit, ph, totals = _kernel_network(model, acc, issue, phases)
        else:
            vcpu = _chains(acc, trace, chains)
            issue, complete, hit, totals = fabric_kernel.chase(model, stamp, vcpu, acc.host, acc.module, acc.size,
                                                               write, acc.jitter, acc.cache)
            if phases:                                      # the schedule is known: time its phases
                complete, hit, ph, totals = _kernel_network(model, acc, issue, phases)
            else:
                ph = None
    elif not dependent:
        issue, rounds = stamp, 1
        complete, hit, ph, totals = _network(model, acc, issue, *args)
    else:
        vcpu = _chains(acc, trace, chains)
        chain = np.lexsort((np.arange(n), stamp, vcpu))          # each vCPU's accesses in order
        first = np.r_[True, vcpu[chain][1:] != vcpu[chain][:-1]] if n else np.zeros(0, bool)
        lat = _idle_latency(model, write, acc.size, acc.jitter)
        for rounds in range(1, max_iterations + 1):
            csum = np.cumsum(lat[chain])
            before = csum - lat[chain]                            # this vCPU's earlier latencies
            before -= np.maximum.accumulate(np.where(first, before, 0))
            issue = np.empty(n, np.int64)
            issue[chain] = stamp[chain] + before
            complete, hit, ph, totals = _network(model, acc, issue, *args)
            new = complete - issue
            if np.array_equal(new, lat):
                break
            lat = new
        else:
            raise RuntimeError(f"dependent issue did not settle in {max_iterations} rounds: too many "
                               "collisions between chasing vCPUs; shorten the trace or raise max_iterations")
    window = int(complete.max() - issue.min()) if n else 0
    stages = {st.name: StageStats(st.name, st.bandwidth_mbs, totals[st.name][0], totals[st.name][1], window) for st in model.stages}
    complete -= issue                                       # the latencies, in place: no new pages
    return EngineResult(complete, issue, write, hit, stages, window, rounds, ph)
