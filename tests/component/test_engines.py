"""pfcxl's KV store inside the real engines (pfcxl/engines/, docs/kvstore.md "Serving engines"):
LMCache 0.5.6, SGLang 0.5.23 and vLLM 0.34.0, each loading pfcxl through its own plugin interface.

The engines live in <repo>/.venv-engines (make engines; make test makes it first), never in the
main venv: each engine runs in a child process of that interpreter, one host of a store this test
formats, and prints one RESULT line that the test checks. Each engine is imported once per child
(SGLang's import alone takes 20+ s of CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pfcxl.guest.python import pfcxl_kvstore as kv
from pfcxl.host_tools.provision.engines_env import ENGINES_VENV

from .conftest import sparse_file


pytestmark = pytest.mark.component

PYTHON = ENGINES_VENV / "bin" / "python"


def engines_python() -> str:
    if not PYTHON.exists():
        pytest.fail(f"{PYTHON} is missing: `make engines` makes the engines environment", pytrace=False)
    return str(PYTHON)


def pool(tmp_path: Path, arena: int, hosts: int = 4, slots: int = 256, version: int | None = None) -> str:
    """A pool file with an empty store whose arenas hold about `arena` bytes each."""
    index = kv.geometry(1 << 40, hosts, slots)["arena_off"]
    path = sparse_file(tmp_path / "pool", kv.HOME + index + hosts * arena)
    kv.format(str(path), hosts=hosts, slots=slots, chunk_tokens=16)
    if version is not None:                     # a store of another version: its superblock says so
        with open(path, "r+b") as f:
            f.seek(kv.HOME + kv.SUPER.offset["version"])
            f.write(version.to_bytes(4, "little"))
    return str(path)


def child(script: str, *args, timeout: int = 300) -> tuple[dict, str]:
    """Run `script` with the engines' interpreter; its RESULT line and its whole output."""
    done = subprocess.run([engines_python(), "-c", script, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"})
    out = done.stdout + done.stderr
    results = [line[len("RESULT "):] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and results, f"exit {done.returncode}:\n{out[-4000:]}"
    return json.loads(results[-1]), out


# Each child leaves through os._exit: the engines' own threads (LMCache's monitors, its event
# loop) would keep an interpreter that raised alive until the test's timeout.
PRELUDE = r'''
import json, os, sys, traceback
def _leave(kind, value, tb):
    traceback.print_exception(kind, value, tb)
    sys.stderr.flush()
    os._exit(1)
sys.excepthook = _leave
def finish(out):
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)
'''

LMCACHE = PRELUDE + r'''
import asyncio, torch
from pfcxl.engines import lmcache_cpu as cpu
pool, phase = sys.argv[1], sys.argv[2]
CHUNK, LAYERS, HIDDEN = 16, 2, 8

def prompt(i):
    g = torch.Generator().manual_seed(i)
    return torch.arange(64) + 1000 * i, torch.randn(2, LAYERS, 64, HIDDEN, generator=g).to(cpu.DTYPE)

def plugin(e, kind):
    backends = e.storage_manager.storage_backends
    return backends["pfcxl"] if kind == "storage" else backends["RemoteBackend-pfcxl"].connection._connector

def drain(e, kind):
    """LMCache's RemoteBackend puts on its event loop and, for a connector that batches, keeps no
    record of them (its put_tasks stays empty): a no-op run on that loop after them returns only
    once every put scheduled before it has run, since each of ours completes without yielding."""
    if kind == "remote":
        loop = e.storage_manager.storage_backends["RemoteBackend-pfcxl"].loop
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(timeout=60)

out = {}
if phase == "wrong":                    # misconfigured: LMCache logs why, and its lookups miss
    for name, kind, where, host in (("nopool", "storage", "", 0), ("range", "remote", pool, 9),
                                    ("version", "storage", sys.argv[3], 0)):
        e = cpu.engine(name, CHUNK, LAYERS, HIDDEN, cpu_bytes=1 << 20, hot=False, **cpu.plugin_config(kind, where, host))
        out[name] = sorted(e.storage_manager.storage_backends)
    finish(out)
for kind, host in (("storage", 0), ("remote", 2)) if phase == "store" else (("storage", 1), ("remote", 3)):
    e = cpu.engine(f"{phase}-{kind}", CHUNK, LAYERS, HIDDEN, cpu_bytes=1 << 20, hot=False,
                   **cpu.plugin_config(kind, pool, host))
    store = plugin(e, kind).store
    base = 0 if kind == "storage" else 100       # each kind its own prompts: hosts see every host's blocks
    r = out[kind] = {"host": store.host, "class": type(plugin(e, kind)).__name__}
    if phase == "store":
        # prompt 3 first, then fillers that evict it from this host's small arena; prompts 1 and 2 last
        for i in (3, 10, 11, 12, 13, 2, 1):
            tokens, kvs = prompt(i + base)
            e.store(tokens, kv=kvs)
            drain(e, kind)
        r["evictions"] = store.header(store.host)["evictions"]
    else:
        tokens, kvs = prompt(1 + base)
        r["lookup"] = e.lookup(tokens)
        got = torch.zeros_like(kvs)
        r["retrieved"] = int(e.retrieve(tokens, kv=got).sum())
        r["exact"] = torch.equal(got, kvs)
        tokens, kvs = prompt(3 + base)
        r["evicted_lookup"] = e.lookup(tokens)
        r["evicted_retrieved"] = int(e.retrieve(tokens, kv=torch.zeros_like(kvs)).sum())
        # prompt 2's second chunk on the device's poison list: the prefix stops before it
        keys = [k.to_string() for _, _, k in e.token_database.process_tokens(prompt(2 + base)[0])]
        (h, _, rec), = store.find(keys[1])
        store.poisoned = [(store.m.device_off + rec["offset"], rec["length"])]
        tokens, kvs = prompt(2 + base)
        got = torch.zeros_like(kvs)
        r["poisoned_retrieved"] = int(e.retrieve(tokens, kv=got).sum())
        r["poisoned_prefix_exact"] = torch.equal(got[:, :, :CHUNK], kvs[:, :, :CHUNK])
        r["poisoned_rest_zero"] = not got[:, :, CHUNK:].any().item()
    cpu.close(f"{phase}-{kind}")
finish(out)
'''


def test_lmcache_engines_on_two_hosts_share_a_prompts_kv_through_both_plugin_kinds(tmp_path):
    path = pool(tmp_path, arena=16 << 10)
    stored, _ = child(LMCACHE, path, "store")
    assert stored["storage"]["class"] == "PfcxlStoragePlugin" and stored["remote"]["class"] == "PfcxlRemoteConnector"
    assert stored["storage"]["evictions"] > 0 and stored["remote"]["evictions"] > 0
    loaded, _ = child(LMCACHE, path, "load")
    for kind in ("storage", "remote"):
        r = loaded[kind]
        assert r["host"] in (1, 3)
        assert r["lookup"] == r["retrieved"] == 64 and r["exact"], r             # host 0's / 2's KV, bit-exact
        assert r["evicted_lookup"] == r["evicted_retrieved"] == 0, r            # evicted by its owner: a miss
        assert r["poisoned_retrieved"] == 16 and r["poisoned_prefix_exact"] and r["poisoned_rest_zero"], r



def test_a_misconfigured_lmcache_plugin_is_one_line_in_lmcaches_log(tmp_path):
    path = pool(tmp_path, arena=16 << 10)
    (tmp_path / "old").mkdir()
    other = pool(tmp_path / "old", arena=16 << 10, version=2)
    got, log = child(LMCACHE, path, "wrong", other)
    # the remote backend stays, without a connection: LMCache logs the connector's error and counts misses
    assert got == {"nopool": ["LocalCPUBackend"], "range": ["LocalCPUBackend", "RemoteBackend-pfcxl"],
                   "version": ["LocalCPUBackend"]}
    assert ("Failed to create backend pfcxl: LMCache storage plugin: pfcxl: pfcxl.pool is missing from the "
            "configuration: it names the store's pool file or DAX device") in log
    assert (f"LMCache remote connector: pfcxl: pfcxl.pool {path}: host 9 is out of range (0 <= host < 4)") in log
    assert (f"Failed to create backend pfcxl: LMCache storage plugin: pfcxl: pfcxl.pool {other}: store version 2 is "
            "not this code's version 3: format it anew (every block is lost)") in log


SGLANG = PRELUDE + r'''
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
pool, phase = sys.argv[1], sys.argv[2]

def backend(host, **more):
    extra = {"backend_name": "pfcxl", "module_path": "pfcxl.engines.sglang", "class_name": "PfcxlHiCacheStorage",
             "pool": pool, "host": host, **more}
    config = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                  is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                                  model_name="pfcxl-cpu", extra_config={k: v for k, v in extra.items() if v is not None})
    return StorageBackendFactory.create_backend("dynamic", config, None)

def error(**more):
    try:
        backend(**more)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None

pages = [torch.full((2, 64), float(i), dtype=torch.bfloat16) for i in range(3)]
if phase == "set":
    b = backend(0)
    out = {"class": type(b).__name__, "batch_set": b.batch_set(["p0", "p1", "p2"], pages),
           "again": b.set("p0", pages[0])}
else:
    b = backend(1)
    target = torch.zeros(2, 64, dtype=torch.bfloat16)
    got = b.batch_get(["p0", "p1", "nope"])
    out = {"exists": b.exists("p1"), "leading": b.batch_exists(["p0", "p1", "nope", "p2"]),
           "got": [g is not None and torch.equal(g, p) for g, p in zip(got[:2], pages)], "miss": got[2] is None,
           "into": b.get("p2", target) is target and torch.equal(target, pages[2]),
           "no_pool": error(host=1, pool=None), "host": error(host=9), "no_host": error(host=None)}
finish(out)
'''


def test_sglang_factory_builds_the_backend_set_on_host_0_read_on_host_1(tmp_path):
    path = pool(tmp_path, arena=1 << 20)
    done, _ = child(SGLANG, path, "set")
    assert done == {"class": "PfcxlHiCacheStorage", "batch_set": True, "again": True}
    got, _ = child(SGLANG, path, "get")
    assert got["exists"] and got["leading"] == 2 and got["got"] == [True, True] and got["miss"] and got["into"]
    assert got["no_pool"] == ("EngineConfigError: SGLang HiCache dynamic backend: pfcxl: pool is missing from the "
                              "configuration: it names the store's pool file or DAX device")
    assert got["host"] == (f"EngineConfigError: SGLang HiCache dynamic backend: pfcxl: pool {path}: host 9 is out "
                           "of range (0 <= host < 4)")
    assert got["no_host"].startswith("EngineConfigError: SGLang HiCache dynamic backend: pfcxl: host is missing")


VLLM = PRELUDE + r'''
import torch
from types import SimpleNamespace
from vllm.config import CacheConfig, KVTransferConfig, SchedulerConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock, get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request
pool, phase = sys.argv[1], sys.argv[2]
BS, LAYERS, HEADS, HEAD, BLOCKS = 16, ["model.layers.0.attn", "model.layers.1.attn"], 2, 4, 8
hash_fn = get_hash_fn_by_name("sha256_cbor")
init_none_hash(hash_fn)
spec = FullAttentionSpec(block_size=BS, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16)
kv_cache_config = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(LAYERS, spec)])

def vllm_config(**extra):
    # the stand-in begins here: VllmConfig() cannot be built on CPU with PyPI's wheel ("Failed to
    # infer device type"); its parts below are vLLM's own
    return SimpleNamespace(
        kv_transfer_config=KVTransferConfig(kv_connector="PfcxlConnector", kv_connector_module_path="pfcxl.engines.vllm",
                                            kv_role="kv_both", kv_connector_extra_config=extra),
        cache_config=CacheConfig(block_size=BS),
        scheduler_config=SchedulerConfig(max_model_len=4096, is_encoder_decoder=False,
                                         disable_hybrid_kv_cache_manager=True))

def connector(role, **extra):
    return KVConnectorFactory.create_connector(vllm_config(**extra), role, kv_cache_config)

def error(**extra):
    try:
        connector(KVConnectorRole.SCHEDULER, **extra)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None

def request(rid, n=56):
    return Request(rid, list(range(100, 100 + n)), SamplingParams(max_tokens=1), None,
                   block_hasher=get_request_block_hasher(BS, hash_fn))

def step(sched, req, block_ids, computed=0):
    """One scheduler step as vLLM's Scheduler runs it: the lookup, the allocation, the metadata."""
    ext, _ = sched.get_num_new_matched_tokens(req, computed)
    blocks = KVCacheBlocks(([KVCacheBlock(i) for i in block_ids],))
    sched.update_state_after_alloc(req, blocks, ext)
    new = NewRequestData.from_request(req, (block_ids,), req.prompt_token_ids)
    out = SchedulerOutput(scheduled_new_reqs=[new], scheduled_cached_reqs=CachedRequestData.make_empty(),
                          num_scheduled_tokens={req.request_id: req.num_tokens - computed - ext},
                          total_num_scheduled_tokens=req.num_tokens - computed - ext, scheduled_spec_decode_tokens={},
                          scheduled_encoder_inputs={}, finished_req_ids=set(), free_encoder_mm_hashes=[])
    return ext, sched.build_connector_meta(out)

def caches():
    return {name: torch.zeros(2, BLOCKS, BS, HEADS, HEAD, dtype=torch.float16) for name in LAYERS}

host = 0 if phase == "save" else 1
sched = connector(KVConnectorRole.SCHEDULER, pool=pool, host=host)
worker = connector(KVConnectorRole.WORKER, pool=pool, host=host)
kv = caches()
worker.register_kv_caches(kv)
req = request("r0")
ext, meta = step(sched, req, [4, 5, 6, 7])
out = {"class": type(worker).__name__, "matched": ext}
if phase == "save":
    g = torch.Generator().manual_seed(7)
    for t in kv.values():
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    worker.bind_connector_metadata(meta)
    for name in LAYERS:                               # the model's forward pass, layer by layer
        worker.save_kv_layer(name, kv[name], None)
    worker.wait_for_save()
    worker.clear_connector_metadata()
    out["stores"] = len(meta.stores)
    torch.save({n: t[:, 4:7].clone() for n, t in kv.items()}, sys.argv[3])
else:
    want = torch.load(sys.argv[3])
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(SimpleNamespace(attn_metadata=None))
    for name in LAYERS:
        worker.wait_for_layer_load(name)
    worker.clear_connector_metadata()
    out["loads"] = [b for _, b in meta.loads]
    out["filled"] = all(torch.equal(kv[n][:, 4:7], want[n]) for n in LAYERS)
    out["rest_zero"] = all(not kv[n][:, :4].any() and not kv[n][:, 7:].any() for n in LAYERS)
    out["errors"] = sorted(worker.get_block_ids_with_load_errors())
    # a block withdrawn by its owner between the lookup and the load: a load error, not wrong bytes
    ext2, meta2 = step(sched, request("r1"), [1, 2, 3, 4])
    keys = {k for k, _ in meta2.loads}
    owner = __import__("pfcxl.engines.common", fromlist=["kv"]).kv.Store.open(pool)
    worker.bind_connector_metadata(meta2)
    worker.store.poisoned = [(owner.m.device_off + rec["offset"], rec["length"])
                             for k in sorted(keys)[:1] for _, _, rec in owner.find(k)]
    worker.start_load_kv(SimpleNamespace(attn_metadata=None))
    out["poisoned_errors"] = len(worker.get_block_ids_with_load_errors())
    out["no_pool"], out["host"] = error(host=0), error(pool=pool, host=7)
finish(out)
'''


def test_vllm_factory_builds_the_connector_and_host_1_loads_host_0s_blocks(tmp_path):
    path = pool(tmp_path, arena=1 << 20)
    saved, _ = child(VLLM, path, "save", tmp_path / "want.pt")
    assert saved == {"class": "PfcxlConnector", "matched": 0, "stores": 3}     # 56 tokens: 3 full blocks
    got, _ = child(VLLM, path, "load", tmp_path / "want.pt")
    assert got["matched"] == 48 and got["loads"] == [4, 5, 6]          # another host's 3 blocks, by vLLM's hashes
    assert got["filled"] and got["rest_zero"] and got["errors"] == []   # bit-exact into blocks 4..6, nothing else
    assert got["poisoned_errors"] == 1
    assert got["no_pool"] == ("EngineConfigError: vLLM PfcxlConnector: pfcxl: pool is missing from the configuration: "
                              "it names the store's pool file or DAX device")
    assert got["host"] == f"EngineConfigError: vLLM PfcxlConnector: pfcxl: pool {path}: host 7 is out of range (0 <= host < 4)"
