"""The C core (guest/include/pfcxl_kvstore.h, through the guest tool `kvstore`) and the Python
binding are one store: blocks put by either are read bit-exact by the other, on a pool file."""

from __future__ import annotations

import hashlib
import json
import os
import select
import subprocess
import zlib

import pytest

from pfcxl.compile import compile_cached
from pfcxl.host_tools.experiments.kv_takeover import pattern
from pfcxl.guest.python import pfcxl_kvstore as kv
from pfcxl.guest.python import pfcxl_poison as poison
from pfcxl.host_tools.image import initramfs as image

from .conftest import compile_guest_tool, kv_pool


pytestmark = pytest.mark.component


@pytest.fixture(scope="module")
def tool():
    return compile_guest_tool("kvstore")


@pytest.fixture(scope="module")
def paused_tool(tmp_path_factory):
    """kvstore built with -DKV_TEST_HOOKS: its reader pauses once between a key's match and the
    read of that slot's record (kv_after_key_match in pfcxl_kvstore.h)."""
    src = image.GUEST_SOURCES / "kvstore.c"
    return compile_cached(src, image.tool_inputs(src), (*image.CFLAGS, "-DKV_TEST_HOOKS"),
                          tmp_path_factory.mktemp("kvstore-paused"), "kvstore-paused")


@pytest.fixture
def pool(tmp_path):
    return kv_pool(tmp_path, 32 << 20, hosts=4, slots=64)


def kvstore(tool, *args, status=0):
    done = subprocess.run([str(tool), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == status, done.stderr
    return json.loads(done.stdout) if done.stdout else None, done.stderr


@pytest.mark.parametrize("key", ["", "h0/b1", "x" * 127, "y" * 128, "z" * 129, "w" * 300])
def test_the_c_digest_is_blake2b_128(tool, pool, key):
    with kv.Store.open(pool, host=1) as s:
        s.put(key, pattern(key, 64))
    got, _ = kvstore(tool, "get", pool, "--key", key, "--size", "64")
    assert got["hit"] == 1 and got["match"] == 1          # found by the C digest, and the same bytes
    assert hashlib.blake2b(key.encode(), digest_size=16).digest() == kv.key_digest(key)


def test_c_and_python_read_each_others_blocks(tool, pool):
    kvstore(tool, "put", pool, "--host", "2", "--key", "from-c", "--size", "40000")
    with kv.Store.open(pool, host=3) as s:
        assert s.get("from-c") == pattern("from-c", 40000)
        s.put("from-python", b"\x01\x02\x03" * 1001)               # an odd length: the crc's byte tail
        assert not s.put("from-c", b"other")                       # already stored, by the C side
    got, _ = kvstore(tool, "get", pool, "--key", "from-python")
    assert got["hit"] == 1 and got["length"] == 3003 and int(got["crc32"], 16) == __import__("zlib").crc32(
        b"\x01\x02\x03" * 1001)
    assert kvstore(tool, "verify", pool)[0] == {"tool": "kvstore", "op": "verify", "good": 2, "bad": 0, "claims": 0,
                                               "poison_ranges": None}
    with kv.Store.open(pool) as s:
        assert s.verify() == {"good": 2, "bad": [], "claims": 0}


def test_run_on_one_host_stores_loads_and_wins_the_shared_key(tool, pool):
    got, _ = kvstore(tool, "run", pool, "--host", "0", "--hosts", "1", "--blocks", "6", "--sizes", "4096,16384")
    assert got["stored"] == 6 and got["loaded"] == 6 and got["mismatched"] == 0 and got["missing"] == 0
    assert got["shared_won"] == 1 and got["shared_owner"] == 0
    with kv.Store.open(pool) as s:
        assert s.get("h0/b5") == pattern("h0/b5", 16384) and s.get("shared") == pattern("shared", 4096, salt=1)


def test_c_eviction_keeps_the_store_clean(tool, pool):
    with kv.Store.open(pool) as s:
        arena = s.sb["arena_bytes"]
    blocks = 3 * arena // (1 << 20)
    got, _ = kvstore(tool, "bench", pool, "--host", "1", "--blocks", "4", "--size", "1M")
    assert got["stored"] == 4 and got["loaded"] == 4 and got["base"] == kv.HOME     # a file: the store's home
    for i in range(blocks):
        kvstore(tool, "put", pool, "--host", "1", "--key", f"e{i}", "--size", "1M")
    with kv.Store.open(pool) as s:
        st = s.stats()["hosts"][1]
        assert st["evictions"] >= blocks - arena // (1 << 20) and st["bytes"] <= arena
        assert s.verify()["bad"] == [] and s.get(f"e{blocks - 1}") == pattern(f"e{blocks - 1}", 1 << 20)


def test_bad_input_is_one_line(tool, pool, tmp_path):
    _, err = kvstore(tool, "put", pool, "--host", "7", "--key", "k", "--size", "8", status=2)
    assert err == f"kvstore: {pool} host 7 is out of range (0 <= host < 4)\n"
    blank = tmp_path / "blank"
    blank.write_bytes(bytes(4 << 20))
    _, err = kvstore(tool, "verify", str(blank), status=2)
    assert err == f"kvstore: {blank} holds no store (no PFKVSTOR magic at byte 2097152); format it first\n"
    _, err = kvstore(tool, "put", pool, "--host", "0", "--key", "k", "--size", "12", status=2)
    assert err == "kvstore: --size 12 is not a multiple of 8\n"
    _, err = kvstore(tool, "verify", pool, "--base", "1000", status=2)
    assert err == "kvstore: --base 1000 is not a multiple of 4096\n"
    _, err = kvstore(tool, "verify", pool, "--base", "32M", status=2)
    assert err == f"kvstore: {pool}: --base 33554432 leaves no room for a store in its 33554432 bytes\n"
    _, err = kvstore(tool, "verify", pool, "--base", "two", status=2)
    assert err.startswith("kvstore: bad value 'two' for --base") and err.count("\n") == 1


def test_the_store_lives_at_home_and_any_base_is_one_store_for_both_sides(tool, tmp_path):
    """Python's default base (HOME in a file) is the tool's; a store formatted elsewhere opens with
    that base on both sides, and the default names where it is."""
    path = tmp_path / "pool"
    path.write_bytes(b"")
    os.truncate(path, 16 << 20)
    kv.format(str(path), hosts=2, slots=16, chunk_tokens=256)
    with open(path, "rb") as f:
        assert f.read(8) == bytes(8) and f.seek(kv.HOME) and f.read(8) == kv.MAGIC
    kvstore(tool, "put", str(path), "--host", "1", "--key", "home", "--size", "4096")
    with kv.Store.open(str(path)) as s:
        assert s.get("home") == pattern("home", 4096)
    kv.format(str(path), hosts=2, slots=16, chunk_tokens=256, base=1 << 20, size=1 << 20)   # [1M, 2M)
    kvstore(tool, "put", str(path), "--base", "1M", "--host", "0", "--key", "mid", "--size", "8192")
    with kv.Store.open(str(path), base=1 << 20) as s:
        assert s.get("mid") == pattern("mid", 8192) and s.get("home") is None
    with kv.Store.open(str(path)) as s:           # the store at HOME was left alone
        assert s.get("home") == pattern("home", 4096) and s.get("mid") is None
    with open(path, "r+b") as f:                  # a store only at byte 0: the default says where it is
        f.seek(kv.HOME)
        f.write(bytes(8))
    kv.format(str(path), hosts=2, slots=16, chunk_tokens=256, base=0)
    _, err = kvstore(tool, "verify", str(path), status=2)
    assert err == (f"kvstore: {path} holds no store (no PFKVSTOR magic at byte 2097152); one starts at byte 0: "
                   "open it with --base 0\n")
    with pytest.raises(kv.KVError, match="one starts at byte 0: open it with base 0"):
        kv.Store.open(str(path))
    assert kvstore(tool, "verify", str(path), "--base", "0")[0]["good"] == 0


def test_a_block_on_the_devices_poison_list_is_a_miss_and_verify_names_it(tool, pool, tmp_path):
    """Only the memdev with the asked serial counts (the other's error covers everything)."""
    with kv.Store.open(pool, host=0) as s:
        s.put("clean", pattern("clean", 8192))
        s.put("hit", pattern("hit", 8192))
        (_, slot, rec), = s.find("hit")
    env = fake_cxl(tmp_path, rec)

    def tool_run(*args):
        return subprocess.run([str(tool), *args], capture_output=True, text=True, timeout=60, env=env)

    got = tool_run("get", pool, "--key", "hit", "--poison-serial", "1346768897")
    assert got.returncode == 1 and json.loads(got.stdout)["hit"] == 0
    assert json.loads(got.stdout)["poisoned"] == {"host": 0, "slot": slot, "offset": rec["offset"], "length": 8192}
    assert tool_run("get", pool, "--key", "clean", "--poison-serial", "1346768897").returncode == 0
    assert tool_run("get", pool, "--key", "hit").returncode == 0            # without the list: the bytes are fine
    done = tool_run("verify", pool, "--poison-serial", "1346768897")
    assert done.returncode == 1 and json.loads(done.stdout) == {"tool": "kvstore", "op": "verify", "good": 1, "bad": 1,
                                                                "claims": 0, "poison_ranges": 1}
    assert done.stderr == (f"kvstore: bad block: host 0 slot {slot} key {kv.key_digest('hit').hex()} offset "
                           f"{rec['offset']} length 8192: poisoned (the device's poison list)\n")


def fake_cxl(tmp_path, rec) -> dict:
    """`cxl` cannot run on the host: a stand-in prints what ndctl 81's `cxl list -M -L` printed in
    the guest (docs/notes/qemu-10-facts.md) for two memdevs, the second with a media error on `rec`'s block; the
    environment that finds it first on PATH."""
    listing = [{"memdev": "mem1", "serial": 7, "media_errors": [{"offset": 0, "length": 1 << 24}]},
               {"memdev": "mem0", "ram_size": 1 << 30, "serial": 1346768897,
                "media_errors": [{"offset": kv.HOME + rec["offset"] + 4096, "length": 128, "source": "Injected"}]}]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "cxl").write_text(f"#!/bin/sh\ncat <<'END'\n{json.dumps(listing)}\nEND\n")
    (fake / "cxl").chmod(0o755)
    return dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")


@pytest.mark.parametrize("cxl", ["exec sleep 600", "head -c 3000000 /dev/zero | tr '\\0' x"])
def test_a_poison_list_that_does_not_come_is_one_line_not_a_wait_for_ever(tool, pool, tmp_path, cxl):
    """`cxl list -M -L` that does not answer (a device whose mailbox hangs), or prints more than
    the reader has room for: `kvstore get|verify --poison-serial` waited for ever (more than 5
    minutes in a guest); now one line and exit 2 after --poison-timeout."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "cxl").write_text(f"#!/bin/sh\n{cxl}\n")
    (fake / "cxl").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")
    for action in (["get", pool, "--key", "k"], ["verify", pool]):
        wait = 1 if cxl.startswith("exec sleep") else 60
        done = subprocess.run([str(tool), *action, "--poison-serial", "7", "--poison-timeout", str(wait)],
                              capture_output=True, text=True, timeout=90, env=env)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr == ("kvstore: cxl list -M -L did not answer within 1 s (the device's poison list is "
                               "unknown; --poison-timeout sets the wait)\n" if wait == 1 else
                               "kvstore: cxl list -M -L printed more than 1048575 bytes\n")
    if cxl.startswith("exec sleep"):
        old_path = os.environ["PATH"]
        os.environ["PATH"] = env["PATH"]
        try:
            with pytest.raises(OSError, match=r"^cxl list -M -L did not answer within 0.5 s \(the device's poison "
                                              r"list is unknown\)$"):
                poison.media_errors(7, timeout_s=0.5)
        finally:
            os.environ["PATH"] = old_path


def test_the_python_reader_consults_the_poison_list_too(pool, tmp_path, monkeypatch):
    with kv.Store.open(pool, host=0) as s:
        s.put("clean", b"c" * 8192)
        s.put("hit", b"h" * 8192)
        (_, slot, rec), = s.find("hit")
        monkeypatch.setenv("PATH", fake_cxl(tmp_path, rec)["PATH"])
        s.poisoned = poison.media_errors(1346768897)
        assert s.poisoned == [(kv.HOME + rec["offset"] + 4096, 128)]     # a device address
        assert s.get("hit") is None and s.get("clean") == b"c" * 8192
        assert s.verify()["bad"] == [dict(host=0, slot=slot, key=kv.key_digest("hit").hex(),
                                          why="poisoned (the device's poison list)")]
        with pytest.raises(OSError, match="no memdev with serial 5"):
            poison.media_errors(5)


def test_empty_blocks_and_c_puts_share_one_arena_without_looping(tool, tmp_path):
    """Python stores empty blocks (they take no room); the C tool's placement walks past them. A
    generated mix of Python puts (empty ones among them) and C puts in one small arena, with
    evictions: every C put returns (bounded by the subprocess timeout), both sides read every
    block still stored bit-exact, and verify is clean on both sides."""
    import random
    path = kv_pool(tmp_path, 8 << 20, hosts=4, slots=16)
    rng = random.Random(21)
    stored = {}
    for i in range(40):
        name = f"mix{i}"
        if rng.random() < 0.5:
            data = b"" if rng.random() < 0.4 else bytes([i]) * rng.choice([1, 100, 4096, 70000])
            with kv.Store.open(path, host=0) as s:
                assert s.put(name, data)
            stored[name] = data
        else:
            size = rng.choice([8, 4096, 65536, 200000])
            got, _ = kvstore(tool, "put", path, "--host", "0", "--key", name, "--size", str(size))
            assert got["stored"] == 1
            stored[name] = pattern(name, size)
    with kv.Store.open(path) as s:
        alive = {k: v for k, v in stored.items() if s.get(k) is not None}
        assert alive and all(s.get(k) == v for k, v in alive.items())
        assert any(v == b"" for v in alive.values())
        assert s.verify()["bad"] == []
    for name, data in alive.items():
        got, _ = kvstore(tool, "get", path, "--key", name)
        assert got["hit"] == 1 and got["length"] == len(data) and int(got["crc32"], 16) == __import__("zlib").crc32(data)
    assert kvstore(tool, "verify", path)[0]["bad"] == 0


def test_a_c_put_after_a_python_empty_block_returns(tool, pool):
    with kv.Store.open(pool, host=0) as s:
        assert s.put("empty", b"")
    got, _ = kvstore(tool, "put", pool, "--host", "0", "--key", "after", "--size", "4096")
    assert got["stored"] == 1
    with kv.Store.open(pool) as s:
        assert s.get("empty") == b"" and s.get("after") == pattern("after", 4096)


@pytest.mark.parametrize("hosts,owner", [(1, 0), (3, 0), (3, 2)])
@pytest.mark.parametrize("k1_size,k2_size", [(4096, 4096), (4096, 65536), (65536, 8), (8, 1 << 20)])
def test_a_c_reader_never_returns_the_block_that_replaced_its_key_in_the_same_slot(paused_tool, tmp_path, hosts,
                                                                                   owner, k1_size, k2_size):
    """The C reader: the owner evicts k1 and publishes k2 in the same slot (one
    slot per host) while the C `get` of k1 is paused between the key match and the record read.
    The record no longer holds k1: a miss, never k2's block (whose crc is k2's, so it passed)."""
    path = kv_pool(tmp_path, 32 << 20, hosts=hosts, slots=1)
    paused_r, paused_w = os.pipe()
    resume_r, resume_w = os.pipe()
    with kv.Store.open(path, host=owner) as owner_store:
        assert owner_store.put("k1", pattern("k1", k1_size))
        reader = subprocess.Popen([str(paused_tool), "get", path, "--key", "k1", "--size", str(k1_size)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  pass_fds=(paused_w, resume_r),
                                  env={**os.environ, "PFCXL_KV_TEST_PAUSE": f"{paused_w},{resume_r}"})
        os.close(paused_w)
        os.close(resume_r)
        try:
            assert select.select([paused_r], [], [], 60)[0], "the C reader never matched k1's key"
            assert os.read(paused_r, 1) == b"m"
            assert owner_store.put("k2", pattern("k2", k2_size))      # k1 evicted, k2 in its slot
            os.write(resume_w, b"r")
            out, err = reader.communicate(timeout=60)
        finally:
            reader.kill()
            reader.wait()
            os.close(paused_r)
            os.close(resume_w)
    got = json.loads(out)
    k2_crc = f"{zlib.crc32(pattern('k2', k2_size)):#010x}"
    assert got["hit"] == 0, f"k1 read as {got['length']} bytes, crc {got['crc32']} (k2's block: {k2_crc}); {err}"
    # the store itself is whole: k2 is there for any reader, k1 is gone
    assert kvstore(paused_tool, "get", path, "--key", "k2", "--size", str(k2_size))[0]["match"] == 1
    assert kvstore(paused_tool, "get", path, "--key", "k1", status=1)[0]["hit"] == 0
