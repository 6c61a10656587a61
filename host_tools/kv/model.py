"""Modelled time to load one KV chunk, beside the store's measured figures (`pfcxl kv bench`):
from the PF appliance, the electrical pool and host DRAM (the fabric models, one host reading the
chunk as 4 KiB requests all issued at once), and the time to recompute it instead (the serving
model's prefill FLOPs at its measured dense throughput)."""

from __future__ import annotations

from functools import lru_cache

from pfcxl.device.fabric import model as fabric_model
from pfcxl.serving import compute, inputs, mechanisms
from pfcxl.serving.chunks import KV_CHUNK_TOKENS, chunk_bytes
from pfcxl.serving.tiers import appliance_fabric, stream_seconds

MODELS = ("llama-8b", "llama-70b", "llama-405b")
GPU, GPUS = "h200", 8            # the paper's serving node
RECOMPUTE_CONTEXT = 32768        # tokens already cached before the recomputed chunk


def chunk_load_rows() -> tuple[list[dict], str]:
    """One row per model: chunk bytes and milliseconds per tier; and the recompute assumption."""
    tier = inputs.load_tier("appliance-32tb")
    pf, appliance = appliance_fabric(tier)
    g = appliance.granularity
    electrical = fabric_model.electrical_pool(jitter=False)
    dram = fabric_model.local_dram()
    gpu = inputs.load_gpu(GPU)
    flops = mechanisms.published_prefill_tflops(gpu) * 1e12 * GPUS
    rows = []
    for name in MODELS:
        model = inputs.load_model(name)
        size = chunk_bytes(model.kv_bytes_per_token)
        rows.append(dict(model=name, chunk_bytes=size,
                         pf_ms=stream_seconds(pf, size, g) * 1e3,
                         electrical_ms=stream_seconds(electrical, size, g) * 1e3,
                         dram_ms=stream_seconds(dram, size, g) * 1e3,
                         recompute_ms=compute.prefill_seconds(model, KV_CHUNK_TOKENS, RECOMPUTE_CONTEXT, flops) * 1e3))
    assumption = (f"recompute: the prefill FLOPs of {KV_CHUNK_TOKENS} new tokens after {RECOMPUTE_CONTEXT} cached "
                  f"(serving/compute.py) on {GPUS} x {gpu.name} at the measured "
                  f"{flops / GPUS / 1e12:.0f} TFLOP/s per GPU (serving/data/constants.toml); loads: one host "
                  f"reading the chunk as {g // 1024} KiB requests all at once, no GPU PCIe hop")
    return rows, assumption


@lru_cache(maxsize=None)
def block_load_seconds(model_name: str, block_tokens: int) -> dict:
    """Seconds to load one real block from each fabric, and its bytes."""
    model = inputs.load_model(model_name)
    size = model.kv_bytes_per_token * block_tokens
    pf, appliance = appliance_fabric(inputs.load_tier("appliance-32tb"))
    g = appliance.granularity
    return dict(bytes=size, pf=stream_seconds(pf, size, g),
                electrical=stream_seconds(fabric_model.electrical_pool(jitter=False), size, g))


def prefill_seconds(result: dict, requests, model_name: str, block_tokens: int) -> list[tuple[int, float]]:
    """(request index, modelled prefill seconds of its tokens past the hits) of each finished
    request: serving/compute.py at the measured dense throughput (serving/data/constants.toml)."""
    model = inputs.load_model(model_name)
    flops = mechanisms.published_prefill_tflops(inputs.load_gpu(GPU)) * 1e12 * GPUS
    return [(i, compute.prefill_seconds(model, max(requests[i].input_length - r["hits"] * block_tokens, 0),
                                        min(r["hits"] * block_tokens, requests[i].input_length), flops))
            for i, r in enumerate(result["results"]) if r is not None]
