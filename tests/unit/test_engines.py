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

from pfcxl.host_tools.image import debian as debian_image
from pfcxl.host_tools.provision.engines_env import ENGINES_VENV

from .conftest import sparse_file

kv = debian_image.import_guest_module("pfcxl_kvstore")

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
import time, torch
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
    """LMCache's RemoteBackend puts on its event loop: wait for them before the next prompt."""
    while kind == "remote" and e.storage_manager.storage_backends["RemoteBackend-pfcxl"].put_tasks:
        time.sleep(0.005)

out = {}
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
