"""slices (guest/src/slices.c): N concurrent "hosts" sharing one MAP_SHARED file.

The tool is compiled exactly as for the guest image (gcc -static -O2 -Wall -Wextra -Werror) and
run as N processes at once on one sparse file, which they map with MAP_SHARED just as the guests
map /dev/dax0.0. Each process fills its own slice, publishes a flag, waits for every other flag
and then verifies the other slices; the file is checked independently with pfcxl.guest.pattern.

Exit status contract: 0 all slices and crcs good, 1 a mismatch, 2 any error (including a
timeout waiting for flags, which also prints a JSON line naming the missing hosts).
"""

from __future__ import annotations

import json
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from pfcxl.guest import pattern

from .conftest import compile_guest_tool, sparse_file

MiB = 1 << 20
FILE_SIZE = 64 * MiB
SLICE = MiB
FLAG_MAGIC = 0x5046_4C41_4700_0000

pytestmark = pytest.mark.component


@pytest.fixture(scope="module")
def slices() -> Path:
    return compile_guest_tool("slices")


@pytest.fixture
def dev(tmp_path) -> Path:
    """A 64 MiB sparse file standing in for /dev/dax0.0."""
    return sparse_file(tmp_path / "pool.img", FILE_SIZE)


def seed(epoch: int, host: int) -> int:
    return (epoch * 256 + host) & 0xFFFF


def base_of(hosts: int, flags_offset: int = 0) -> int:
    end = flags_offset + 64 * hosts
    return -(-end // (2 * MiB)) * (2 * MiB)


def read_range(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def write_range(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def run(slices: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(slices), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def run_hosts(slices: Path, dev: Path, hosts: list[int], n: int, *extra) -> dict[int, tuple]:
    """Start one process per host at once; return {host: (returncode, stdout, stderr)}."""
    procs = {h: subprocess.Popen([str(slices), str(dev), "--host", str(h), "--hosts", str(n),
                                  *map(str, extra)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for h in hosts}
    results = {}
    try:
        for h, p in procs.items():
            out, err = p.communicate(timeout=120)
            results[h] = (p.returncode, out, err)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def one_json(rc_out_err: tuple, rc: int) -> dict:
    code, out, err = rc_out_err
    assert code == rc, (code, out, err)
    assert out.endswith("\n") and out.count("\n") == 1, out
    doc = json.loads(out)
    assert doc["tool"] == "slices"
    return doc


def flag_words(dev: Path, host: int, flags_offset: int = 0) -> tuple[int, int]:
    return struct.unpack("<QQ", read_range(dev, flags_offset + 64 * host, 16))


def run_all(slices, dev, n=4, epoch=None, slice_=SLICE, flags_offset=None) -> dict[int, dict]:
    extra = ["--slice", "1M" if slice_ == MiB else slice_, "--timeout", 60]
    if epoch is not None:
        extra += ["--epoch", epoch]
    if flags_offset is not None:
        extra += ["--flags-offset", flags_offset]
    res = run_hosts(slices, dev, list(range(n)), n, *extra)
    docs = {h: one_json(r, 0) for h, r in res.items()}
    for r in res.values():
        assert r[2] == ""
    return docs


# ------------------------------------------------------------------------- the happy path

def test_four_hosts_fill_publish_and_verify_each_other(slices, dev):
    n, epoch = 4, 1
    docs = run_all(slices, dev, n=n)
    base = base_of(n)
    assert base == 2 * MiB
    own = {}
    for h, d in docs.items():
        assert (d["host"], d["hosts"], d["epoch"], d["slice"]) == (h, n, epoch, SLICE)
        assert (d["op"], d["base"], d["flags_offset"], d["dev"]) == ("run", base, 0, str(dev))
        assert [v["host"] for v in d["verified"]] == [k for k in range(n) if k != h]
        for v in d["verified"]:
            assert v["mismatches"] == 0 and v["first_mismatch"] is None
            assert v["crc32"] == v["published_crc32"]
        assert d["mismatches"] == 0
        for key in ("wait_ns", "fill_ns", "verify_ns"):
            assert isinstance(d[key], int) and d[key] >= 0
        own[h] = int(d["own_crc32"], 16)

    for h in range(n):
        start = base + h * SLICE
        expected = pattern.pattern_bytes(seed(epoch, h), start, SLICE)
        assert read_range(dev, start, SLICE) == expected
        assert own[h] == pattern.crc32(expected)
        # everyone else read exactly what h published
        for k in range(n):
            if k != h:
                (v,) = [v for v in docs[k]["verified"] if v["host"] == h]
                assert int(v["crc32"], 16) == own[h]
        assert flag_words(dev, h) == (FLAG_MAGIC | epoch, own[h])
    # the slices differ from host to host
    assert len(set(own.values())) == n
    # nothing past the last slice, nor between the flags and the base, was written
    assert read_range(dev, 64 * n, base - 64 * n) == bytes(base - 64 * n)
    tail = base + n * SLICE
    assert read_range(dev, tail, FILE_SIZE - tail) == bytes(FILE_SIZE - tail)
    assert dev.stat().st_size == FILE_SIZE


def test_flags_offset_moves_flags_and_base(slices, dev):
    n, fo, epoch = 2, 3 * MiB + 64, 5
    docs = run_all(slices, dev, n=n, epoch=epoch, slice_=64 * 1024 + 8, flags_offset=fo)
    base = base_of(n, fo)
    assert base == 4 * MiB
    for h, d in docs.items():
        assert (d["base"], d["flags_offset"], d["epoch"], d["mismatches"]) == (base, fo, epoch, 0)
        start = base + h * (64 * 1024 + 8)
        data = read_range(dev, start, 64 * 1024 + 8)
        assert data == pattern.pattern_bytes(seed(epoch, h), start, 64 * 1024 + 8)
        assert flag_words(dev, h, fo) == (FLAG_MAGIC | epoch, zlib.crc32(data))
    assert read_range(dev, 0, fo) == bytes(fo)


# ------------------------------------------------------------------------- waiting and epochs

def test_lone_host_times_out_naming_the_missing_host(slices, dev):
    res = run_hosts(slices, dev, [0], 2, "--slice", "1M", "--timeout", 1)
    doc = one_json(res[0], 2)
    assert doc["error"] == "timeout" and doc["missing"] == [1]
    assert doc["flags_seen"] == ["0x0000000000000000"]
    assert doc["wait_ns"] >= 1_000_000_000
    err = res[0][2]
    assert err.startswith("slices: ") and err.count("\n") == 1 and "host(s) 1" in err
    # host 0 did its part before waiting
    start = base_of(2)
    expected = pattern.pattern_bytes(seed(1, 0), start, SLICE)
    assert read_range(dev, start, SLICE) == expected
    assert flag_words(dev, 0) == (FLAG_MAGIC | 1, zlib.crc32(expected))


def test_flags_of_an_older_epoch_are_not_signals(slices, dev):
    run_all(slices, dev, n=3, epoch=1)
    res = run_hosts(slices, dev, [0], 3, "--slice", "1M", "--epoch", 2, "--timeout", 0,
                    "--verify-only")
    doc = one_json(res[0], 2)
    assert doc["missing"] == [0, 1, 2]
    assert doc["flags_seen"] == [f"0x{FLAG_MAGIC | 1:016x}"] * 3


def test_reset_clears_flag_lines_only(slices, dev):
    n = 3
    run_all(slices, dev, n=n)
    before = read_range(dev, 2 * MiB, n * SLICE)
    r = run(slices, dev, "--reset", "--hosts", n)
    doc = one_json((r.returncode, r.stdout, r.stderr), 0)
    assert doc == {"tool": "slices", "op": "reset", "dev": str(dev), "hosts": n,
                   "flags_offset": 0, "lines": n}
    assert read_range(dev, 0, 64 * n) == bytes(64 * n)
    assert read_range(dev, 2 * MiB, n * SLICE) == before
    res = run_hosts(slices, dev, [1], n, "--slice", "1M", "--timeout", 0, "--verify-only")
    assert one_json(res[1], 2)["missing"] == [0, 1, 2]


# ------------------------------------------------------------------------- corruption

def test_verify_only_detects_a_corrupted_slice(slices, dev):
    n, epoch = 4, 2
    docs = run_all(slices, dev, n=n, epoch=epoch)
    base = base_of(n)
    published0 = int(docs[0]["own_crc32"], 16)

    bad = base + 0 * SLICE + 4096 + 16
    write_range(dev, bad, struct.pack("<Q", 0xDEAD_BEEF_CAFE_F00D))
    before = read_range(dev, 0, base + n * SLICE)

    res = run_hosts(slices, dev, [0, 1, 2, 3], n, "--slice", "1M", "--epoch", epoch,
                    "--timeout", 60, "--verify-only")
    # host 0 does not check its own slice, so it sees nothing wrong
    d0 = one_json(res[0], 0)
    assert d0["op"] == "verify" and d0["own_crc32"] is None and d0["fill_ns"] is None
    assert d0["mismatches"] == 0
    for h in (1, 2, 3):
        d = one_json(res[h], 1)
        assert d["op"] == "verify" and d["own_crc32"] is None
        assert d["mismatches"] == 1
        for v in d["verified"]:
            if v["host"] == 0:
                assert v["mismatches"] == 1 and v["first_mismatch"] == bad
                assert int(v["published_crc32"], 16) == published0
                assert int(v["crc32"], 16) == zlib.crc32(read_range(dev, base, SLICE))
                assert v["crc32"] != v["published_crc32"]
            else:
                assert v["mismatches"] == 0 and v["crc32"] == v["published_crc32"]
    # --verify-only wrote nothing: flags and slices are as they were
    assert read_range(dev, 0, base + n * SLICE) == before


def test_tampered_published_crc_alone_fails(slices, dev):
    n, epoch = 2, 7
    run_all(slices, dev, n=n, epoch=epoch)
    word0, crc1 = flag_words(dev, 1)
    write_range(dev, 64 + 8, struct.pack("<Q", crc1 ^ 1))
    res = run_hosts(slices, dev, [0], n, "--slice", "1M", "--epoch", epoch, "--timeout", 5,
                    "--verify-only")
    d = one_json(res[0], 1)
    assert d["mismatches"] == 0
    (v,) = d["verified"]
    assert int(v["crc32"], 16) == crc1 and int(v["published_crc32"], 16) == crc1 ^ 1


def test_rerun_same_epoch_then_new_epoch(slices, dev):
    """A host withdraws its old signal before rewriting; a new epoch rewrites every slice."""
    n = 2
    run_all(slices, dev, n=n, epoch=1)
    run_all(slices, dev, n=n, epoch=1)
    run_all(slices, dev, n=n, epoch=2)
    for h in range(n):
        start = base_of(n) + h * SLICE
        assert read_range(dev, start, SLICE) == pattern.pattern_bytes(seed(2, h), start, SLICE)


# ------------------------------------------------------------------------- interface

def test_help(slices):
    res = run(slices, "--help")
    assert res.returncode == 0 and res.stderr == ""
    for words in ("--verify-only", "--reset", "--flags-offset", "emulator time",
                  "rounded up to 2 MiB", "0x50464c4147000000"):
        assert words in res.stdout, words
    assert run(slices, "x", "-h").stdout == res.stdout


@pytest.mark.parametrize("args", [
    [],
    ["{dev}"],
    ["{dev}", "--host", "0", "--slice", "1M"],                        # no --hosts
    ["{dev}", "--hosts", "2", "--slice", "1M"],                       # no --host
    ["{dev}", "--host", "0", "--hosts", "2"],                         # no --slice
    ["{dev}", "--host", "2", "--hosts", "2", "--slice", "1M"],
    ["{dev}", "--host", "0", "--hosts", "0", "--slice", "1M"],
    ["{dev}", "--host", "0", "--hosts", "257", "--slice", "8"],
    ["{dev}", "--host", "0", "--hosts", "2", "--slice", "12"],
    ["{dev}", "--host", "0", "--hosts", "2", "--slice", "0"],
    ["{dev}", "--host", "0", "--hosts", "2", "--slice", "1X"],
    ["{dev}", "--host", "0", "--hosts", "2", "--slice", "1M", "--epoch", str(1 << 24)],
    ["{dev}", "--host", "0", "--hosts", "2", "--slice", "1M", "--flags-offset", "32"],
    ["{dev}", "--host", "0", "--hosts", "2", "--slice", "1M", "--timeout", "-1"],
    ["{dev}", "--host", "0", "--hosts", "2", "--slice", "1M", "--bogus", "1"],
    ["{dev}", "--host", "0", "--hosts", "2", "--slice", "1M", "--host", "1"],
    ["{dev}", "--host", "0", "--hosts", "2", "--slice", "1M", "--verify-only=1"],
    ["{dev}", "--host", "0", "--hosts", "2", "--slice", "1M", "extra"],
    ["{dev}", "--host", "0", "--hosts", "2", "--slice", "32M"],       # 2 MiB + 64 MiB > file
    ["{dev}", "--reset", "--hosts", "2", "--slice", "1M"],
    ["{dev}", "--reset"],
    ["{missing}", "--host", "0", "--hosts", "2", "--slice", "1M"],
])
def test_bad_args_exit_2_with_one_line(slices, dev, args):
    argv = [a.format(dev=dev, missing=dev.with_name("absent.img")) for a in args]
    before = read_range(dev, 0, 4 * MiB)
    res = run(slices, *argv)
    assert res.returncode == 2, (argv, res.stdout, res.stderr)
    assert res.stdout == ""
    assert res.stderr.startswith("slices: ") and res.stderr.count("\n") == 1, res.stderr
    assert read_range(dev, 0, 4 * MiB) == before
