"""Replaying a request trace (serving/traces.py) through the GPU tier and one KV tier.

Event mode (the default). Request i arrives at its timestamp x `time_scale`. It looks its
blocks up as a prefix (kvpolicy.TwoTiers: GPU HBM, then the KV tier; the walk stops at the first
block in neither), then, as sim.py's turns do:
  1. the blocks found in the KV tier load over the tier's link (one FIFO server), each taking
     tiers.chunk_seconds for a block of `block_tokens` tokens, pro rata for a partial last block;
  2. the prefill of the other input tokens waits for the GPU prefill engine (one FIFO server);
  3. TTFT = arrival to the end of that prefill; then all its blocks are stored in both tiers;
  4. its answer decodes (compute.decode_seconds, beside later prefills) and the request
     finishes, which ends its reservation under radix-lru with reservation.
Capacities are in blocks: a tier of C tokens holds C // block_tokens blocks.

Sequence-only mode (how published hit-rate curves are drawn): one cache of the given capacity,
no GPU tier in front, the requests in trace order, each stored right after its lookup, no time.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pfcxl.errors import ServingError

from pfcxl.serving import compute, mechanisms
from pfcxl.serving.inputs import Gpu, Model, Tier
from pfcxl.serving.kvpolicy import Policy, TwoTiers
from pfcxl.serving.tiers import chunk_seconds
from pfcxl.serving.traces import Trace

UNBOUNDED = float("inf")


@dataclass(frozen=True)
class TraceSetup:
    trace: Trace
    model: Model
    gpu: Gpu
    gpus: int
    tier: Tier
    kv_capacity_tokens: float           # UNBOUNDED for the ceiling
    prefill_flops_per_gpu: float
    gpu_memory_utilization: float = 0.9
    time_scale: float = 1.0
    policy: Policy = field(default_factory=Policy)
    sequence_only: bool = False
    constants: mechanisms.Constants = field(default_factory=mechanisms.load)   # load path and prefill

    def __post_init__(self) -> None:
        if self.policy.store_answer or self.policy.reservation_scope != "request":
            raise ServingError("--store-answer and --reservation-scope session are the session model's: a trace "
                               "gives no block ids for the answers, and its requests belong to no session")
        if not self.kv_capacity_tokens >= 0:
            raise ServingError(f"KV-tier capacity: {self.kv_capacity_tokens!r} tokens must be 0 or more")
        if not self.time_scale > 0 or self.time_scale == UNBOUNDED:
            raise ServingError(f"--time-scale: {self.time_scale!r} must be a positive number")

    @property
    def mode(self) -> str:
        return "sequence-only (one cache, trace order, no timing)" if self.sequence_only else \
            "event (GPU HBM + KV tier, arrivals at the trace's timestamps)"


@dataclass(frozen=True)
class TraceResult:
    setup: TraceSetup
    input_tokens: np.ndarray        # per request, in trace order
    gpu_hit_tokens: np.ndarray
    kv_hit_tokens: np.ndarray
    counted_tokens: np.ndarray      # what the policy's hit accounting counts
    ttft_s: np.ndarray | None       # None in sequence-only mode
    gpu_tier_blocks: float
    kv_tier_blocks: float
    block_load_s: float
    prefill_busy_s: float = 0.0

    def summary(self) -> dict:
        total = int(self.input_tokens.sum())
        s = self.setup
        doc: dict[str, Any] = {"mode": s.mode, "policy": s.policy.label, "requests": len(self.input_tokens),
               "span_s": s.trace.span_ms * s.time_scale / 1000, "input_tokens": total,
               "kv_capacity_tokens": None if s.kv_capacity_tokens == UNBOUNDED else s.kv_capacity_tokens,
               "hit_rate": float((self.gpu_hit_tokens.sum() + self.kv_hit_tokens.sum()) / total),
               "gpu_hit_rate": float(self.gpu_hit_tokens.sum() / total),
               "kv_hit_rate": float(self.kv_hit_tokens.sum() / total),
               "counted_hit_rate": float(self.counted_tokens.sum() / total)}
        if self.ttft_s is not None:
            ms = self.ttft_s * 1000
            doc["ttft_ms"] = {"mean": float(ms.mean()), **{f"p{q}": float(np.percentile(ms, q)) for q in (50, 90, 99)}}
            doc["block_load_ms"] = self.block_load_s * 1000
            # prefill time over the trace's span: above 100% the GPUs cannot keep up and the queue
            # (and TTFT) grows through the trace
            doc["prefill_utilisation"] = self.prefill_busy_s / doc["span_s"] if doc["span_s"] else 0.0
            doc["gpu_tier_blocks"] = self.gpu_tier_blocks
        doc["kv_tier_blocks"] = None if self.kv_tier_blocks == UNBOUNDED else self.kv_tier_blocks
        return doc


def _tokens(trace: Trace, r, first: int, count: int) -> int:
    """Input tokens in blocks first .. first + count - 1 of request r."""
    return trace.prefix_tokens(r, first + count) - trace.prefix_tokens(r, first)


def replay(setup: TraceSetup) -> TraceResult:
    trace, model = setup.trace, setup.model
    bt = trace.block_tokens
    kv_blocks = setup.kv_capacity_tokens // bt if setup.kv_capacity_tokens != UNBOUNDED else UNBOUNDED
    block_bytes = model.kv_bytes_per_token * bt
    gpu_blocks = 0 if setup.sequence_only else \
        compute.gpu_kv_bytes(model, setup.gpu, setup.gpus, setup.gpu_memory_utilization) // block_bytes
    tiers = TwoTiers(setup.policy, gpu_blocks, kv_blocks)
    n = len(trace.requests)
    inputs = np.fromiter((r.input_length for r in trace.requests), np.int64, n)
    gpu_hit, kv_hit, counted = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    keys = [r.hash_ids[:trace.blocks(r)] for r in trace.requests]

    any_tier = setup.policy.hit_accounting == "any-tier"

    def look(i: int, r, reserve: int) -> None:
        found = tiers.lookup(keys[i], i, reserve)
        gpu_hit[i] = _tokens(trace, r, 0, found.gpu)
        kv_hit[i] = _tokens(trace, r, found.gpu, found.kv)
        counted[i] = gpu_hit[i] + kv_hit[i] if any_tier else kv_hit[i]

    if setup.sequence_only:
        for i, r in enumerate(trace.requests):
            look(i, r, len(keys[i]))
            tiers.store(keys[i], i)
            tiers.finish(i)
        return TraceResult(setup, inputs, gpu_hit, kv_hit, counted, None, gpu_blocks, kv_blocks, 0.0)

    load_per_block = chunk_seconds(setup.tier, model, bt, setup.gpu, setup.gpus, setup.constants)
    seconds_per_token = load_per_block / bt
    ttft = np.zeros(n)
    scale = setup.time_scale / 1000
    # (time, kind, request); at one instant finishes (-1) go first, then arrivals (0), loads (1)
    events = [(r.timestamp_ms * scale, 0, i) for i, r in enumerate(trace.requests)]
    heapq.heapify(events)
    link_free = gpu_free = busy = 0.0
    while events:
        now, kind, i = heapq.heappop(events)
        r = trace.requests[i]
        if kind == 0:                                # arrive: look up, queue the load
            look(i, r, len(keys[i]) + -(-r.output_length // bt))
            ttft[i] = -now
            load = kv_hit[i] * seconds_per_token
            if load:
                link_free = max(now, link_free) + load
            heapq.heappush(events, (link_free if load else now, 1, i))
        elif kind == 1:                              # loaded: queue the prefill of the rest
            hit = int(gpu_hit[i] + kv_hit[i])
            prefill = mechanisms.prefill_seconds(model, setup.gpu, setup.gpus, r.input_length - hit, hit,
                                                 setup.prefill_flops_per_gpu, setup.constants)
            busy += prefill
            gpu_free = max(now, gpu_free) + prefill
            heapq.heappush(events, (gpu_free, 2, i))
        elif kind == 2:                              # first token: store, decode
            ttft[i] += now
            tiers.store(keys[i], i)
            finish = now + compute.decode_seconds(model, setup.gpu, setup.gpus, r.output_length)
            heapq.heappush(events, (finish, -1, i))
        else:
            tiers.finish(i)
    return TraceResult(setup, inputs, gpu_hit, kv_hit, counted, ttft, gpu_blocks, kv_blocks, load_per_block, busy)
