"""The KV block store (guest/python/pfcxl_kvstore.py) on a regular file: several Store objects, or
several processes, stand for hosts mapping the same pool."""

import multiprocessing
import os
import signal
import time
import zlib

import pytest

from pfcxl.device.topology import data_path
from pfcxl.guest.python import pfcxl_kvstore as kv
from pfcxl.serving.chunks import KV_CHUNK_TOKENS, chunk_bytes
from pfcxl.serving.inputs import load_model

from .conftest import kv_pool as pool

SCALE = 1024        # chunks scaled down 1024x: 8B's 32 MiB chunk is 32 KiB, 405B's 126 MiB is 126 KiB

pytestmark = pytest.mark.component


def block(seed: int, size: int) -> bytes:
    return bytes((seed * 131 + i * 7) & 0xFF for i in range(256)) * (size // 256) + bytes(size % 256)


def test_every_host_reads_every_other_hosts_blocks_bit_exact(tmp_path):
    path = pool(tmp_path)
    sizes = [chunk_bytes(load_model(m).kv_bytes_per_token) // SCALE for m in ("llama-8b", "llama-405b")]
    stores = [kv.Store.open(path, host=h) for h in range(4)]
    try:
        tokens = list(range(4 * KV_CHUNK_TOKENS))
        stored = {}
        for h, s in enumerate(stores):
            for i, key in enumerate(kv.chunk_keys([t + 10000 * h for t in tokens], s.chunk_tokens)):
                data = block(h * 16 + i, sizes[i % 2])
                assert s.put(key, data)
                stored[key] = (h, data)
        assert len(stored) == 16
        for h, s in enumerate(stores):
            for key, (owner, data) in stored.items():
                assert s.get(key) == data, (h, owner)
        assert kv.Store.open(path).verify() == {"good": 16, "bad": [], "claims": 0}
    finally:
        for s in stores:
            s.close()


def test_chunk_keys_are_prefix_hashes_of_whole_chunks():
    a = kv.chunk_keys(list(range(600)), 256)
    b = kv.chunk_keys(list(range(512)) + [7] * 88, 256)
    c = kv.chunk_keys([1] + list(range(1, 600)), 256)
    assert len(a) == 2 and a == b                        # the partial tail has no key
    assert c[0] != a[0] and c[1] != a[1]                 # a changed first token changes every later key


def test_a_store_opened_without_a_host_refuses_what_needs_one_in_one_line(tmp_path):
    """Writing, and looking in our own segment alone, need a host: without one each is a KVError
    (alone used to reach `None * slots`, a TypeError), and what reads every segment still works."""
    path = pool(tmp_path, hosts=2)
    with kv.Store.open(path, host=1) as w:
        assert w.put(b"k", b"v" * 100)
    with kv.Store.open(path) as r:
        needs_a_host = [lambda: r.put(b"x", b"y"), lambda: r.find(b"k", alone=True),
                        lambda: r.load(b"k", alone=True), lambda: r.exists(b"k", alone=True)]
        for call in needs_a_host:
            with pytest.raises(kv.KVError, match="^this store was opened without a host: it can only read"):
                call()
        assert r.load(b"k") == (b"v" * 100, 1, 0) and r.exists(b"k") and r.get(b"missing") is None


def test_a_store_that_is_not_formatted_is_one_clear_error(tmp_path):
    path = tmp_path / "blank"
    path.write_bytes(bytes(4 << 20))
    with pytest.raises(kv.KVError, match="holds no store"):
        kv.Store.open(str(path), host=0)
    p = pool(tmp_path, hosts=2)
    with pytest.raises(kv.KVError, match=r"host 2 is out of range \(0 <= host < 2\)"):
        kv.Store.open(p, host=2)
    for base, why in ((1000, "store base 1000 is not a non-negative multiple of 4096"),
                      (-4096, "store base -4096 is not a non-negative multiple of 4096"),
                      (64 << 20, f"{p} is 67108864 bytes: too small for a store at byte 67108864")):
        with pytest.raises(kv.KVError, match=f"^{why}$"):
            kv.Store.open(p, base=base)
        with pytest.raises(kv.KVError, match=f"^{why}$"):
            kv.format(p, hosts=2, slots=4, chunk_tokens=KV_CHUNK_TOKENS, base=base)
    assert kv.Store.open(p).sb["hosts"] == 2                 # nothing half-written by the refusals


def test_the_store_lives_where_the_direct_paths_namespace_leaves_the_device_alone(tmp_path):
    """HOME is the direct device's byte 0 in its device (data_path.DIRECT_OFFSET); a file, like a
    CXL DAX device, holds the store there, and bytes below HOME stay the file's own."""
    assert kv.HOME == data_path.DIRECT_OFFSET
    p = pool(tmp_path, size=8 << 20, hosts=2)
    assert not kv.is_direct(p) and kv.default_base(p) == kv.HOME
    with open(p, "rb") as f:
        assert f.read(kv.HOME) == bytes(kv.HOME) and f.read(8) == kv.MAGIC
    with kv.Store.open(p, host=1) as s:
        assert s.m.base == s.m.device_off == kv.HOME and s.sb["total"] == (8 << 20) - kv.HOME
        assert s.put("x", b"y" * 5000)
        (_, _, rec), = s.find("x")
    with open(p, "rb") as f:
        assert f.read(kv.HOME) == bytes(kv.HOME)
        f.seek(kv.HOME + rec["offset"])
        assert f.read(5000) == b"y" * 5000


def test_a_full_arena_evicts_least_recently_used_blocks_and_verifies_clean(tmp_path):
    path = pool(tmp_path, size=4 << 20, hosts=2, slots=64)
    with kv.Store.open(path, host=0) as s:
        per_arena = s.sb["arena_bytes"] // (64 << 10)
        assert s.put("keep", block(0, 64 << 10)) and s.put("old", block(1, 64 << 10))
        for i in range(3 * per_arena):
            assert s.get("keep") == block(0, 64 << 10)        # used: stays
            assert s.put(f"k{i}", block(i + 2, 64 << 10))
        assert s.get("old") is None and s.get("keep") == block(0, 64 << 10)
        st = s.stats()
        assert st["hosts"][0]["evictions"] >= 2 * per_arena and st["hosts"][0]["blocks"] <= per_arena
        report = s.verify()
        assert report["bad"] == [] and report["good"] == st["blocks"]


def test_a_pinned_block_outlives_eviction_until_unpinned(tmp_path):
    # LMCache pins the chunks a lookup found until their retrieve (pfcxl/engines/lmcache.py)
    path = pool(tmp_path, size=4 << 20, hosts=2, slots=64)
    with kv.Store.open(path, host=0) as s, kv.Store.open(path, host=1) as other:
        per_arena = s.sb["arena_bytes"] // (64 << 10)
        assert s.put("pinned", block(0, 64 << 10)) and other.put("theirs", block(1, 4096))
        assert s.pin("pinned") and s.pin("pinned") and not s.pin("theirs") and not s.pin("absent")
        for i in range(2 * per_arena):
            assert s.put(f"k{i}", block(i + 2, 64 << 10))
        assert s.get("pinned") == block(0, 64 << 10)          # never the LRU victim while pinned
        assert s.unpin("pinned") and s.get("pinned") == block(0, 64 << 10)   # one pin left
        assert s.unpin("pinned") and not s.unpin("pinned")
        for i in range(2 * per_arena):
            s.put(f"j{i}", block(i + 9, 64 << 10))
        assert s.get("pinned") is None and s.verify()["bad"] == []


def test_an_arena_full_of_pinned_blocks_refuses_a_put_in_one_line(tmp_path):
    path = pool(tmp_path, size=4 << 20, hosts=2, slots=64)
    with kv.Store.open(path, host=0) as s:
        per_arena = s.sb["arena_bytes"] // (64 << 10)
        for i in range(per_arena):
            assert s.put(f"p{i}", block(i, 64 << 10)) and s.pin(f"p{i}")
        with pytest.raises(kv.KVError, match="^host 0 has no room for 65536 bytes and no unpinned block of its own "
                                             "to evict$"):
            s.put("more", block(99, 64 << 10))
        assert all(s.get(f"p{i}") == block(i, 64 << 10) for i in range(per_arena))


def test_a_corrupted_block_is_a_miss_and_verify_names_it(tmp_path):
    path = pool(tmp_path, hosts=2)
    with kv.Store.open(path, host=1) as s:
        s.put("victim", block(3, 8192))
        s.put("fine", block(4, 8192))
        (host, slot, rec), = s.find("victim")
        s.m.mem[rec["offset"] + 100] ^= 0xFF                    # what poison or a torn copy would leave
        assert s.get("victim") is None and s.get("fine") == block(4, 8192)
        assert s.verify()["bad"] == [dict(host=1, slot=slot, key=kv.key_digest("victim").hex(),
                                         why="block fails its crc")]


# ---------------------------------------------------------------- several processes

ROUNDS, PRODUCERS, CONTENDED = 20, 6, 64 << 10


def _producer(path, host, start, results):
    with kv.Store.open(path, host=host, stale_s=2.0) as s:
        for r in range(ROUNDS):
            while time.monotonic() < start + 0.05 * r:       # every producer starts round r at once
                pass
            results.put((r, host, s.put(f"contended-{r}", block(100 + host, CONTENDED))))


def _reader(path, start, stop, results):
    whole = {block(100 + h, CONTENDED): h for h in range(PRODUCERS)}
    seen = {}
    with kv.Store.open(path) as s:
        while time.monotonic() < start:
            pass
        while not stop.is_set():
            r = int((time.monotonic() - start) / 0.05) % ROUNDS
            data = s.get(f"contended-{r}")
            if data is not None:
                seen.setdefault(r, set()).add(whole.get(data, "torn"))
    results.put(seen)


def test_concurrent_producers_of_one_key_have_exactly_one_winner_and_readers_never_see_a_torn_block(tmp_path):
    path = pool(tmp_path, hosts=8)
    ctx = multiprocessing.get_context("fork")
    results, seen, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    start = time.monotonic() + 0.5
    readers = [ctx.Process(target=_reader, args=(path, start, stop, seen)) for _ in range(2)]
    producers = [ctx.Process(target=_producer, args=(path, h, start, results)) for h in range(PRODUCERS)]
    for p in readers + producers:
        p.start()
    outcome = [results.get(timeout=120) for _ in range(ROUNDS * PRODUCERS)]
    stop.set()
    views = [seen.get(timeout=60) for _ in readers]
    for p in readers + producers:
        p.join(timeout=60)
    with kv.Store.open(path) as s:
        for r in range(ROUNDS):
            winners = [h for rr, h, won in outcome if rr == r and won]
            assert len(winners) == 1, (r, winners)
            (owner, _, _), = s.find(f"contended-{r}")
            assert owner == winners[0] and s.get(f"contended-{r}") == block(100 + owner, CONTENDED)
            for view in views:                           # only the winner's whole block, ever
                assert view.get(r, set()) <= {winners[0]}, (r, view.get(r))


def _slow_producer(path):
    with kv.Store.open(path, host=1, stale_s=1.0) as s:
        s.put("crash", block(9, 256 << 20))


def test_kill_9_in_the_middle_of_a_store_exposes_nothing_and_the_next_writer_succeeds(tmp_path):
    path = pool(tmp_path, size=600 << 20, hosts=2, slots=16)
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_slow_producer, args=(path,))
    child.start()
    with kv.Store.open(path, host=0, stale_s=1.0) as s:
        claimed = lambda: any(state & 1 for h, _, _, state in s.scan() if h == 1)
        deadline = time.monotonic() + 60
        while not claimed() and time.monotonic() < deadline:
            pass
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert claimed()                                  # killed while its claim stood
        assert s.get("crash") is None
        assert s.verify() == {"good": 0, "bad": [], "claims": 1}
        assert s.put("crash", block(9, 1 << 20))          # host 1 stopped beating: its claim is stale
        assert s.get("crash") == block(9, 1 << 20)
    with kv.Store.open(path, host=1, stale_s=1.0) as again:    # host 1 back (its lease expired): claim withdrawn
        assert again.verify() == {"good": 1, "bad": [], "claims": 0}
        assert not again.put("crash", block(9, 1 << 20))  # stored already, by host 0


def test_a_reader_never_returns_the_block_that_replaced_its_key_in_the_same_slot(tmp_path, monkeypatch):
    """The owner evicts k1 and publishes k2 in the same slot between the reader's index match and
    its read of the record: the record no longer holds k1, so the read is a miss, never k2's bytes."""
    path = pool(tmp_path, hosts=2, slots=1)
    with kv.Store.open(path, host=0) as owner, kv.Store.open(path) as reader:
        assert owner.put("k1", block(1, 4096))
        matched = kv.Store._slots_keyed

        def owner_races(self, host, digest):
            for slot in matched(self, host, digest):
                if self is reader:
                    assert owner.put("k2", block(2, 4096))   # one slot: k1 evicted, k2 published there
                yield slot
        monkeypatch.setattr(kv.Store, "_slots_keyed", owner_races)
        assert reader.get("k1") is None
        monkeypatch.undo()
        assert reader.get("k2") == block(2, 4096) and reader.get("k1") is None


def _keys_in(slots: int, buckets: list[int]) -> list[str]:
    """One key for each bucket asked for."""
    found: dict[int, str] = {}
    for i in range(100000):
        b = kv.bucket(kv.key_digest(f"k{i}"), slots)
        if b in buckets and b not in found:
            found[b] = f"k{i}"
        if len(found) == len(buckets):
            return [found[b] for b in buckets]
    raise AssertionError(f"no keys for buckets {buckets}")


def test_verify_names_overlapping_blocks_but_not_one_a_writer_moved_while_it_scanned(tmp_path, monkeypatch):
    """A writer withdrew slot 2's block while verify scanned and stored another key, in slot 9, in
    the same space: both looked good when read, but not at once ("block overlaps slot 25's" while
    writers ran). Two records that stand at once over one extent are reported."""
    path = pool(tmp_path, 8 << 20, hosts=1, slots=16)
    kv.format(path, hosts=1, slots=16, chunk_tokens=256, size=(8 << 10) + (4 << 10) + 2 * 4096)    # 2 blocks
    first, filler, second, third = _keys_in(16, [2, 5, 9, 12])
    with kv.Store.open(path, host=0) as w, kv.Store.open(path) as r:
        assert w.sb["arena_bytes"] == 2 * 4096 and w.put(first, block(1, 4096)) and w.put(filler, block(4, 4096))
        (_, _, was), = w.find(first)
        read_block = r.read_block

        def moving(host, slot, rec):
            data = read_block(host, slot, rec)
            if slot == 2:                            # verify read it: the writer moves on, into its space
                assert w.remove(first) and w.put(second, block(2, 4096))
                assert w.find(second)[0][:2] == (0, 9) and w.find(second)[0][2]["offset"] == was["offset"]
            return data
        monkeypatch.setattr(r, "read_block", moving)
        assert r.verify() == {"good": 3, "bad": [], "claims": 0}
        monkeypatch.undo()
        (_, _, rec), = w.find(second)                # a record forged over the same extent: corruption
        forged = dict(rec, state=2 * (w.header(0)["next_seq"] + 1), key=kv.key_digest(third), rcrc=0)
        raw = bytearray(kv.RECORD.pack(**forged))
        raw[kv.SIGNED:kv.SIGNED + 4] = zlib.crc32(raw[:kv.SIGNED]).to_bytes(4, "little")
        w.m.mem[w._slot_at(0, 12):w._slot_at(0, 12) + kv.LINE] = raw
        assert r.verify()["bad"] == [dict(host=0, slot=12, why="block overlaps slot 9's")]
