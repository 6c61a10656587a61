"""KV tiers: LRU capacity per tier, and how long one chunk takes to load from each.

* Appliance: a chunk's bytes are laid out over the appliance's modules at the tier's interleave
  granularity (as the pool interleaves them, device/appliance/pool.py) and read by one host at once. The
  fabric model (pf_appliance in device/fabric/model.py, run in device/fabric/engine.py) times that stream:
  the 128 GB/s host link, the 25.6 GB/s optical paths and the modules' DDR5, with the paper's
  latency terms. The GPUs then pull the chunk over their PCIe links with the engine's copy calls
  (mechanisms.load_seconds); the load takes the slower of the two.
* Host DRAM: the GPUs copy the chunk from DRAM with the engine's copy calls per layer, over their
  effective PCIe rates, drawing together on the DRAM bandwidth (mechanisms.load_seconds; tensor
  parallel: each GPU holds and loads its share of the heads).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from functools import lru_cache

import numpy as np

from pfcxl.device.fabric import engine as fabric_engine
from pfcxl.device.fabric import model as fabric_model
from pfcxl.device.fabric.workloads import PS_STAMP
from pfcxl.device.topology.model import ApplianceSpec

from pfcxl.serving import mechanisms
from pfcxl.serving.inputs import Gpu, Model, Tier


class LruTier:
    """A tier holding up to `capacity` chunks, evicting the least recently used."""

    def __init__(self, name: str, capacity_chunks: float):      # float: may be unbounded (inf)
        self.name = name
        self.capacity = capacity_chunks
        self._chunks: OrderedDict = OrderedDict()

    def __contains__(self, key) -> bool:
        return key in self._chunks

    def __len__(self) -> int:
        return len(self._chunks)

    def touch(self, key) -> bool:
        """Mark `key` used; False if it is not here."""
        if key not in self._chunks:
            return False
        self._chunks.move_to_end(key)
        return True

    def put(self, keys) -> None:
        """Store `keys` as the most recently used, in order, then evict down to capacity (the same
        victims as evicting after each key: the oldest go first either way)."""
        chunks = self._chunks
        for key in keys:
            chunks[key] = None
            chunks.move_to_end(key)
        while len(chunks) > self.capacity:
            chunks.popitem(last=False)


def appliance_fabric(tier: Tier) -> tuple[fabric_model.FabricModel, ApplianceSpec]:
    """The paper's appliance model at the tier's size, every bandwidth times its bandwidth_scale.
    No HBM3E cache (KV chunks are read once per load, cold) and no jitter (a mean time)."""
    granularity = tier.granularity_kib * 1024
    per_module = int(tier.capacity_bytes // tier.modules) // granularity * granularity
    appliance = ApplianceSpec(modules=tier.modules, module_capacity=per_module, hbm_cache=0, ports=16,
                              granularity=granularity, shared=per_module * tier.modules, private=0, backing="memfd")
    model = fabric_model.pf_appliance(appliance, cache=False, jitter=False)
    if tier.bandwidth_scale != 1.0:
        def scaled(stage):
            return replace(stage, bandwidth_mbs=max(1, round(stage.bandwidth_mbs * tier.bandwidth_scale)))
        model = replace(model, write_stages=tuple(map(scaled, model.write_stages)), memory=scaled(model.memory),
                        read_stages=tuple(map(scaled, model.read_stages)))
    return model, appliance


@lru_cache(maxsize=64)
def appliance_chunk_seconds(tier: Tier, chunk_bytes: int) -> float:
    """Time for one host to read one chunk laid out over the modules, all requests issued at once
    (one access per interleave granule, the way a DMA engine walks the chunk)."""
    model, appliance = appliance_fabric(tier)
    return stream_seconds(model, chunk_bytes, appliance.granularity)


def stream_seconds(model: fabric_model.FabricModel, chunk_bytes: int, g: int) -> float:
    """Time for `model` to serve one host's read of `chunk_bytes`, one request per `g`-byte
    granule, all issued at once."""
    count = -(-chunk_bytes // g)
    trace = np.zeros(count, fabric_engine.trace_dtype())
    trace["hpa"] = np.arange(count, dtype=np.uint64) * g
    trace["size"] = g
    if chunk_bytes % g:
        trace["size"][-1] = chunk_bytes % g
    result = fabric_engine.run(model, trace, ns_per_insn=PS_STAMP, granularity=g)
    return result.window_ps / 1e12


def chunk_seconds(tier: Tier, model: Model, tokens: int, gpu: Gpu, gpus: int, c: mechanisms.Constants) -> float:
    """Time to bring one chunk of `tokens` tokens from `tier` into the GPUs' HBM."""
    if tier.kind == "appliance":
        gpu_side = mechanisms.load_seconds(model, gpu, gpus, tokens, c)
        return max(appliance_chunk_seconds(tier, tokens * model.kv_bytes_per_token), gpu_side)
    return mechanisms.load_seconds(model, gpu, gpus, tokens, c, source_gbs=tier.dram_bandwidth_gbs)
