"""The mechanisms behind a KV load and a prefill, with their published constants
(serving/data/constants.toml: each names its source and says whether it is a measurement, a
datasheet figure, an engine's default or our assumption).

KV load path (host DRAM or the appliance into the GPUs' HBM), as the engines move KV:
  * the KV sits per layer: an engine copies it in units (vLLM: one cudaMemcpyAsync per 16-token
    block per layer, K and V apart; LMCache layer-wise: one transfer per 256-token chunk per
    layer, K and V together), and every call costs a fixed submission time (call_overhead_us);
    calls are pipelined, so a call takes the longer of that cost and its bytes at the link's rate;
  * a GPU's link runs at its PCIe generation's effective fraction of the raw rate (pinned host
    memory), times pageable_fraction when the host buffer is pageable;
  * with tensor parallelism each GPU loads its share of the KV heads over its own link, all at
    once; with `shared_host_memory` the copies to every GPU draw on the one host DRAM bandwidth
    together (each gets at most its share of it).

Prefill (one pass over a batch of sequences, tensor-parallel over `gpus`):
  * dense: 2 x parameters FLOPs per token at dense_fraction of the GPUs' BF16 peak, but never
    faster than streaming the weights from HBM once (the memory-bound phase of a small prefill);
  * attention: the causal quadratic term (compute.prefill_flops) at attention_fraction of peak,
    never faster than reading the context's KV from HBM;
  * tensor parallelism: two all-reduces per layer, each at least allreduce_latency_us (their
    bandwidth part is inside the measured dense_fraction); small prefills therefore stay below
    the measured fraction of peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from pfcxl.errors import ServingError

from pfcxl.serving import compute
from pfcxl.serving.inputs import DATA, Gpu, Model, read_toml

CONSTANTS = DATA / "constants.toml"
KINDS = ("datasheet", "measured", "engine", "assumption")
ENGINES = ("lmcache", "vllm")
# raw PCIe x16 rate per direction (GB/s, after line coding) -> generation; the GPU files give the
# nominal rate (16 GT/s x 16 = 32 GB/s for Gen4, 64 for Gen5, 128 for Gen6)
PCIE_RAW_GBS: dict[float, tuple[int, float]] = {32: (4, 31.5), 64: (5, 63.0), 128: (6, 121.0)}


@dataclass(frozen=True)
class Constants:
    """The values of constants.toml (sources in `sources`), plus the two switches."""

    dense_fraction: float
    attention_fraction: float
    allreduce_latency_us: float
    call_overhead_us: float
    pcie_gen4_fraction: float
    pcie_gen5_fraction: float
    pcie_gen6_fraction: float
    pageable_fraction: float
    vllm_block_tokens: int
    lmcache_chunk_tokens: int
    engine: str = "lmcache"
    pinned: bool = True
    shared_host_memory: bool = True

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ServingError(f"--engine: '{self.engine}' must be one of {', '.join(ENGINES)}")
        for f in NUMERIC:
            value = getattr(self, f)
            if not value > 0 or not math.isfinite(value) or (f.endswith("fraction") and value > 1):
                bound = "above 0 and at most 1" if f.endswith("fraction") else "a positive number"
                raise ServingError(f"{f}: {value!r} must be {bound}")

    def with_value(self, name: str, value: float) -> Constants:
        values: dict = {name: int(value) if name.endswith("_tokens") else float(value)}
        return replace(self, **values)


NUMERIC = tuple(f.name for f in fields(Constants) if f.type in ("float", "int"))


@dataclass(frozen=True)
class Source:
    value: float
    kind: str
    source: str


def read_sources(path=CONSTANTS) -> dict[str, Source]:
    """Every constant of the file with its kind and source (ServingError naming what is wrong)."""
    doc = read_toml(path)
    out = {}
    for section in ("prefill", "load"):
        for name, entry in doc.get(section, {}).items():
            if not isinstance(entry, dict) or set(entry) != {"value", "kind", "source"}:
                raise ServingError(f"{path.name}: {section}.{name}: must have value, kind and source")
            if entry["kind"] not in KINDS or not isinstance(entry["source"], str) or not entry["source"].strip():
                raise ServingError(f"{path.name}: {section}.{name}: kind must be one of {', '.join(KINDS)} and "
                                   "source must say where the value comes from")
            out[name] = Source(entry["value"], entry["kind"], entry["source"])
    missing = set(NUMERIC) - set(out)
    if missing:
        raise ServingError(f"{path.name}: missing constants: {', '.join(sorted(missing))}")
    return out


def load(path=CONSTANTS, **switches) -> Constants:
    sources = read_sources(path)
    values: dict = {name: sources[name].value for name in NUMERIC}
    return Constants(**values, **switches)


def published_prefill_tflops(gpu: Gpu, constants: Constants | None = None) -> float:
    """The dense prefill throughput per GPU: the measured fraction of its dense BF16 peak."""
    return (constants or load()).dense_fraction * gpu.bf16_dense_tflops


# ----------------------------------------------------------------------------------------- KV load path

def link_gbs(gpu: Gpu, c: Constants) -> float:
    """One GPU's effective host-to-device rate: its PCIe generation's fraction of the raw rate,
    times pageable_fraction for a pageable host buffer."""
    if gpu.host_link_gbs not in PCIE_RAW_GBS:
        known = ", ".join(f"{k:g} (Gen{g})" for k, (g, _) in PCIE_RAW_GBS.items())
        raise ServingError(f"{gpu.name}: host_link_gbs {gpu.host_link_gbs:g} is no PCIe x16 rate the load path "
                           f"knows ({known})")
    gen, raw = PCIE_RAW_GBS[gpu.host_link_gbs]
    fraction = getattr(c, f"pcie_gen{gen}_fraction")
    return raw * fraction * (1.0 if c.pinned else c.pageable_fraction)


def units(c: Constants) -> tuple[int, int]:
    """(tokens per copy call, calls per layer per unit): how the engine lays KV out and moves it."""
    return (c.vllm_block_tokens, 2) if c.engine == "vllm" else (c.lmcache_chunk_tokens, 1)


def load_seconds(model: Model, gpu: Gpu, gpus: int, tokens: int, c: Constants, *,
                 source_gbs: float = math.inf, sequences: int = 1) -> float:
    """Time to copy the KV of `sequences` sequences of `tokens` tokens each from host memory (or
    any source whose aggregate rate is `source_gbs`) into the GPUs' HBM."""
    if tokens <= 0:
        return 0.0
    unit, split = units(c)
    heads = max(1, model.kv_heads // gpus)                          # a GPU's share of the KV heads
    calls = sequences * math.ceil(tokens / unit) * model.layers * split
    total = sequences * tokens * heads * model.head_dim * model.dtype_bytes * 2 * model.layers
    rate = link_gbs(gpu, c)
    rate = min(rate, source_gbs / gpus if c.shared_host_memory else source_gbs)
    # pipelined calls of equal size: each takes the longer of its submission and its bytes
    return max(calls * c.call_overhead_us * 1e-6, total / (rate * 1e9))


# ----------------------------------------------------------------------------------------- prefill

def prefill_seconds(model: Model, gpu: Gpu, gpus: int, new: int, cached: int, dense_flops_per_gpu: float,
                    c: Constants, sequences: int = 1) -> float:
    """One prefill pass over `sequences` sequences, each `new` tokens after `cached` ones."""
    if new <= 0:
        return 0.0
    peak = compute.peak_flops(gpu, gpus)
    hbm = gpus * gpu.hbm_bandwidth_gbs * 1e9
    dense = sequences * 2 * model.params_billion * 1e9 * new / (gpus * dense_flops_per_gpu)
    weights = model.weight_bytes / hbm
    attention_flops = sequences * (compute.prefill_flops(model, new, cached) - 2 * model.params_billion * 1e9 * new)
    attention = attention_flops / (peak * c.attention_fraction)
    kv_read = sequences * (cached + new) * model.kv_bytes_per_token / hbm
    allreduce = model.layers * 2 * c.allreduce_latency_us * 1e-6 if gpus > 1 else 0.0
    return max(dense, weights) + max(attention, kv_read) + allreduce
