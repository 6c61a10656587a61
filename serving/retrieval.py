"""The paper's Table I: how much faster loading a context's KV is than recomputing it, from host
memory and from disk, with the serving model's compute model and link bandwidths.

For a batch of `batch` sequences of `context` tokens each:
  * recompute: the prefill of every sequence from scratch (compute.prefill_seconds), on the GPUs
    at the calibrated effective prefill throughput, taken as the same fraction of each GPU's
    dense BF16 peak as the fitted H200 figure (serving/calibrate.py);
  * load from host memory: batch x context x KV bytes per token over the smaller of the host
    DRAM bandwidth and the GPUs' PCIe links together (tiers.chunk_seconds, host-DRAM tier);
  * load from disk: the same bytes at the disk's read bandwidth (or the PCIe links if slower).
The speedup is recompute time over load time. Contexts run from 1K to the paper's 4M tokens in
powers of two, keeping those whose batch of KV fits the GPUs' HBM left for KV (recompute has to
hold it there); a row's range is the smallest and largest speedup over its batches and contexts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pfcxl.errors import ServingError

from pfcxl.serving import compute
from pfcxl.serving.inputs import DATA, Gpu, Model, Tier, read_toml
from pfcxl.serving.tiers import chunk_seconds

BATCHES = (1, 2, 8, 16, 32)
CONTEXTS = tuple(1024 << k for k in range(13))                 # 1K .. 4M tokens
UTILISATION = 0.9                                               # of HBM, as the serving workloads use

# The paper's Table I rows: (model, GPU, GPUs) -> (host-memory speedup range, disk range or None)
PAPER = {("llama-8b", "a100", 1): ((3.3, 27.5), (0.53, 1.72)),
         ("llama-8b", "h100", 1): ((1.9, 11.8), None),
         ("llama-8b", "h200", 1): ((1.5, 17.2), (0.38, 1.27)),
         ("llama-70b", "h200", 2): ((2.7, 51.4), None),
         ("llama-405b", "h200", 8): ((2.7, 100.0), (2.1, 9.7))}


@dataclass(frozen=True)
class Disk:
    name: str
    read_gbs: float
    source: str


def load_disk(name_or_path: str | Path) -> Disk:
    path = Path(name_or_path)
    if path.suffix != ".toml" and not path.exists():
        path = DATA / "disks" / f"{name_or_path}.toml"
    doc = read_toml(path)
    gbs, source = doc.get("read_gbs"), doc.get("source")
    if isinstance(gbs, bool) or not isinstance(gbs, (int, float)) or not gbs > 0:
        raise ServingError(f"{path.name}: read_gbs: {gbs!r} must be a positive number (GB/s)")
    if not isinstance(source, str) or not source.strip():
        raise ServingError(f"{path.name}: source: missing (say where the bandwidth comes from)")
    return Disk(str(doc.get("name", path.stem)), float(gbs), source)


@dataclass(frozen=True)
class Point:
    batch: int
    context: int
    recompute_s: float
    host_s: float
    disk_s: float

    @property
    def host_speedup(self) -> float:
        return self.recompute_s / self.host_s

    @property
    def disk_speedup(self) -> float:
        return self.recompute_s / self.disk_s


def point(model: Model, gpu: Gpu, gpus: int, host: Tier, disk: Disk, flops_per_gpu: float,
          batch: int, context: int) -> Point:
    recompute = batch * compute.prefill_seconds(model, context, 0, flops_per_gpu * gpus)
    total = batch * context * model.kv_bytes_per_token
    host_s = chunk_seconds(host, total, gpu, gpus)
    disk_s = max(total / (disk.read_gbs * 1e9), total / (gpus * gpu.host_link_gbs * 1e9))
    return Point(batch, context, recompute, host_s, disk_s)


def points(model: Model, gpu: Gpu, gpus: int, host: Tier, disk: Disk, flops_per_gpu: float) -> list[Point]:
    """Every batch and context whose KV fits the GPUs (see the module docstring)."""
    room = compute.gpu_kv_bytes(model, gpu, gpus, UTILISATION)
    return [point(model, gpu, gpus, host, disk, flops_per_gpu, b, c) for b in BATCHES for c in CONTEXTS
            if b * c * model.kv_bytes_per_token <= room]


def fitted_fraction(calibrated_tflops: float, calibration_gpu: Gpu) -> float:
    """The calibrated prefill throughput as a fraction of its GPU's dense BF16 peak."""
    return calibrated_tflops / calibration_gpu.bf16_dense_tflops
