"""Engine-shaped front ends over the KV block store (pfcxl_kvstore), thin layers with the method
names and meanings of the engines' own interfaces, so an engine's adapter maps one to one:

* LMCacheBackend: LMCache's remote connector (`async exists/get/put/list/close`, keys with a
  `to_string()` such as LMCache's CacheEngineKey, or strings);
* HiCacheBackend: SGLang HiCache storage (`exists/get/set`, `batch_exists` = how many keys from
  the start are stored, `batch_get`, `batch_set`);
* OffloadingBackend: vLLM's KV offloading (`lookup` = how many block hashes from the start are
  stored, `store`, `load`).

Values are bytes-like (an engine hands over its pinned host buffer's bytes). Standard library only.
"""

from __future__ import annotations

import struct

import pfcxl_kvstore

_NAMED = struct.Struct("<I")      # LMCache's blocks carry their key string: list() returns them


def _key_string(key) -> str:
    return key.to_string() if hasattr(key, "to_string") else str(key)


class LMCacheBackend:
    """LMCache remote connector: coroutines, as LMCache awaits them on its event loop."""

    def __init__(self, kv: pfcxl_kvstore.Store) -> None:
        self.kv = kv

    async def exists(self, key) -> bool:
        return self.kv.exists(_key_string(key))

    async def get(self, key):
        name = _key_string(key)
        raw = self.kv.get(name)
        if raw is None:
            return None
        (n,) = _NAMED.unpack_from(raw)
        if raw[_NAMED.size:_NAMED.size + n].decode() != name:
            return None                   # a 128-bit digest collision: not our block
        return raw[_NAMED.size + n:]

    async def put(self, key, memory_obj) -> None:
        name = _key_string(key).encode()
        self.kv.put(name.decode(), _NAMED.pack(len(name)) + name + bytes(memory_obj))

    async def list(self) -> list[str]:
        names = []
        for host, slot, rec, _ in self.kv.scan():
            raw = self.kv.read_block(host, slot, rec) if rec is not None else None
            if raw is not None and len(raw) >= _NAMED.size:
                (n,) = _NAMED.unpack_from(raw)
                names.append(raw[_NAMED.size:_NAMED.size + n].decode(errors="replace"))
        return names

    async def close(self) -> None:
        self.kv.close()


def _leading_hits(kv: pfcxl_kvstore.Store, keys) -> int:
    """How many of `keys`, from the first, are stored: a prefix cache can use only those."""
    for i, key in enumerate(keys):
        if not kv.exists(key):
            return i
    return len(keys)


class HiCacheBackend:
    """SGLang HiCache storage backend."""

    def __init__(self, kv: pfcxl_kvstore.Store) -> None:
        self.kv = kv

    def exists(self, key: str) -> bool:
        return self.kv.exists(key)

    def batch_exists(self, keys: list[str]) -> int:
        return _leading_hits(self.kv, keys)

    def get(self, key: str, target_location=None):
        return self.kv.get(key)

    def batch_get(self, keys: list[str], target_locations=None) -> list:
        return [self.kv.get(k) for k in keys]

    def set(self, key: str, value, target_location=None) -> bool:
        """True when the key is stored afterwards (by us now, or by anyone before)."""
        return self.kv.put(key, value) or self.kv.exists(key)

    def batch_set(self, keys: list[str], values, target_locations=None) -> bool:
        return all([self.set(k, v) for k, v in zip(keys, values, strict=True)])


class OffloadingBackend:
    """vLLM KV offloading by block hashes (ints or bytes)."""

    def __init__(self, kv: pfcxl_kvstore.Store) -> None:
        self.kv = kv

    def lookup(self, block_hashes) -> int:
        return _leading_hits(self.kv, block_hashes)

    def store(self, block_hashes, blocks) -> list:
        """The hashes this call stored (the others were there already or won by another host)."""
        return [h for h, b in zip(block_hashes, blocks, strict=True) if self.kv.put(h, b)]

    def load(self, block_hashes) -> list:
        """One bytes per hash, None where the block is gone or failed its check."""
        return [self.kv.get(h) for h in block_hashes]
