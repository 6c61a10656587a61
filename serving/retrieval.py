"""The paper's Table I: how much faster loading a context's KV is than recomputing it, from host
memory and from disk, with the serving model's mechanisms (serving/mechanisms.py) and their
published constants. Nothing here is fitted to the table: it is the check.

For a batch of `batch` sequences of `context` tokens each:
  * recompute: one prefill pass over the batch from scratch (mechanisms.prefill_seconds: dense
    GEMMs at the measured fraction of each GPU's BF16 peak or the weights' HBM stream, causal
    attention, tensor-parallel all-reduce latency);
  * load from host memory: the engine's copy calls per layer and the GPUs' effective PCIe rates,
    drawing together on the host DRAM bandwidth (mechanisms.load_seconds);
  * load from disk: the same bytes read at the disk's read bandwidth into host memory, then the
    host path (store and forward, as an engine's disk backend reads a chunk before it copies it).
The speedup is recompute time over load time. Contexts run from 1K to the paper's 4M tokens in
powers of two, keeping those whose batch of KV fits the GPUs' HBM left for KV (recompute has to
hold it there); a row's range is the smallest and largest speedup over its batches and contexts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pfcxl.errors import ServingError

from pfcxl.serving import compute, mechanisms
from pfcxl.serving.inputs import DATA, Gpu, Model, Tier, read_toml

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
          batch: int, context: int, c: mechanisms.Constants) -> Point:
    recompute = mechanisms.prefill_seconds(model, gpu, gpus, context, 0, flops_per_gpu, c, sequences=batch)
    host_s = mechanisms.load_seconds(model, gpu, gpus, context, c, source_gbs=host.dram_bandwidth_gbs,
                                     sequences=batch)
    total = batch * context * model.kv_bytes_per_token
    disk_s = total / (disk.read_gbs * 1e9) + host_s             # read into host memory, then copied
    return Point(batch, context, recompute, host_s, disk_s)


def points(model: Model, gpu: Gpu, gpus: int, host: Tier, disk: Disk, flops_per_gpu: float,
           c: mechanisms.Constants) -> list[Point]:
    """Every batch and context whose KV fits the GPUs (see the module docstring)."""
    room = compute.gpu_kv_bytes(model, gpu, gpus, UTILISATION)
    return [point(model, gpu, gpus, host, disk, flops_per_gpu, b, x, c) for b in BATCHES for x in CONTEXTS
            if b * x * model.kv_bytes_per_token <= room]


def ranges(pts: list[Point]) -> tuple[tuple[float, float], tuple[float, float]]:
    """(host-memory speedup range, disk speedup range) over a row's points."""
    host = [p.host_speedup for p in pts]
    disk = [p.disk_speedup for p in pts]
    return (min(host), max(host)), (min(disk), max(disk))


def row(name: str, gpu_name: str, gpus: int, host: Tier, disk: Disk, c: mechanisms.Constants,
        dense_tflops_fraction: float | None = None) -> dict:
    """One Table I row: the model's ranges beside the paper's, with the ratio at each end."""
    from pfcxl.serving.inputs import load_gpu, load_model
    model, gpu = load_model(name), load_gpu(gpu_name)
    fraction = c.dense_fraction if dense_tflops_fraction is None else dense_tflops_fraction
    pts = points(model, gpu, gpus, host, disk, fraction * gpu.bf16_dense_tflops * 1e12, c)
    if not pts:
        raise ServingError(f"{name} on {gpus} x {gpu_name}: no batch of 1K tokens fits the GPUs' HBM")
    paper_host, paper_disk = PAPER[name, gpu_name, gpus]
    host_range, disk_range = ranges(pts)
    return {"model": name, "gpu": gpu_name, "gpus": gpus, "max_context": max(p.context for p in pts),
            "host": host_range, "paper_host": paper_host, "host_ratio": end_ratios(host_range, paper_host),
            "disk": disk_range, "paper_disk": paper_disk, "disk_ratio": end_ratios(disk_range, paper_disk)}


def end_ratios(mine: tuple[float, float], paper: tuple[float, float] | None) -> tuple[float, float] | None:
    return (mine[0] / paper[0], mine[1] / paper[1]) if paper else None


def outside(ratios: tuple[float, float] | None, factor: float = 2.0) -> bool:
    """Whether either end is more than `factor` away from the paper's."""
    return bool(ratios) and any(not 1 / factor <= r <= factor for r in ratios or ())
