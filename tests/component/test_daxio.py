"""daxio (guest/src/daxio.c) against its host-side mirror pfcxl.guest.pattern, on regular files.

daxio is compiled here exactly as for the guest image (gcc -static -O2 -Wall -Wextra -Werror),
then run on sparse temporary files, which it maps with MAP_SHARED just like /dev/dax0.0.

Exit status contract checked here: 0 success, 1 only for "verify found mismatches", 2 for every
error -- bad arguments, a range past the end of the file, and OS errors such as open() failing
(a missing file). An error never exits 1, so a caller can tell "data wrong" from "could not run".
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from pfcxl.guest import pattern

from .conftest import compile_guest_tool, sparse_file

MiB = 1 << 20
FILE_SIZE = 4 * MiB
# Starts 8 bytes past a 4 KiB page and ends in the next 2 MiB window: exercises the window
# rounding (map from 0, length 4 MiB) and offsets counted from the device start.
OFF = 2 * MiB - 4096 + 8
SIZE = 64 * 1024 + 8 * 3
SEED = 0x1234

pytestmark = pytest.mark.component


@pytest.fixture(scope="module")
def daxio() -> Path:
    return compile_guest_tool("daxio")


@pytest.fixture
def dev(tmp_path) -> Path:
    """A 4 MiB sparse file standing in for /dev/dax0.0."""
    return sparse_file(tmp_path / "dax.img", FILE_SIZE)


def run(daxio: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(daxio), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def ok_json(res: subprocess.CompletedProcess, rc: int = 0) -> dict:
    assert res.returncode == rc, (res.returncode, res.stdout, res.stderr)
    assert res.stderr == ""
    assert res.stdout.endswith("\n") and res.stdout.count("\n") == 1, res.stdout
    out = json.loads(res.stdout)
    assert out["tool"] == "daxio"
    return out


def read_range(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def write_range(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


# ------------------------------------------------------------------------- the Python mirror

def test_word_known_values():
    assert pattern.word(0, 0) == 0x5046_0000_0000_0000
    assert pattern.word(7, 0x1FF008) == 0x5046_0700_0003_FE01
    # seed bits 48..55 overlap the magic: XOR, not OR
    assert pattern.word(0xFFFF, 8) == 0x50B9_FF00_0000_0001
    assert pattern.word(1, (1 << 64) - 8) == (0x5046_0000_0000_0000 ^ (1 << 40) ^ ((1 << 61) - 1))


@pytest.mark.parametrize("seed, offset, size", [
    (0, 0, 8),
    (7, OFF, 4096),
    (0xFFFF, 3 * MiB, 1024),
    (5, (1 << 43) - 64, 128),        # crosses the 2**40 word-index run boundary
    (9, (1 << 64) - 32, 32),         # last words of a 64-bit address space
])
def test_pattern_bytes_matches_word(seed, offset, size):
    data = pattern.pattern_bytes(seed, offset, size)
    expected = b"".join(struct.pack("<Q", pattern.word(seed, offset + i))
                        for i in range(0, size, 8))
    assert data == expected
    assert pattern.crc32(data) == zlib.crc32(expected)


def test_pattern_bytes_empty_and_bad_args():
    assert pattern.pattern_bytes(1, 16, 0) == b""
    for args in [(1 << 16, 0, 8), (-1, 0, 8), (1, 4, 8), (1, 0, 12), (1, -8, 8)]:
        with pytest.raises(ValueError):
            pattern.pattern_bytes(*args)


def test_pattern_bytes_64mib_ends_right():
    # Timings are never asserted (shared, noisy machine); only the content of a large run.
    data = pattern.pattern_bytes(3, 0, 64 * MiB)
    assert len(data) == 64 * MiB
    assert data[-8:] == struct.pack("<Q", pattern.word(3, 64 * MiB - 8))


# ------------------------------------------------------------------------- daxio itself

def test_fill_matches_mirror_and_file(daxio, dev):
    out = ok_json(run(daxio, "fill", dev, "--size", SIZE, "--offset", OFF, "--seed", SEED))
    expected = pattern.pattern_bytes(SEED, OFF, SIZE)
    assert out["op"] == "fill" and out["dev"] == str(dev)
    assert (out["offset"], out["size"], out["seed"]) == (OFF, SIZE, SEED)
    assert out["mismatches"] == 0 and out["first_mismatch"] is None
    assert isinstance(out["ns"], int) and out["ns"] >= 0
    crc = int(out["crc32"], 16)
    assert crc == pattern.crc32(expected) == zlib.crc32(read_range(dev, OFF, SIZE))
    assert read_range(dev, OFF, SIZE) == expected
    # nothing outside the range was written, and the file was not extended
    assert read_range(dev, 0, OFF) == bytes(OFF)
    assert read_range(dev, OFF + SIZE, FILE_SIZE) == bytes(FILE_SIZE - OFF - SIZE)
    assert dev.stat().st_size == FILE_SIZE


def test_fill_with_suffixes_up_to_end_of_file(daxio, dev):
    out = ok_json(run(daxio, "fill", dev, "--size", "1M", "--offset=3M", "--seed=0x10"))
    assert (out["offset"], out["size"], out["seed"]) == (3 * MiB, MiB, 16)
    assert read_range(dev, 3 * MiB, MiB) == pattern.pattern_bytes(16, 3 * MiB, MiB)


def test_verify_clean_then_corrupted(daxio, dev):
    ok_json(run(daxio, "fill", dev, "--size", SIZE, "--offset", OFF, "--seed", SEED))
    out = ok_json(run(daxio, "verify", dev, "--size", SIZE, "--offset", OFF, "--seed", SEED))
    assert out["op"] == "verify"
    assert out["mismatches"] == 0 and out["first_mismatch"] is None
    assert out["expected"] is None and out["found"] is None
    assert int(out["crc32"], 16) == pattern.crc32(pattern.pattern_bytes(SEED, OFF, SIZE))

    bad1, bad2 = OFF + 4096 + 8, OFF + SIZE - 8
    write_range(dev, bad2, struct.pack("<Q", 1))
    write_range(dev, bad1, struct.pack("<Q", 0xDEAD_BEEF_CAFE_F00D))
    out = ok_json(run(daxio, "verify", dev, "--size", SIZE, "--offset", OFF, "--seed", SEED),
                  rc=1)
    assert out["mismatches"] == 2
    assert out["first_mismatch"] == bad1
    assert int(out["expected"], 16) == pattern.word(SEED, bad1)
    assert int(out["found"], 16) == 0xDEAD_BEEF_CAFE_F00D
    assert int(out["crc32"], 16) == zlib.crc32(read_range(dev, OFF, SIZE))


def test_verify_wrong_seed_flags_every_word(daxio, dev):
    ok_json(run(daxio, "fill", dev, "--size", SIZE, "--offset", OFF, "--seed", SEED))
    out = ok_json(run(daxio, "verify", dev, "--size", SIZE, "--offset", OFF,
                      "--seed", SEED + 1), rc=1)
    assert out["mismatches"] == SIZE // 8
    assert out["first_mismatch"] == OFF
    assert int(out["expected"], 16) == pattern.word(SEED + 1, OFF)
    assert int(out["found"], 16) == pattern.word(SEED, OFF)


@pytest.mark.parametrize("value", ["0xdeadbeefcafebabe", "0xFFFFFFFFFFFFFFFF", "0",
                                   "1234567890123"])
def test_poke_peek_round_trip(daxio, dev, value):
    off = 3 * MiB + 4088  # last word of a page
    ok_json(run(daxio, "fill", dev, "--size", 16, "--offset", off - 8, "--seed", 1))
    want = int(value, 0)
    out = ok_json(run(daxio, "poke", dev, "--offset", off, "--value", value))
    assert (out["op"], out["offset"], int(out["value"], 16)) == ("poke", off, want)
    out = ok_json(run(daxio, "peek", dev, "--offset", off))
    assert (out["op"], out["offset"], int(out["value"], 16)) == ("peek", off, want)
    assert struct.unpack("<Q", read_range(dev, off, 8))[0] == want
    assert read_range(dev, off - 8, 8) == struct.pack("<Q", pattern.word(1, off - 8))
    assert read_range(dev, off + 8, 8) == bytes(8)


def test_peek_reads_pattern_word(daxio, dev):
    ok_json(run(daxio, "fill", dev, "--size", SIZE, "--offset", OFF, "--seed", SEED))
    out = ok_json(run(daxio, "peek", dev, "--offset", OFF + 64))
    assert int(out["value"], 16) == pattern.word(SEED, OFF + 64)


@pytest.mark.parametrize("offset, size", [(0, FILE_SIZE), (OFF, SIZE), (8, 8),
                                          (2 * MiB - 8, 16), (FILE_SIZE - 24, 24)])
def test_crc_matches_zlib(daxio, dev, offset, size):
    data = os.urandom(size)
    write_range(dev, offset, data)
    out = ok_json(run(daxio, "crc", dev, "--size", size, "--offset", offset))
    assert (out["op"], out["offset"], out["size"]) == ("crc", offset, size)
    assert int(out["crc32"], 16) == zlib.crc32(data)
    assert isinstance(out["ns"], int)


def test_crc_on_file_not_a_multiple_of_2mib(daxio, tmp_path):
    # the 2 MiB window reaches past EOF; daxio must only touch the requested bytes
    path = tmp_path / "odd.img"
    size = 3 * MiB + 4096
    data = os.urandom(8192)
    with open(path, "wb") as f:
        f.truncate(size)
        f.seek(size - 8192)
        f.write(data)
    out = ok_json(run(daxio, "crc", path, "--size", 8192, "--offset", size - 8192))
    assert int(out["crc32"], 16) == zlib.crc32(data)
    out = ok_json(run(daxio, "fill", path, "--size", 8192, "--offset", size - 8192, "--seed", 2))
    assert read_range(path, size - 8192, 8192) == pattern.pattern_bytes(2, size - 8192, 8192)
    assert path.stat().st_size == size


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help(daxio, flag):
    res = run(daxio, flag)
    assert res.returncode == 0 and res.stderr == ""
    for word in ["fill", "verify", "crc", "poke", "peek", "--size", "--offset", "--seed",
                 "--value", "KiB", "MiB", "GiB", "guest wall-clock", "crc32", "first_mismatch"]:
        assert word in res.stdout, word
    assert run(daxio, "verify", flag).returncode == 0


@pytest.mark.parametrize("args, needle", [
    (["fill", "{dev}", "--size", "8", "--offset", "12", "--seed", "1"], "--offset 12"),
    (["fill", "{dev}", "--size", "12", "--seed", "1"], "--size 12"),
    (["fill", "{dev}", "--size", "4M", "--offset", "8", "--seed", "1"], "past the end"),
    (["crc", "{dev}", "--size", "8", "--offset", "4M"], "past the end"),
    (["verify", "{dev}", "--size", "8", "--seed", "65536"], "--seed 65536"),
    (["fill", "{dev}", "--size", "8", "--seed", "-1"], "--seed"),
    (["frobnicate", "{dev}", "--size", "8"], "unknown subcommand 'frobnicate'"),
    ([], "missing subcommand"),
    (["fill", "{missing}", "--size", "8", "--seed", "1"], "open {missing}: No such file"),
    (["peek", "{missing}", "--offset", "0"], "open {missing}: No such file"),
    (["fill", "{dev}", "--seed", "1"], "missing required option --size"),
    (["fill", "{dev}", "--size", "8"], "missing required option --seed"),
    (["fill", "--size", "8", "--seed", "1"], "missing DEV"),
    (["crc", "{dev}", "--size", "8", "--seed", "1"], "--seed does not apply"),
    (["crc", "{dev}", "--size", "1X"], "bad value '1X'"),
    (["crc", "{dev}", "--size", "0"], "--size"),
    (["crc", "{dev}", "--size"], "needs a value"),
    (["crc", "{dev}", "--bogus", "8"], "unknown option"),
    (["poke", "{dev}", "--offset", "0", "--value", "0x10000000000000000"], "bad value"),
    (["peek", "{dev}", "extra", "--offset", "0"], "unexpected argument 'extra'"),
])
def test_bad_input_exits_2_with_one_line(daxio, dev, tmp_path, args, needle):
    missing = tmp_path / "no-such-dev"
    args = [a.format(dev=dev, missing=missing) for a in args]
    needle = needle.format(missing=missing)
    res = run(daxio, *args)
    assert res.returncode == 2, (args, res.returncode, res.stdout, res.stderr)
    assert res.stdout == ""
    assert res.stderr.startswith("daxio: ") and res.stderr.count("\n") == 1, res.stderr
    assert needle in res.stderr
    assert "Traceback" not in res.stderr
    # a refused command leaves the file alone
    assert dev.stat().st_size == FILE_SIZE
    assert read_range(dev, 0, FILE_SIZE) == bytes(FILE_SIZE)
