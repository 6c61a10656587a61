"""The engine-shaped front ends, driven the way LMCache, SGLang HiCache and vLLM's offloading call
their storage: a prefix lookup, loads of the hits, stores of the rest; two hosts share one pool."""

import asyncio
import hashlib
from dataclasses import dataclass

import pytest

from pfcxl.serving.chunks import KV_CHUNK_TOKENS

from pfcxl.host_tools.image import debian as debian_image

from .conftest import kv_pool

conn = debian_image.import_guest_module("pfcxl_kvconnectors")
kv = debian_image.import_guest_module("pfcxl_kvstore")

pytestmark = pytest.mark.component


@pytest.fixture
def two_hosts(tmp_path):
    path = kv_pool(tmp_path, 16 << 20, hosts=2, slots=128)
    a, b = kv.Store.open(path, host=0), kv.Store.open(path, host=1)
    yield a, b
    for s in (a, b):
        if not s.m.map.closed:
            s.close()


def kv_of(key) -> bytes:
    """A chunk's KV bytes, distinct per key."""
    return hashlib.sha256(repr(key).encode()).digest() * 64


@dataclass(frozen=True)
class CacheEngineKey:          # the shape of LMCache's key: fields joined by to_string()
    fmt: str
    model_name: str
    world_size: int
    worker_id: int
    chunk_hash: str

    def to_string(self) -> str:
        return f"{self.fmt}@{self.model_name}@{self.world_size}@{self.worker_id}@{self.chunk_hash}"


def lmcache_keys(tokens, store):
    return [CacheEngineKey("vllm", "llama-8b", 1, 0, h.hex()) for h in kv.chunk_keys(tokens, store.chunk_tokens)]


def test_lmcache_backend_prefix_hits_across_hosts_and_list(two_hosts):
    a, b = two_hosts
    first, second = conn.LMCacheBackend(a), conn.LMCacheBackend(b)
    prompt = list(range(3 * KV_CHUNK_TOKENS + 17))
    longer = prompt[:2 * KV_CHUNK_TOKENS] + [9] * 3 * KV_CHUNK_TOKENS       # shares two chunks

    async def store_all(backend, keys):
        for key in keys:
            if not await backend.exists(key):
                await backend.put(key, kv_of(key.chunk_hash))

    async def retrieve(backend, keys):
        hits = []
        for key in keys:                      # LMCache stops at the first missing chunk
            if not await backend.exists(key):
                break
            hits.append(await backend.get(key))
        return hits

    keys_a, keys_b = lmcache_keys(prompt, a), lmcache_keys(longer, b)
    asyncio.run(store_all(first, keys_a))
    hits = asyncio.run(retrieve(second, keys_b))
    assert hits == [kv_of(k.chunk_hash) for k in keys_a[:2]]
    asyncio.run(store_all(second, keys_b))
    assert sorted(asyncio.run(first.list())) == sorted({k.to_string() for k in keys_a + keys_b})
    assert asyncio.run(first.get(CacheEngineKey("vllm", "llama-8b", 1, 0, "absent"))) is None
    asyncio.run(second.close())
    assert b.m.map.closed


def sglang_page_hashes(tokens, page):
    """SGLang's page keys: SHA-256 hex of the page's tokens, chained on the previous page's hash."""
    keys, prior = [], b""
    for start in range(0, len(tokens) - page + 1, page):
        h = hashlib.sha256(prior + b"".join(t.to_bytes(4, "little") for t in tokens[start:start + page]))
        keys.append(h.hexdigest())
        prior = h.digest()
    return keys


def test_hicache_backend_batch_prefetch_and_write_back(two_hosts):
    a, b = two_hosts
    writer, reader = conn.HiCacheBackend(a), conn.HiCacheBackend(b)
    keys = sglang_page_hashes(list(range(8 * 64)), 64)
    assert writer.batch_set(keys[:5], [kv_of(k) for k in keys[:5]])
    assert reader.batch_exists(keys) == 5                       # prefetch: how many leading pages
    assert reader.batch_get(keys[:5]) == [kv_of(k) for k in keys[:5]]
    assert reader.batch_set(keys, [kv_of(k) for k in keys])    # 5 already there, 3 new: all stored
    assert writer.batch_exists(keys) == 8 and writer.get(keys[7]) == kv_of(keys[7])
    assert reader.batch_get([keys[0], "missing"]) == [kv_of(keys[0]), None]
    assert not reader.exists("missing")


def test_offloading_backend_lookup_load_store_by_block_hashes(two_hosts):
    a, b = two_hosts
    gpu0, gpu1 = conn.OffloadingBackend(a), conn.OffloadingBackend(b)
    hashes = [hash(("block", i)) for i in range(6)]
    assert gpu0.lookup(hashes) == 0
    assert gpu0.store(hashes[:4], [kv_of(h) for h in hashes[:4]]) == hashes[:4]
    assert gpu1.lookup(hashes) == 4
    assert gpu1.load(hashes[:4]) == [kv_of(h) for h in hashes[:4]]
    assert gpu1.store(hashes, [kv_of(h) for h in hashes]) == hashes[4:]      # only the new ones
    assert gpu0.lookup(hashes) == 6 and gpu0.load(hashes[5:]) == [kv_of(hashes[5])]
