"""The fabric engine's kernels: FIFO queues and the HBM cache solved over numpy arrays, a batch of
accesses at a time (for cache locality), with no Python loop per access.

FIFO. A queue serves its arrivals in arrival order, ties to the lower access index (the engine
numbers accesses by issue time, then trace position). For one queue, departure
d_i = max(a_i, d_{i-1}) + s_i, i.e. d_i = S_i + max_{j<=i}(a_j - S_{j-1}) with S the running sum of
service times: a cumulative max. In a batch, all queues are solved at once: accesses are grouped by
queue (stable radix sort over arrival order) and each group is lifted above the previous one by a
constant so that one running max cannot cross groups; a queue's last departure carries into the
next batch.

Batches. They follow index order; an access is deferred to a later batch while some access with a
higher index arrives earlier, so every queue still sees its arrivals in order. Traces far from
issue order fall back to one sort by arrival time.

Threads. Queues never interact, so serve_split() solves the even and the odd queues of a stage in
two threads (numpy releases the GIL in its loops); the result is the same as in one.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pfcxl.device.fabric.model import service_ps

_LOW = np.iinfo(np.int64).min // 4      # "never busy" for a queue's last departure


def stable_order(key: np.ndarray) -> np.ndarray:
    """Stable argsort of non-negative integer keys: radix passes of 16 bits when they fit in 32."""
    if key.dtype == np.uint16:
        return np.argsort(key, kind="stable")
    top = int(key.max()) if len(key) else 0
    if top < 1 << 16:
        return np.argsort(key.astype(np.uint16), kind="stable")
    if top < 1 << 32:
        low = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")
        return low[np.argsort((key[low] >> 16).astype(np.uint16), kind="stable")]
    return np.argsort(key, kind="stable")


def batches(arrive: np.ndarray, chunk: int):
    """Index arrays (ascending) such that every access of a batch arrives no later than any
    access of a later batch (equal arrivals: lower index first)."""
    n = len(arrive)
    if n <= chunk:
        yield np.arange(n)
        return
    ends = np.arange(chunk, n, chunk)
    floor = np.minimum.accumulate(np.minimum.reduceat(arrive, ends)[::-1])[::-1]   # min of arrive[end:]
    pending = np.empty(0, np.int64)
    for k, start in enumerate(range(0, n, chunk)):
        end = min(start + chunk, n)
        cand = np.concatenate([pending, np.arange(start, end)])
        if end == n:
            yield cand
            return
        ok = arrive[cand] <= floor[k]
        yield cand[ok]
        pending = cand[~ok]
        if len(pending) > 4 * chunk:                       # far from index order: sort the rest
            rest = np.concatenate([pending, np.arange(end, n)])
            rest = rest[np.argsort(arrive[rest], kind="stable")]
            for c in range(0, len(rest), chunk):
                yield rest[c:c + chunk]
            return


class HbmCache:
    """Per-module direct-mapped, write-through cache: per set, the last access's first-line tag and
    line count packed as tag << bits | count (see fabric_engine for the rule). `slot` (< 2**32) and
    `key` are per access; `write` accesses install their line but never hit."""

    def __init__(self, slot: np.ndarray, key: np.ndarray, bits: int, slots: int, write: np.ndarray,
                 bandwidth_mbs: int) -> None:
        self.slot, self.key, self.bits, self.write = slot, key, bits, write
        self.low, self.high = (slot & 0xFFFF).astype(np.uint16), (slot >> 16).astype(np.uint16)
        self.bandwidth_mbs = bandwidth_mbs
        self.state = np.full(slots, -1, key.dtype)
        self.hit = np.zeros(len(write), bool)

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        """Decide and record the hits of accesses `idx`, given in service order."""
        g = np.argsort(self.low[idx], kind="stable")        # by set: two radix passes
        g = g[np.argsort(self.high[idx[g]], kind="stable")]
        ig = idx[g]
        sg, key, read = self.slot[ig], self.key[ig], ~self.write[ig]
        new = np.empty(len(g), bool)
        new[0] = True
        np.not_equal(sg[1:], sg[:-1], out=new[1:])
        prev = np.empty_like(key)
        prev[0] = -1
        prev[1:] = key[:-1]
        ask = new & read                                    # reads first of their set here
        prev[ask] = self.state[sg[ask]]                     # ... look at the state
        end = np.empty_like(new)
        end[-1] = True
        end[:-1] = new[1:]
        self.state[sg[end]] = key[end]                      # every access installs its line
        d = prev - key                                      # same tag and at least as many lines
        hit = np.empty(len(g), bool)
        hit[g] = (d >= 0) & (d < (1 << self.bits) - (key & ((1 << self.bits) - 1))) & read
        self.hit[idx] = hit
        return hit


def serve(arrive: np.ndarray, queue: np.ndarray, n_queues: int, size: np.ndarray, bandwidth_mbs: int, *,
          cache: HbmCache | None = None, chunk: int = 1 << 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FIFO queues `queue` (ids < n_queues) serving `size` bytes each at `bandwidth_mbs`, or at the
    cache's bandwidth for the accesses `cache` reports as hits. Overwrites `arrive` with each
    access's departure and returns it with the bytes and busy time (ps) per queue."""
    last = np.full(n_queues, _LOW)                          # each queue's last departure so far
    nbytes, busy = np.zeros(n_queues, np.int64), np.zeros(n_queues, np.int64)
    top = int(size.max()) if len(size) else 0
    table = service_ps(np.arange(top + 1), bandwidth_mbs) if top <= 1 << 20 else None
    hit_table = (service_ps(np.arange(top + 1), cache.bandwidth_mbs)
                 if cache is not None and table is not None else None)
    unordered = False
    for now in batches(arrive, chunk):
        if not len(now):
            continue
        q, an = queue[now], arrive[now]
        g = stable_order(q)                                 # by queue, index order inside
        a, qg = an[g], q[g]
        if unordered or np.any((a[1:] < a[:-1]) & (qg[1:] == qg[:-1])):   # a queue out of time order
            unordered = True                                # (then expect it of the next batches too)
            base = int(a.min())
            if int(a.max()) - base < 1 << 40:               # one sort of a nearly sorted key
                g = g[np.argsort(qg.astype(np.int64) << 40 | (a - base), kind="stable")]
            else:
                g = g[np.lexsort((a, qg))]
            a, qg = an[g], q[g]
        idx = now[g]
        sz = size[idx]
        s = table[sz] if table is not None else service_ps(sz, bandwidth_mbs)
        if cache is not None:
            hit = cache(idx)
            if hit.any():
                s[hit] = hit_table[sz[hit]] if hit_table is not None else service_ps(sz[hit], cache.bandwidth_mbs)
        total = np.cumsum(s)
        v = a - total
        v += s                                              # a_j - S_{j-1}
        first = np.flatnonzero(np.r_[True, qg[1:] != qg[:-1]])
        qf = qg[first]
        v[first] = np.maximum(v[first], last[qf] - (total[first] - s[first]))
        lo, hi = int(v.min()), int(v.max())
        if int(qf[-1]) * (hi - lo + 1) + abs(hi) + abs(lo) < 1 << 62:
            off = qg.astype(np.int64)
            off *= hi - lo + 1                              # lifts each queue above the previous
            v += off
            np.maximum.accumulate(v, out=v)
            v -= off
        else:                                               # the lift would overflow: per queue
            for b, e in zip(first, np.r_[first[1:], len(v)]):
                np.maximum.accumulate(v[b:e], out=v[b:e])
        v += total                                          # departures
        ends = np.r_[first[1:] - 1, len(qg) - 1]
        last[qf] = v[ends]
        nbytes[qf] += np.add.reduceat(sz, first, dtype=np.int64)
        busy[qf] += total[ends] - total[first] + s[first]
        arrive[idx] = v
    return arrive, nbytes, busy


class _Part:
    """The cache seen through a subset `sel` of the accesses (local index -> global index)."""

    def __init__(self, cache: HbmCache, sel: np.ndarray) -> None:
        self.cache, self.sel, self.bandwidth_mbs = cache, sel, cache.bandwidth_mbs

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        return self.cache(self.sel[idx])


def serve_split(arrive: np.ndarray, queue: np.ndarray, n_queues: int, size: np.ndarray, bandwidth_mbs: int, *,
                cache: HbmCache | None = None, chunk: int = 1 << 16,
                workers: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """serve(), with the even and odd queues in two threads when `workers` > 1 and the stage is
    big enough. With a cache, the queues must be the modules (their cache sets are disjoint)."""
    if workers < 2 or n_queues < 2 or len(arrive) < 8 * chunk:
        return serve(arrive, queue, n_queues, size, bandwidth_mbs, cache=cache, chunk=chunk)
    odd = (queue & 1).astype(bool)
    parts = [np.flatnonzero(~odd), np.flatnonzero(odd)]

    def one(sel: np.ndarray):
        return serve(arrive[sel], queue[sel], n_queues, size[sel], bandwidth_mbs,
                     cache=None if cache is None else _Part(cache, sel), chunk=chunk)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, parts))
    nbytes, busy = np.zeros(n_queues, np.int64), np.zeros(n_queues, np.int64)
    for sel, (depart, b, z) in zip(parts, results):
        arrive[sel] = depart
        nbytes += b
        busy += z
    return arrive, nbytes, busy
