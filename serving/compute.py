"""The GPU side: prefill and decode times, and how much KV the GPUs' HBM holds.

Prefill is compute-bound: its FLOPs over the engine's effective prefill throughput, the one
calibrated constant (serving/calibrate.py). FLOPs of a forward pass over `new` tokens after
`cached` tokens already in the KV cache (the usual count, e.g. Kaplan et al. 2020, "Scaling Laws
for Neural Language Models", section 2.1):
  * 2 x parameters per token (every weight is one multiply-add);
  * attention: for each layer and each new token attending to `ctx` tokens, Q.K^T and the
    weighted sum of V cost 2 x ctx x (heads x head_dim) multiply-adds, i.e. 4 x layers x heads x
    head_dim x ctx FLOPs; the i-th new token attends to cached + i tokens (causal).
Decode is memory-bound: each step streams the weights from HBM once (the roofline's lower bound;
batching shares that stream between sessions, which this single-request bound ignores).
"""

from __future__ import annotations

from pfcxl.errors import ServingError

from pfcxl.serving.inputs import Gpu, Model


def prefill_flops(model: Model, new: int, cached: int) -> float:
    attended = new * cached + new * (new + 1) / 2          # sum over new tokens of their context
    return 2 * model.params_billion * 1e9 * new + 4 * model.layers * model.attention_heads * model.head_dim * attended


def prefill_seconds(model: Model, new: int, cached: int, flops_per_s: float) -> float:
    return prefill_flops(model, new, cached) / flops_per_s


def decode_seconds(model: Model, gpu: Gpu, gpus: int, tokens: int) -> float:
    return tokens * model.weight_bytes / (gpus * gpu.hbm_bandwidth_gbs * 1e9)


def gpu_kv_bytes(model: Model, gpu: Gpu, gpus: int, utilisation: float) -> float:
    """HBM left for KV: the engine's share of HBM minus the weights (activations ignored)."""
    usable = gpus * gpu.hbm_gb * 1e9 * utilisation
    if usable <= model.weight_bytes:
        raise ServingError(f"{model.name} needs {model.weight_bytes / 1e9:.0f} GB of weights; {gpus} x {gpu.name} "
                           f"at gpu_memory_utilization {utilisation} give {usable / 1e9:.0f} GB: use more GPUs")
    return usable - model.weight_bytes


def peak_flops(gpu: Gpu, gpus: int) -> float:
    return gpus * gpu.bf16_dense_tflops * 1e12
