"""The store's index (guest/python/pfcxl_kvlayout.py WINDOW): a lookup reads a fixed number of index
lines per host whatever the slot count, also while the owner evicts and withdraws; a key is still
found wherever its window wraps; a store of another version is refused in one line."""

import hashlib
import multiprocessing
import os
import struct
import zlib

import pytest

from pfcxl.guest.python import pfcxl_kvstore as kv

pytestmark = pytest.mark.component

PER_LOOKUP = kv.WINDOW * kv.LINE            # index bytes a lookup reads in each host's segment


def value(key: bytes, size: int = 512) -> bytes:
    return hashlib.blake2b(key, digest_size=64).digest() * (size // 64)


def pool(tmp_path, hosts: int, slots: int, arena: int = 1 << 20) -> str:
    path = tmp_path / "pool"
    path.write_bytes(b"")
    os.truncate(path, (4 << 20) + hosts * slots * kv.LINE + hosts * arena + (1 << 20))
    kv.format(str(path), hosts=hosts, slots=slots, chunk_tokens=256)
    return str(path)


@pytest.mark.parametrize("slots", [1024, 16384, 131072])
def test_a_lookup_reads_the_same_index_bytes_per_host_whatever_the_slot_count(tmp_path, slots):
    path = pool(tmp_path, hosts=3, slots=slots)
    keys = [b"k%d" % i for i in range(400)]
    with kv.Store.open(path, host=1) as w:
        for k in keys:
            assert w.put(k, value(k))
    found = 0
    with kv.Store.open(path) as r:
        for k in keys + [b"absent%d" % i for i in range(200)]:
            before = r.index_bytes
            data = r.get(k)
            assert r.index_bytes - before == 3 * PER_LOOKUP
            assert data in ((None, value(k)) if k in keys else (None,))
            found += data is not None
        # a key is missing only where its window was full and its own LRU record made room
        assert found == len(keys) - r.stats()["hosts"][1]["evictions"] and found > 350


def _churn(path: str, puts: int) -> None:
    """Host 0 stores 1,500 keys of 4 KiB, more than its arena holds (evictions), and withdraws
    every third."""
    with kv.Store.open(path, host=0) as s:
        for i in range(puts):
            k = b"c%d" % (i % 3000)
            s.put(k, value(k, 4096))
            if i % 3 == 0:
                s.remove(b"c%d" % ((i * 7) % 3000))


def test_lookups_stay_bounded_and_right_while_the_owner_evicts_and_withdraws(tmp_path):
    path = pool(tmp_path, hosts=2, slots=4096)                      # arenas of about 2.5 MiB
    p = multiprocessing.get_context("fork").Process(target=_churn, args=(path, 1500))
    p.start()
    hits = lookups = 0
    with kv.Store.open(path) as r:
        while p.is_alive() or lookups < 2000:
            k = b"c%d" % (lookups % 3000)
            before = r.index_bytes
            data = r.get(k)
            assert r.index_bytes - before == 2 * PER_LOOKUP
            assert data in (None, value(k, 4096))
            hits += data is not None
            lookups += 1
    p.join()
    assert p.exitcode == 0 and hits > 0
    with kv.Store.open(path) as r:
        st = r.stats()
        assert st["hosts"][0]["evictions"] > 0 and r.verify()["bad"] == []


def test_keys_whose_window_wraps_past_the_last_slot_are_found_and_replaced(tmp_path):
    path = pool(tmp_path, hosts=1, slots=64)
    with kv.Store.open(path, host=0) as s:
        wrapping = [k for k in (b"w%d" % i for i in range(5000)) if kv.bucket(kv.key_digest(k), 64) > 64 - kv.WINDOW]
        for k in wrapping[:200]:                  # more than the window holds: its own LRU record goes
            assert s.put(k, value(k))
            assert s.get(k) == value(k)
        # buckets 49..63: their windows cover slots 49..63 and, wrapped, 0..14
        assert set(s.own) == set(range(49, 64)) | set(range(0, 15))
        assert s.stats()["hosts"][0]["evictions"] == 200 - 30
        assert s.verify() == {"good": 30, "bad": [], "claims": 0}


@pytest.mark.parametrize("version", [1, 2, 4])
def test_a_store_of_another_version_is_refused_in_one_line(tmp_path, version):
    path = pool(tmp_path, hosts=1, slots=64)
    with open(path, "r+b") as f:
        f.seek(kv.HOME)
        raw = bytearray(f.read(kv.SUPER.st.size))
        struct.pack_into("<I", raw, kv.SUPER.offset["version"], version)
        struct.pack_into("<I", raw, len(raw) - 4, zlib.crc32(raw[:-4]))
        f.seek(kv.HOME)
        f.write(raw)
    with pytest.raises(kv.KVError, match=f"version {version}") as e:
        kv.Store.open(path)
    assert "\n" not in str(e.value)
