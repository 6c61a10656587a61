"""SGLang 0.5.23's HiCache over pfcxl's KV block store: a `HiCacheStorage` subclass that SGLang's
StorageBackendFactory loads as its `dynamic` backend, one per host of one store.

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config '{"backend_name":
      "pfcxl", "module_path": "pfcxl.engines.sglang", "class_name": "PfcxlHiCacheStorage",
      "pool": "/dev/dax0.0", "host": 0}'         # optional "base": the store's first byte

A page is stored under its key (SGLang's page hash) with SGLang's model and rank suffix (as its
own file backend does: MLA pages shared by every TP rank, other pages per rank), as one block: the
key, the tensor's dtype and shape, then its bytes. `get` fills `target_location` (a host-pool
tensor of the page's size) or, without one, returns a new tensor; a page the store does not verify
(evicted, torn, poisoned) or of another key is None. `batch_exists` counts the leading hits.
"""

from __future__ import annotations

import json
import struct
from typing import Any, List, Optional

from pfcxl.engines.common import leading, named, open_store, payload_of, require

require("sglang")

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig  # noqa: E402

_HEAD = struct.Struct("<I")        # the length of the JSON header (dtype, shape) after it


def _encode(tensor: torch.Tensor) -> bytes:
    head = json.dumps({"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}).encode()
    raw = tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return _HEAD.pack(len(head)) + head + raw


def _decode(body: memoryview, target: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    (n,) = _HEAD.unpack_from(body)
    head = json.loads(bytes(body[_HEAD.size:_HEAD.size + n]))
    data = body[_HEAD.size + n:]
    dtype = getattr(torch, head["dtype"])
    page = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if target is None:
        return page.view(dtype).reshape(head["shape"])
    if target.numel() * target.element_size() != len(data):
        return None                      # a page of another size: not what the host pool holds
    target.view(torch.uint8).reshape(-1).copy_(page)
    return target


class PfcxlHiCacheStorage(HiCacheStorage):
    """SGLang HiCache storage backend on one host of a pfcxl store."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None) -> None:
        self.store = open_store(storage_config.extra_config, "", "SGLang HiCache dynamic backend")
        c = storage_config
        rank = "" if c.is_mla_model else f"_{c.tp_rank}_{c.tp_size}"
        shard = f"_{c.pp_size}_{c.pp_rank}" if c.pp_size > 1 else ""
        self.suffix = f"_{c.model_name}{rank}{shard}"

    def _name(self, key: str) -> str:
        return key + self.suffix

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> torch.Tensor | None:
        name = self._name(key)
        body = payload_of(name, self.store.get(name))
        return None if body is None else _decode(body, target_location)

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[torch.Tensor | None]:
        targets = target_locations if target_locations is not None else [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, targets, strict=True)]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        """True when the page is stored afterwards (by us now, or by any host before)."""
        tensor = value if value is not None else target_location
        if tensor is None:
            return False
        name = self._name(key)
        return self.store.put(name, named(name, _encode(tensor))) or self.store.exists(name)

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        pages = values if values is not None else target_locations
        if pages is None:
            return False
        return all([self.set(k, v) for k, v in zip(keys, pages, strict=True)])

    def exists(self, key: str) -> bool:
        return self.store.exists(self._name(key))

    def batch_exists(self, keys: List[str], extra_info: Optional[Any] = None) -> int:
        return leading(self.exists(k) for k in keys)

    def close(self) -> None:
        self.store.close()
