"""LMCache 0.5.6 over pfcxl's KV block store: every engine, one per host of one store, sees the
chunks all the others stored.

Two ways in, both LMCache's own plugin points, both configured in LMCache's `extra_config`
(`pfcxl.pool`: the store's pool file or DAX device; `pfcxl.host`: this engine's host number;
`pfcxl.base`, optional: the store's first byte):

* a storage plugin: `storage_plugins: [pfcxl]`, `storage_plugin.pfcxl.module_path:
  pfcxl.engines.lmcache`, `storage_plugin.pfcxl.class_name: PfcxlStoragePlugin`;
* a remote connector: `remote_storage_plugins: [pfcxl]`, `remote_storage_plugin.pfcxl.module_path:
  pfcxl.engines.lmcache`, `remote_storage_plugin.pfcxl.class_name: PfcxlRemoteConnector`.

A chunk is stored under its CacheEngineKey's string as one block: the key string, LMCache's own
RemoteMetadata (length, shapes, dtypes, format), then the MemoryObj's bytes. A read allocates the
MemoryObj through LMCache's allocator (the LocalCPUBackend) and copies the payload into it. A
block the store does not verify (evicted, torn, poisoned: pfcxl_kvstore checks its record, crc
and the poison list) or that carries another key is a miss, never wrong bytes.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, List, Optional, Sequence

from pfcxl.engines.common import EngineConfigError, leading, name_of, named, open_store, payload_of, require

require("lmcache")

from lmcache.logging import init_logger  # noqa: E402
from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.memory_management import MemoryObj  # noqa: E402
from lmcache.v1.protocol import RemoteMetadata, get_remote_metadata_bytes, init_remote_metadata_info  # noqa: E402
from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface  # noqa: E402
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector  # noqa: E402

logger = init_logger(__name__)

PREFIX = "pfcxl."


class _Blocks:
    """LMCache chunks as named store blocks; `allocator` is LMCache's LocalCPUBackend."""

    def __init__(self, store, allocator, groups: int) -> None:
        self.store, self.allocator = store, allocator
        init_remote_metadata_info(groups)
        self.meta_bytes = get_remote_metadata_bytes()

    def put(self, key: CacheEngineKey, obj: MemoryObj) -> bool:
        """Store one chunk; False when it was there already (by anyone) or another host won it."""
        data = obj.byte_array
        meta = RemoteMetadata(len(data), obj.get_shapes(), obj.get_dtypes(), obj.get_memory_format())
        return self.store.put(key.to_string(), named(key.to_string(), meta.serialize() + bytes(data)))

    def get(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        name = key.to_string()
        body = payload_of(name, self.store.get(name))
        if body is None or len(body) < self.meta_bytes:
            return None
        meta = RemoteMetadata.deserialize(body[:self.meta_bytes])
        data = body[self.meta_bytes:]
        if meta.length != len(data):
            return None
        obj = self.allocator.allocate(meta.shapes, meta.dtypes, meta.fmt)
        if obj is None:
            logger.warning("pfcxl: LMCache's allocator has no room for a %d-byte chunk: a miss", len(data))
            return None
        target = memoryview(obj.byte_array).cast("B")
        if len(target) != len(data):
            obj.ref_count_down()
            return None
        target[:] = data
        return obj

    def exists(self, key: CacheEngineKey) -> bool:
        return self.store.exists(key.to_string())

    def remove(self, key: CacheEngineKey) -> bool:
        return self.store.remove(key.to_string())


def _open(config, where: str):
    if config is None:
        raise EngineConfigError(f"{where}: pfcxl: no LMCache configuration: its extra_config names the store "
                                f"({PREFIX}pool, {PREFIX}host)")
    return open_store(config.extra_config, PREFIX, where)


class PfcxlStoragePlugin(StoragePluginInterface):
    """LMCache storage plugin: a synchronous backend beside LocalCPUBackend."""

    def __init__(self, dst_device: str = "cpu", config=None, metadata=None, local_cpu_backend=None,
                 loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        super().__init__(dst_device=dst_device, config=config, metadata=metadata,
                         local_cpu_backend=local_cpu_backend, loop=loop)
        if local_cpu_backend is None:
            raise EngineConfigError("LMCache storage plugin: pfcxl allocates through LMCache's LocalCPUBackend "
                                    "and this engine has none (max_local_cpu_size > 0 makes one)")
        self.store = _open(config, "LMCache storage plugin")
        self.blocks = _Blocks(self.store, local_cpu_backend, metadata.get_num_groups() if metadata else 1)
        logger.info("pfcxl: host %d of the store in %s", self.store.host, self.store.m.path)

    def __str__(self) -> str:
        return "PfcxlStoragePlugin"

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        if not self.blocks.exists(key):
            return False
        if pin:
            self.store.pin(key.to_string())
        return True

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        return False                     # puts are synchronous: none is ever in flight

    def batched_submit_put_task(self, keys: Sequence[CacheEngineKey], objs: List[MemoryObj], transfer_spec: Any = None,
                                on_complete_callback: Optional[Callable[[CacheEngineKey], None]] = None) -> None:
        for key, obj in zip(keys, objs, strict=True):
            self.blocks.put(key, obj)
            if on_complete_callback is not None:
                on_complete_callback(key)
        return None

    async def async_batched_submit_put_task(self, keys: Sequence[CacheEngineKey], objs: List[MemoryObj],
                                            transfer_spec: Any = None,
                                            on_complete_callback: Optional[Callable[[CacheEngineKey], None]] = None
                                            ) -> None:
        self.batched_submit_put_task(keys, objs, transfer_spec, on_complete_callback)

    def get_blocking(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return self.blocks.get(key)

    async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey], pin: bool = False) -> int:
        return self.batched_contains(keys, pin)

    async def batched_get_non_blocking(self, lookup_id: str, keys: list[CacheEngineKey],
                                       transfer_spec: Any = None) -> list[MemoryObj]:
        """The leading chunks that load; the first miss ends the list."""
        out: list[MemoryObj] = []
        for key in keys:
            obj = self.blocks.get(key)
            if obj is None:
                break
            out.append(obj)
        return out

    def pin(self, key: CacheEngineKey) -> bool:
        return self.store.pin(key.to_string())

    def unpin(self, key: CacheEngineKey) -> bool:
        return self.store.unpin(key.to_string())

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        """Withdraw this host's block of `key` (another host's blocks are theirs to drop)."""
        return self.blocks.remove(key)

    def get_allocator_backend(self):
        return self.local_cpu_backend

    def touch_cache(self) -> None:
        """The store's LRU is touched by every load of a host's own block: nothing to do."""

    def close(self) -> None:
        self.store.close()


class PfcxlRemoteConnector(RemoteConnector):
    """LMCache remote connector: LMCache's RemoteBackend runs it on its event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend, config=None) -> None:
        if local_cpu_backend is None:
            raise EngineConfigError("LMCache remote connector: pfcxl allocates through LMCache's LocalCPUBackend "
                                    "and this engine has none (max_local_cpu_size > 0 makes one)")
        super().__init__(local_cpu_backend.config, local_cpu_backend.metadata)
        self.loop, self.local_cpu_backend = loop, local_cpu_backend
        self.store = _open(config if config is not None else local_cpu_backend.config, "LMCache remote connector")
        self.blocks = _Blocks(self.store, local_cpu_backend, local_cpu_backend.metadata.get_num_groups())
        logger.info("pfcxl: host %d of the store in %s", self.store.host, self.store.m.path)

    async def exists(self, key: CacheEngineKey) -> bool:
        return self.blocks.exists(key)

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self.blocks.exists(key)

    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return self.blocks.get(key)

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        """The caller (LMCache's InstrumentedRemoteConnector) owns memory_obj's reference."""
        self.blocks.put(key, memory_obj)

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: List[CacheEngineKey], memory_objs: List[MemoryObj]) -> None:
        for key, obj in zip(keys, memory_objs, strict=True):
            self.blocks.put(key, obj)

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: List[CacheEngineKey]) -> int:
        return leading(self.blocks.exists(k) for k in keys)

    async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey], pin: bool = False) -> int:
        hits = self.batched_contains(keys)
        if pin:
            for key in keys[:hits]:
                self.store.pin(key.to_string())
        return hits

    def remove_sync(self, key: CacheEngineKey) -> bool:
        return self.blocks.remove(key)

    async def list(self) -> List[str]:
        """Every key string the store holds (each block carries its key)."""
        names = []
        for host, slot, rec, _ in self.store.scan():
            raw = self.store.read_block(host, slot, rec) if rec is not None else None
            if raw is not None and (name := name_of(raw)) is not None:
                names.append(name)
        return names

    async def close(self) -> None:
        self.store.close()
