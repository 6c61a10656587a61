"""An LMCacheEngine on CPU, for pfcxl's tests and benchmarks (no serving engine drives it here).

The stand-in begins at `CPUKVConnector`: LMCache's GPU connector (what copies between the serving
engine's paged KV on the GPU and LMCache's MemoryObjs) is replaced by a copy between one CPU
tensor of shape [2, layers, tokens, hidden] (K and V of every layer, LMCache's KV_2LTD layout)
and the MemoryObjs. Everything else is LMCache's own: its configuration, metadata, token
database (chunk hashing with vLLM's sha256_cbor, the same in every process), storage manager,
LocalCPUBackend allocator, the plugins' loading, lookup, store and retrieve.
"""

from __future__ import annotations

from typing import Any

from pfcxl.engines.common import require

require("lmcache")

import torch  # noqa: E402
from lmcache.v1.cache_engine import LMCacheEngine, LMCacheEngineBuilder  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402

PLUGIN = "pfcxl"
DTYPE = torch.float16


class CPUKVConnector(GPUConnectorInterface):
    """The stand-in for LMCache's GPU connector: the engine's KV is the CPU tensor passed as
    `kv=` to store and retrieve."""

    def __init__(self, layers: int, hidden: int) -> None:
        self.layers, self.hidden = layers, hidden

    def to_gpu(self, memory_obj, start: int, end: int, **kwargs) -> None:
        kwargs["kv"][:, :, start:end, :].copy_(memory_obj.tensor)

    def from_gpu(self, memory_obj, start: int, end: int, **kwargs) -> None:
        memory_obj.tensor.copy_(kwargs["kv"][:, :, start:end, :])

    def batched_to_gpu(self, memory_objs, starts, ends, **kwargs) -> None:
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(obj, start, end, **kwargs)

    def batched_from_gpu(self, memory_objs, starts, ends, **kwargs) -> None:
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(obj, start, end, **kwargs)

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, self.layers, num_tokens, self.hidden])


def plugin_config(kind: str, pool: str, host: int, base: int | None = None) -> dict[str, Any]:
    """LMCache's configuration of pfcxl: kind "storage" (StoragePluginInterface) or "remote"
    (RemoteConnector); the same keys a user puts in LMCache's YAML."""
    extra: dict[str, Any] = {"pfcxl.pool": pool, "pfcxl.host": host}
    if base is not None:
        extra["pfcxl.base"] = base
    if kind == "storage":
        extra.update({f"storage_plugin.{PLUGIN}.module_path": "pfcxl.engines.lmcache",
                      f"storage_plugin.{PLUGIN}.class_name": "PfcxlStoragePlugin"})
        return {"storage_plugins": [PLUGIN], "extra_config": extra}
    if kind == "remote":
        extra.update({f"remote_storage_plugin.{PLUGIN}.module_path": "pfcxl.engines.lmcache",
                      f"remote_storage_plugin.{PLUGIN}.class_name": "PfcxlRemoteConnector",
                      "use_exists_sync": True})
        return {"remote_storage_plugins": [PLUGIN], "extra_config": extra}
    raise ValueError(f"plugin kind {kind!r} is not storage or remote")


def engine(name: str, chunk_tokens: int, layers: int, hidden: int, cpu_bytes: int, hot: bool = True,
           **settings: Any) -> LMCacheEngine:
    """An LMCacheEngine named `name` on CPU: chunks of `chunk_tokens`, a LocalCPUBackend of
    `cpu_bytes` (hot: it caches chunks too; else it is only the allocator), `settings` more of
    LMCache's configuration (plugin_config's)."""
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=chunk_tokens, local_cpu=hot, max_local_cpu_size=cpu_bytes / (1 << 30),
        pre_caching_hash_algorithm="sha256_cbor", lmcache_instance_id=name, **settings)
    metadata = LMCacheMetadata(model_name="pfcxl-cpu", world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=DTYPE, kv_shape=(layers, 2, chunk_tokens, 1, hidden),
                               chunk_size=chunk_tokens)
    built = LMCacheEngineBuilder.get_or_create(name, config, metadata, CPUKVConnector(layers, hidden),
                                               lambda *a: None, lambda *a: None)
    built.post_init()
    return built


def close(name: str) -> None:
    LMCacheEngineBuilder.destroy(name)
