"""Hostile stores: generated sets of corrupt superblocks and corrupt records (their crcs fixed, so
they open) through every opener: `pfcxl kv stats|dump|verify|bench` and the C tool's verify, get,
put and bench. Each run ends by itself (the subprocess timeout and an alarm bound it), with exit
0 or 1 and its JSON, or one line saying what is wrong; the C tool never dies of a signal; the
Python and C openers refuse a superblock with the same words; no run writes over the superblock;
a corrupt record is never read as a block."""

import json
import random
import re
import shutil
import signal
import struct
import subprocess
import zlib

import pytest

from pfcxl.host_tools.cli import main as cli
from pfcxl.guest.python import pfcxl_kvstore as kv

from .conftest import compile_guest_tool, kv_pool

U64 = (1 << 64) - 1

pytestmark = pytest.mark.component


def codes(fields) -> dict:
    """Each field's struct code (8s, I, Q) by name."""
    return dict(zip(fields.names, re.findall(r"\d*[a-zA-Z]", fields.st.format[1:])))


SUPER_CODE, RECORD_CODE = codes(kv.SUPER), codes(kv.RECORD)


@pytest.fixture(scope="module")
def tool():
    return compile_guest_tool("kvstore")


@pytest.fixture(autouse=True)
def bounded():
    """A run that does not end fails the test instead of hanging it."""
    def hung(*_):
        raise AssertionError("a run did not end within 120 s")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def blocks():
    return {f"b{i}": bytes([i + 1]) * (1000 + 3000 * i) for i in range(6)}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A store of 4 hosts x 8 slots holding six blocks (hosts 0..2), copied for every case."""
    path = kv_pool(tmp_path_factory.mktemp("base"), 4 << 20, hosts=4, slots=8)
    for i, (name, data) in enumerate(blocks().items()):
        with kv.Store.open(path, host=i % 3) as s:
            assert s.put(name, data)
    return path


def run_tool(tool, *args):
    done = subprocess.run([str(tool), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1, 2), (args, done.returncode, done.stderr)      # never a signal
    if done.returncode == 2:
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("kvstore: "), (args, done.stderr)
    else:
        json.loads(done.stdout)                                                      # one JSON line
    return done


def run_cli(capsys, *argv):
    status = cli.main(["kv", *argv])
    out, err = capsys.readouterr()
    assert status in (0, 1), (argv, status)
    assert err == "" or (err.count("\n") == 1 and err.startswith("pfcxl: error: ")), (argv, err)
    return status, out, err


def hostile(real: int, top: int, rng) -> list[int]:
    near = [real + d for d in (-64, -1, 1, 4096)]
    far = [0, 1, (1 << 32) - 1, 1 << 63, U64, rng.randrange(top + 1)]
    return sorted({v for v in near + far if 0 <= v <= top and v != real})


def superblock_cases():
    rng = random.Random(5)
    fields = [n for n in kv.SUPER.names if n not in ("magic", "crc")]
    real = dict(version=kv.VERSION, hosts=4, slots=8, chunk_tokens=256, headers_off=4096, index_off=8192,
                arena_off=12288, arena_bytes=(2 << 20) // 4 - 4096, total=2 << 20)
    for field in fields:
        top = (1 << 32) - 1 if SUPER_CODE[field] == "I" else U64
        for value in hostile(real[field], top, rng):
            yield field, value


def test_the_base_store_is_what_the_cases_assume(base):
    with kv.Store.open(base) as s:
        assert {k: s.sb[k] for k in ("hosts", "slots", "headers_off", "index_off", "arena_off", "total")} == dict(
            hosts=4, slots=8, headers_off=4096, index_off=8192, arena_off=12288, total=2 << 20)
        assert s.sb["arena_bytes"] == (2 << 20) // 4 - 4096


@pytest.mark.parametrize("field,value", list(superblock_cases()))
def test_a_corrupt_superblock_is_refused_in_one_line_by_every_opener_or_used_within_its_bounds(
        tool, base, tmp_path, capsys, field, value):
    path = str(tmp_path / "pool")
    shutil.copyfile(base, path)
    with open(path, "r+b") as f:
        f.seek(kv.HOME)
        raw = bytearray(f.read(kv.SUPER.st.size))
        struct.pack_into("<" + SUPER_CODE[field], raw, kv.SUPER.offset[field], value)
        struct.pack_into("<I", raw, kv.SUPER.offset["crc"], zlib.crc32(raw[:-4]))
        f.seek(kv.HOME)
        f.write(raw)
        f.seek(kv.HOME)
        page = f.read(4096)
    try:
        kv.Store.open(path).close()
        refused = None
    except kv.KVError as exc:
        refused = str(exc)
    for action in (["stats", "--json"], ["dump"], ["verify"], ["bench", "--blocks", "2", "--size", "4K"]):
        status, _, err = run_cli(capsys, *action, "--pool", path)
        if refused:
            assert status == 1 and err == f"pfcxl: error: {refused}\n"
    for action in (["verify"], ["get", "--key", "b1"], ["put", "--host", "0", "--key", "n", "--size", "4096"],
                   ["bench", "--host", "0", "--blocks", "2", "--size", "4096"]):
        done = run_tool(tool, action[0], path, *action[1:])
        if refused:
            assert done.returncode == 2 and done.stderr == f"kvstore: {path} {refused}\n"
    with open(path, "rb") as f:
        f.seek(kv.HOME)
        assert f.read(4096) == page                       # nothing wrote over the superblock


def record_cases():
    """(host, slot, field, value, fix rcrc): hostile offsets and lengths around the arena, states,
    keys and crcs of the six records, and hostile header words."""
    rng = random.Random(7)
    with_base = []
    arena = (2 << 20) // 4 - 4096
    for host, slot in ((0, 0), (2, 1)):
        lo = 12288 + host * arena
        hi = lo + arena
        for value in sorted({0, lo - 1, lo, hi - 1, hi, hi + 1, 1 << 63, U64, U64 - 4095, rng.randrange(U64)}):
            with_base += [(host, slot, "offset", value, True), (host, slot, "length", value, True)]
        for value in (2, 4, 1 << 62, U64 - 1, 3):
            with_base.append((host, slot, "state", value, True))
        with_base += [(host, slot, "crc", rng.randrange(1 << 32), True), (host, slot, "offset", 1 << 63, False)]
    for name, value in (("next_seq", 1 << 62), ("next_seq", U64), ("clock", U64), ("heartbeat", U64),
                        ("evictions", U64)):
        with_base.append((0, None, name, value, False))
    return with_base


@pytest.mark.parametrize("host,slot,field,value,fix", record_cases())
def test_a_corrupt_record_or_header_never_crashes_a_reader_or_writer_nor_reads_as_a_block(
        tool, base, tmp_path, capsys, host, slot, field, value, fix):
    path = str(tmp_path / "pool")
    shutil.copyfile(base, path)
    with kv.Store.open(path) as s:
        if slot is None:                                  # a header word
            struct.pack_into("<Q", s.m.mem, s._header_at(host) + kv.HEADER.offset[field], value)
        else:
            at = s._slot_at(host, slot)
            line = bytearray(s.m.mem[at:at + kv.LINE])
            struct.pack_into("<" + RECORD_CODE[field], line, kv.RECORD.offset[field], value)
            if fix:
                struct.pack_into("<I", line, kv.SIGNED, zlib.crc32(line[:kv.SIGNED]))
            s.m.mem[at:at + kv.LINE] = line
    stored = blocks()
    for name, data in stored.items():
        done = run_tool(tool, "get", path, "--key", name)
        if done.returncode == 0:
            got = json.loads(done.stdout)
            assert got["length"] == len(data) and int(got["crc32"], 16) == zlib.crc32(data)
    run_tool(tool, "verify", path)
    run_tool(tool, "put", path, "--host", str(host), "--key", "new", "--size", "4096")
    with kv.Store.open(path) as s:
        assert all(s.get(name) in (None, data) for name, data in stored.items())
        s.verify()
    try:
        with kv.Store.open(path, host=host) as s:
            s.put("newer", b"z" * 5000)
            assert s.get("newer") in (None, b"z" * 5000)
    except kv.KVError as exc:
        assert "\n" not in str(exc)
    status, _, _ = run_cli(capsys, "verify", "--pool", path)
