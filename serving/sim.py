"""The event-driven serving simulator (a heapq of timed events, standard library + numpy).

Sessions. `sessions` slots each run `workload.rounds` conversations back to back; slot s starts
at a random offset within one conversation's lifetime, so after that warm-up all slots are
active at once. Requests follow LMCache's multi-round QA benchmark: each session waits
sessions / qps seconds between its requests (`gaps = "fixed"`, as the benchmark does; or
exponential gaps of that mean, seeded) and never sends a turn before its previous answer has
finished. Only turns arriving after the warm-up and before the
first slot runs out of conversations are measured (the steady state with `sessions` active).

A turn. Turn k of a conversation sends the shared system prefix, the k earlier turns (input and
answer) and its new input. Its KV is looked up chunk by chunk (chunks.KV_CHUNK_TOKENS) from the
start: in the GPU tier (HBM, free), else in the KV tier (appliance or host DRAM, loaded), and the
walk stops at the first chunk found nowhere, as LMCache's prefix lookup does. Then:
  1. the chunks found in the KV tier load over the tier's link: one FIFO server per tier;
  2. the prefill of the remaining tokens waits for the GPU prefill engine: one FIFO server;
  3. the first token is out when the prefill ends: TTFT = arrival to that moment;
  4. the whole chunks of the prompt are stored in the GPU tier and the KV tier (write-through;
     stores travel the links' other direction and do not delay loads). The answer's KV is not
     stored (LMCache's default, save_decode_cache = false): the next turn recomputes it;
  5. the answer decodes (memory-bound, compute.decode_seconds) beside later prefills.
Every tier evicts least recently used chunks; a lookup hit makes a chunk most recently used, and
a chunk loaded from the KV tier enters the GPU tier (the default policy, chunk-lru; ServingSetup.policy
selects LLMServingSim's radix-lru and its switches instead, serving/kvpolicy.py). A turn runs from
its arrival to its answer's end (what a reservation covers). Chunks of the system prefix are shared by
every conversation.
"""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass, field

import numpy as np

from pfcxl.errors import ServingError

from pfcxl.serving import compute, mechanisms
from pfcxl.serving.chunks import KV_CHUNK_TOKENS, chunk_bytes, whole_chunks
from pfcxl.serving.inputs import Gpu, Model, Tier, Workload
from pfcxl.serving.kvpolicy import Policy, TwoTiers
from pfcxl.serving.tiers import chunk_seconds


@dataclass(frozen=True)
class ServingSetup:
    """Everything one run depends on."""

    workload: Workload
    model: Model
    gpu: Gpu
    tier: Tier
    sessions: int
    prefill_flops_per_gpu: float
    seed: int = 1
    policy: Policy = field(default_factory=Policy)     # kvpolicy: chunk-lru, or LLMServingSim's radix-lru
    constants: mechanisms.Constants = field(default_factory=mechanisms.load)   # load path and prefill

    def __post_init__(self) -> None:
        if not isinstance(self.sessions, int) or self.sessions < 1:
            raise ServingError(f"sessions: {self.sessions!r} must be a positive integer")
        if self.prefill_flops_per_gpu <= 0:
            raise ServingError(f"prefill throughput: {self.prefill_flops_per_gpu!r} must be positive")


@dataclass(frozen=True)
class Turn:
    session: int
    conversation: int
    turn: int
    arrival_s: float
    prompt_tokens: int
    hit_tokens: int          # found in any tier (GPU or KV tier)
    gpu_hit_tokens: int
    reusable_tokens: int     # what an unbounded cache would have found
    link_wait_s: float
    load_s: float
    gpu_wait_s: float
    prefill_s: float
    ttft_s: float
    counted_tokens: int = 0  # what the policy's hit accounting counts (kvpolicy)


@dataclass(frozen=True)
class SimResult:
    setup: ServingSetup
    turns: tuple[Turn, ...]          # measured turns, in arrival order
    chunk_load_s: float
    gpu_tier_chunks: int
    kv_tier_chunks: int
    window_s: float
    prefill_busy_s: float            # over the measurement window

    def summary(self) -> dict:
        t = self.turns
        ttft = np.array([x.ttft_s for x in t]) * 1000
        prompt = sum(x.prompt_tokens for x in t)
        hit = sum(x.hit_tokens for x in t)
        reusable = sum(x.reusable_tokens for x in t)
        return {
            "turns": len(t),
            "ttft_ms": {"mean": float(ttft.mean()), "p50": float(np.percentile(ttft, 50)),
                        "p90": float(np.percentile(ttft, 90)), "p99": float(np.percentile(ttft, 99))},
            "hit_rate": hit / prompt,
            "counted_hit_rate": sum(x.counted_tokens for x in t) / prompt,
            "gpu_hit_rate": sum(x.gpu_hit_tokens for x in t) / prompt,
            "reusable_rate": reusable / prompt,
            "hit_of_reusable": hit / reusable if reusable else 1.0,
            "mean_ms": {name: 1000 * float(np.mean([getattr(x, name + "_s") for x in t]))
                        for name in ("link_wait", "load", "gpu_wait", "prefill")},
            "prefill_utilisation": self.prefill_busy_s / self.window_s if self.window_s else 0.0,
            # the prefill the workload's request rate asks of the engine: rate x mean prefill per turn
            # (above 1 the engine is overloaded: sessions wait for their answers and the rate is not met)
            "offered_prefill": self.setup.workload.qps * float(np.mean([x.prefill_s for x in t])),
            "chunk_load_ms": self.chunk_load_s * 1000,
            "gpu_tier_chunks": self.gpu_tier_chunks,
            "kv_tier_chunks": self.kv_tier_chunks,
        }

    def to_json(self) -> dict:
        s = self.setup
        return {"model": s.model.name, "gpu": s.gpu.name, "gpus": s.workload.gpus, "tier": asdict(s.tier),
                "workload": s.workload.name, "sessions": s.sessions, "seed": s.seed, "qps": s.workload.qps,
                "policy": s.policy.label,
                "prefill_tflops_per_gpu": s.prefill_flops_per_gpu / 1e12, **self.summary()}


def prompt_tokens(w: Workload, turn: int) -> int:
    return w.system_prefix_tokens + turn * (w.input_tokens + w.output_tokens) + w.input_tokens


def chunk_keys(w: Workload, session: int, conversation: int, count: int) -> list[int]:
    """Keys of a conversation's first `count` chunks. Chunks wholly inside the system prefix are
    shared by every conversation (keys -1, -2, ...); the others are the conversation's own."""
    shared = whole_chunks(w.system_prefix_tokens)
    base = (session * w.rounds + conversation) << 20
    return [-1 - j if j < shared else base | j for j in range(count)]


def simulate(setup: ServingSetup) -> SimResult:
    w, model, gpu = setup.workload, setup.model, setup.gpu
    cbytes = chunk_bytes(model.kv_bytes_per_token)
    gpu_chunks = int(compute.gpu_kv_bytes(model, gpu, w.gpus, w.gpu_memory_utilization) // cbytes)
    kv_chunks = int(setup.tier.capacity_bytes // cbytes)
    tiers = TwoTiers(setup.policy, gpu_chunks, kv_chunks)
    mech = setup.constants
    load_per_chunk = chunk_seconds(setup.tier, model, KV_CHUNK_TOKENS, gpu, w.gpus, mech)
    decode_s = compute.decode_seconds(model, gpu, w.gpus, w.output_tokens)

    rng = np.random.default_rng(setup.seed)
    gap = setup.sessions / w.qps                     # mean time between a session's requests
    lifetime = gap * w.turns
    stored: dict = {}                               # conversation -> whole chunks it has stored
    shared_stored = 0                               # shared prefix chunks stored by anyone
    events: list = []
    seq = 0

    def push(time: float, kind: str, data: tuple) -> None:
        nonlocal seq
        heapq.heappush(events, (time, seq, kind, data))
        seq += 1

    for s, offset in enumerate(rng.uniform(0.0, lifetime, setup.sessions)):
        push(float(offset), "arrive", (s, 0, 0))

    link_free = gpu_free = 0.0
    pending: dict = {}                               # (s, c, k) -> partial turn record
    done: list[Turn] = []
    busy: list[tuple[float, float]] = []             # prefill intervals
    last_finish = {}                                 # slot -> finish of its final turn

    while events:
        now, _, kind, (s, c, k) = heapq.heappop(events)
        if kind == "arrive":
            prompt = prompt_tokens(w, k)
            n = whole_chunks(prompt)
            keys = chunk_keys(w, s, c, n)
            reusable = min(n, max(stored.get((s, c), 0), shared_stored))
            found = tiers.lookup(keys, (s, c, k), -(-(prompt + w.output_tokens) // KV_CHUNK_TOKENS), s)
            hits, gpu_hits = found.hits, found.gpu
            load = (hits - gpu_hits) * load_per_chunk
            start = max(now, link_free) if load else now
            link_free = start + load if load else link_free
            pending[s, c, k] = dict(arrival=now, prompt=prompt, hits=hits, gpu_hits=gpu_hits,
                                    reusable=reusable, link_wait=start - now, load=load,
                                    counted=found.counted)
            push(start + load, "loaded", (s, c, k))
        elif kind == "loaded":
            p = pending[s, c, k]
            hit_tokens = p["hits"] * KV_CHUNK_TOKENS
            prefill = mechanisms.prefill_seconds(model, gpu, w.gpus, p["prompt"] - hit_tokens, hit_tokens,
                                                 setup.prefill_flops_per_gpu, mech)
            start = max(now, gpu_free)
            gpu_free = start + prefill
            busy.append((start, gpu_free))
            p.update(gpu_wait=start - now, prefill=prefill)
            push(gpu_free, "first_token", (s, c, k))
        elif kind == "finish":                       # the answer is out: the request stops running
            if setup.policy.store_answer:            # LLMServingSim: the answer's KV is stored too
                tiers.store(chunk_keys(w, s, c, whole_chunks(prompt_tokens(w, k) + w.output_tokens)), (s, c, k))
                stored[s, c] = whole_chunks(prompt_tokens(w, k) + w.output_tokens)
            tiers.finish((s, c, k), s, last=k + 1 == w.turns)
        else:                                        # first token: store, decode, schedule the next turn
            p = pending.pop((s, c, k))
            n = whole_chunks(p["prompt"])
            keys = chunk_keys(w, s, c, n)
            tiers.store(keys, (s, c, k))
            stored[s, c] = n
            shared_stored = max(shared_stored, min(n, whole_chunks(w.system_prefix_tokens)))
            done.append(Turn(s, c, k, p["arrival"], p["prompt"], p["hits"] * KV_CHUNK_TOKENS,
                             p["gpu_hits"] * KV_CHUNK_TOKENS, p["reusable"] * KV_CHUNK_TOKENS, p["link_wait"],
                             p["load"], p["gpu_wait"], p["prefill"], now - p["arrival"],
                             p["counted"] * KV_CHUNK_TOKENS))
            finish = now + decode_s
            push(finish, "finish", (s, c, k))
            think = gap if w.gaps == "fixed" else float(rng.exponential(gap))
            if k + 1 < w.turns:
                push(max(p["arrival"] + think, finish), "arrive", (s, c, k + 1))
            elif c + 1 < w.rounds:
                push(finish + think, "arrive", (s, c + 1, 0))
            else:
                last_finish[s] = finish

    start, end = lifetime, min(last_finish.values())
    measured = tuple(sorted((t for t in done if start <= t.arrival_s < end), key=lambda t: (t.arrival_s, t.session)))
    if not measured:
        raise ServingError(f"no turn arrived in the measured window ({start:.0f}-{end:.0f} s): raise the "
                           "workload's rounds")
    prefill_busy = sum(max(0.0, min(b, end) - max(a, start)) for a, b in busy)
    return SimResult(setup, measured, load_per_chunk, gpu_chunks, kv_chunks, end - start, prefill_busy)
