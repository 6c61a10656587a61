"""Bounds of one `pfcxl serving` command as a whole, checked before anything is simulated: each
field of its inputs is bounded on its own (serving/inputs.py); these bound what the fields make
together, so the command's time, memory and clock stay bounded and its figures finite.

* a prompt (the last turn's: prefix + earlier turns + its input) fits a 1 M-token context;
* a chunk spans at most 2^20 interleave granules (the fabric model times one access per granule);
* the sweep simulates at most MAX_TURNS turns and MAX_LOOKUPS chunk lookups (a turn looks its
  chunks up one by one; every measured turn is kept for the report);
* the simulated clock stays under MAX_CLOCK_S seconds, where a float second still resolves
  15 ns: the sessions' arrivals plus, as if served one after another, every turn's full prefill,
  every chunk's load and every answer's decode (an upper bound of where the clock can get).
"""

from __future__ import annotations

from pfcxl.errors import ServingError

from pfcxl.serving import compute, mechanisms
from pfcxl.serving.chunks import KV_CHUNK_TOKENS, chunk_bytes, whole_chunks
from pfcxl.serving.inputs import MAX_TOKENS, Gpu, Model, Tier, Workload
from pfcxl.serving.sim import prompt_tokens
from pfcxl.serving.tiers import chunk_seconds

MAX_SESSIONS = 100_000
MAX_POINTS = 100                # session counts in one sweep
MAX_TURNS = 1_000_000
MAX_LOOKUPS = 20_000_000
MAX_GRANULES = 1 << 20
MAX_CLOCK_S = 1e8               # about 3 years; float64 seconds resolve 15 ns there


def check(w: Workload, model: Model, gpu: Gpu, tiers: list[Tier], sessions: list[int], prefill_tflops: float,
          constants: mechanisms.Constants | None = None) -> None:
    """ServingError naming the first bound the command breaks (see the module docstring)."""
    last = prompt_tokens(w, w.turns - 1)
    if last > MAX_TOKENS:
        raise ServingError(f"{w.name}: turn {w.turns} sends a {last:,}-token prompt (prefix {w.system_prefix_tokens:,} "
                           f"+ {w.turns - 1} x ({w.input_tokens:,} + {w.output_tokens:,}) + {w.input_tokens:,}): at "
                           f"most {MAX_TOKENS:,} tokens (a 1 M-token context)")
    size = chunk_bytes(model.kv_bytes_per_token)
    for tier in tiers:
        granules = -(-size // (tier.granularity_kib * 1024))
        if tier.kind == "appliance" and granules > MAX_GRANULES:
            raise ServingError(f"{tier.name}: a {KV_CHUNK_TOKENS}-token chunk of {model.name} ({size:,} bytes) spans "
                               f"{granules:,} granules of {tier.granularity_kib} KiB: at most {MAX_GRANULES:,} (the "
                               "fabric model times each); use a larger granularity_kib")
    per_conversation = [max(1, whole_chunks(prompt_tokens(w, k))) for k in range(w.turns)]
    slots = sum(sessions) * len(tiers) * w.rounds
    turns, lookups = slots * w.turns, slots * sum(per_conversation)
    if turns > MAX_TURNS or lookups > MAX_LOOKUPS:
        raise ServingError(f"{len(tiers)} tier(s) x {sum(sessions):,} sessions x {w.rounds} rounds x {w.turns} turns = "
                           f"{turns:,} turns and {lookups:,} chunk lookups: at most {MAX_TURNS:,} turns and "
                           f"{MAX_LOOKUPS:,} lookups per command (the simulation's time and memory grow with them)")
    mech = constants or mechanisms.load()
    load = max(chunk_seconds(t, model, KV_CHUNK_TOKENS, gpu, w.gpus, mech) for t in tiers)   # granules bounded above
    serial = (sum(mechanisms.prefill_seconds(model, gpu, w.gpus, prompt_tokens(w, k), 0, prefill_tflops * 1e12, mech)
                  for k in range(w.turns))
              + sum(per_conversation) * load + w.turns * compute.decode_seconds(model, gpu, w.gpus, w.output_tokens))
    most = max(sessions)
    clock = (w.rounds + 1) * w.turns * most / w.qps + most * w.rounds * serial
    if not clock < MAX_CLOCK_S:
        raise ServingError(f"{most:,} sessions at {w.qps:g} requests/s with prefill at {prefill_tflops:g} TFLOP/s per "
                           f"GPU could run the simulated clock to {clock:.3g} s: at most {MAX_CLOCK_S:g} s (about 3 "
                           "years), where float seconds still resolve the TTFT (raise the request rate or the "
                           "prefill throughput)")
