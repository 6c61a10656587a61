"""The guest benchmarks idle_latency, loaded_latency and bandwidth (guest/src/*.c): correctness,
never speed.

Each tool is compiled here exactly as the image builder does (host_tools.image.CFLAGS: gcc -static
-O2 -Wall -Wextra -Werror, no -pthread) and run on `anon` (local memory) and on sparse regular
files standing in for /dev/dax0.0 (mapped MAP_SHARED the same way). Checked: the pointer chase
visits every line exactly once per lap and the permutation in memory is the one it reports;
every transfer size/pattern/op/thread count moves exactly the requested bytes, at the right
addresses; every loaded-latency traffic thread really ran in every row; every output is one
line of JSON with exactly the fields and types of guest/bench_schema.md (mirrored by SCHEMA
below); bad arguments exit 2 with one line on stderr; --help exits 0.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
from pathlib import Path

import pytest

from pfcxl.host_tools.image.initramfs import GUEST_SOURCES
from pfcxl.guest import pattern

from .conftest import compile_guest_tool

TOOLS = ("idle_latency", "loaded_latency", "bandwidth")
SCHEMA_MD = GUEST_SOURCES.parent / "bench_schema.md"
CLOCK = "guest CLOCK_MONOTONIC (under TCG: emulator time, not fabric latency)"
MiB = 1 << 20

# ---------------------------------------------------------------- schema (guest/bench_schema.md)
# A type, a dict (exactly these keys), [spec] (array of spec), or a tuple of alternatives.
_DIST = {"batches": int, "ns_total": int, "p50_ns": float, "p99_ns": float, "p999_ns": float}
_LOADED_ROW = {"delay": int, "seconds": float, "laps": int, "loads": int, "latency_ns": float,
               "accesses": int, "bytes": int, "bandwidth_MBps": float, "thread_accesses": [int]}
_BW_ROW = {"pattern": str, "op": str, "size": int, "threads": int, "transfers": int,
           "read_transfers": int, "write_transfers": int, "bytes_requested": int,
           "bytes_moved": int, "seconds": float, "MBps": float, "thread_bytes": [int]}
SCHEMA = {
    "idle_latency": {
        "tool": str, "target": str, "kind": str, "span": int, "line_bytes": int, "lines": int,
        "seed": int, "mode": str, "warmup_laps": int, "laps": int, "batch": int,
        "visited_lines_per_lap": int, "lap_closed": bool, "order_fnv1a64": str, "order": [int],
        "read": ({"loads": int, "ns_per_load": float, **_DIST}, None),
        "write": ({"stores": int, "ns_per_store": float, **_DIST}, None),
        "clock": str,
    },
    "loaded_latency": {
        "tool": str, "target": str, "kind": str, "span": int, "line_bytes": int, "lines": int,
        "seed": int, "traffic_span": int, "threads": int, "read_pct": int, "access_bytes": int,
        "delay_unit": str, "laps": int, "min_ms": int, "cpus_online": int,
        "visited_lines_per_lap": int, "lap_closed": bool, "rows": [_LOADED_ROW], "clock": str,
    },
    "bandwidth": {
        "tool": str, "target": str, "kind": str, "span": int, "bytes": int, "read_pct": int,
        "seed": int, "write_seed": int, "cpus_online": int, "stripe": [int], "rotate": int,
        "results": [_BW_ROW], "clock": str,
    },
}
OPTIONS = {
    "idle_latency": ["--target", "--span", "--seed", "--mode", "--warmup-laps", "--laps",
                     "--batch", "--dump-order"],
    "loaded_latency": ["--target", "--threads", "--delays", "--delay-unit", "--delay-cycles",
                       "--delay-ns", "--read-pct", "--span", "--traffic-span", "--seed", "--laps",
                       "--min-ms"],
    "bandwidth": ["--target", "--pattern", "--op", "--sizes", "--threads", "--bytes", "--span",
                  "--read-pct", "--seed", "--stripe", "--rotate"],
}

pytestmark = pytest.mark.component


def conform(value, spec, where: str = "$") -> None:
    if isinstance(spec, tuple):
        errors = []
        for alt in spec:
            try:
                return conform(value, alt, where)
            except AssertionError as e:
                errors.append(str(e))
        raise AssertionError(" / ".join(errors))
    if spec is None:
        assert value is None, f"{where}: {value!r} is not null"
    elif isinstance(spec, dict):
        assert isinstance(value, dict), f"{where}: {value!r} is not an object"
        assert set(value) == set(spec), \
            f"{where}: extra {set(value) - set(spec)}, missing {set(spec) - set(value)}"
        for k, sub in spec.items():
            conform(value[k], sub, f"{where}.{k}")
    elif isinstance(spec, list):
        assert isinstance(value, list), f"{where}: {value!r} is not an array"
        for i, v in enumerate(value):
            conform(v, spec[0], f"{where}[{i}]")
    else:   # exact type: bool is not an int here, an int is not a float
        assert type(value) is spec, f"{where}: {value!r} is {type(value).__name__}, not {spec.__name__}"


def field_names(spec) -> set[str]:
    if isinstance(spec, tuple):
        return set().union(*(field_names(s) for s in spec))
    if isinstance(spec, list):
        return field_names(spec[0])
    if isinstance(spec, dict):
        return set(spec).union(*(field_names(s) for s in spec.values()))
    return set()


# ---------------------------------------------------------------- building and running


@pytest.fixture(scope="module")
def tools() -> dict[str, Path]:
    return {name: compile_guest_tool(name) for name in TOOLS}


def run(tools, name: str, *args, rc: int = 0) -> dict:
    res = subprocess.run([str(tools[name]), *map(str, args)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == rc, (res.returncode, res.stdout, res.stderr)
    assert res.stderr == ""
    assert res.stdout.endswith("\n") and res.stdout.count("\n") == 1, res.stdout
    out = json.loads(res.stdout)
    conform(out, SCHEMA[name])
    assert out["tool"] == name and out["clock"] == CLOCK
    return out


def sparse(tmp_path: Path, size: int, name: str = "dax.img") -> Path:
    path = tmp_path / name
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def words(path: Path, offset: int, count: int) -> tuple[int, ...]:
    with open(path, "rb") as f:
        f.seek(offset)
        return struct.unpack(f"<{count}Q", f.read(8 * count))


def fnv1a64(indices) -> str:
    h = 0xcbf29ce484222325
    for i in indices:
        for b in i.to_bytes(8, "little"):
            h = ((h ^ b) * 0x100000001b3) & (1 << 64) - 1
    return f"0x{h:016x}"


# ---------------------------------------------------------------- help and schema document


@pytest.mark.parametrize("name", TOOLS)
def test_help_exits_0_and_documents_every_option(tools, name):
    for flag in ("--help", "-h"):
        res = subprocess.run([str(tools[name]), "--target", "anon", flag], capture_output=True,
                             text=True, timeout=30)
        assert res.returncode == 0 and res.stderr == ""
        assert res.stdout.startswith(f"usage: {name} --target T")
        for opt in OPTIONS[name]:
            assert opt in res.stdout, opt
        assert "bench_schema.md" in res.stdout and "exit status" in res.stdout
        assert "%%" not in res.stdout


def test_schema_document_names_every_field():
    text = SCHEMA_MD.read_text()
    for name, spec in SCHEMA.items():
        assert f"## `{name}`" in text
        for field in field_names(spec):
            assert f"`{field}`" in text, (name, field)


# ---------------------------------------------------------------- idle_latency


def test_idle_chase_visits_every_line_once_per_lap_anon(tools):
    lines = 1000   # not a power of two
    out = run(tools, "idle_latency", "--target", "anon", "--span", 64 * lines, "--mode", "both",
              "--laps", 3, "--warmup-laps", 2, "--batch", 7, "--dump-order", lines, "--seed", 42)
    assert (out["kind"], out["span"], out["lines"], out["line_bytes"]) == ("anon", 64000, lines, 64)
    assert out["visited_lines_per_lap"] == lines and out["lap_closed"] is True
    order = out["order"]
    assert sorted(order) == list(range(lines))            # a permutation: each line once
    assert out["order_fnv1a64"] == fnv1a64(order)
    assert sum(b == a + 1 for a, b in zip(order, order[1:])) < lines // 10   # shuffled
    for dist, ops in ((out["read"], "loads"), (out["write"], "stores")):
        assert dist[ops] == 3 * lines
        assert dist["batches"] == math.ceil(3 * lines / 7)
        assert dist["ns_total"] > 0
        assert 0 < dist["p50_ns"] <= dist["p99_ns"] <= dist["p999_ns"]


def test_idle_chain_in_file_is_the_reported_order(tools, tmp_path):
    span, lines = 256 * 1024, 4096
    dev = sparse(tmp_path, 2 * MiB)
    out = run(tools, "idle_latency", "--target", dev, "--span", "256K", "--mode", "both",
              "--dump-order", lines, "--seed", "0x1234")
    assert out["kind"] == "file" and out["visited_lines_per_lap"] == lines and out["lap_closed"]
    order = out["order"]
    assert sorted(order) == list(range(lines))
    mem = words(dev, 0, span // 8)
    for k, line in enumerate(order):
        # word 0: the chain links each line to the next in the reported order, cyclically
        assert mem[8 * line] == order[(k + 1) % lines]
        # word 1: the write lap stored its position there (store + clflush + mfence per line)
        assert mem[8 * line + 1] == 0x5752000000000000 | k
        assert mem[8 * line + 2: 8 * line + 8] == (0,) * 6    # nothing else touched
    assert words(dev, span, 8) == (0,) * 8                    # nothing past the span
    assert out["read"]["loads"] == lines and out["write"]["stores"] == lines


def test_idle_order_depends_only_on_the_seed(tools):
    def order(seed, n=64):
        out = run(tools, "idle_latency", "--target", "anon", "--span", "64K", "--seed", seed,
                  "--dump-order", n, "--mode", "read")
        assert out["write"] is None and len(out["order"]) == n
        return out["order_fnv1a64"], out["order"]
    assert order(5) == order(5)
    assert order(5)[0] != order(6)[0]
    assert order(5)[1][:10] == order(5, 10)[1]


def test_idle_write_mode_and_defaults(tools):
    out = run(tools, "idle_latency", "--target", "anon", "--span", "128K", "--mode", "write")
    assert out["read"] is None and out["write"]["stores"] == 2048
    assert (out["laps"], out["warmup_laps"], out["batch"], out["seed"], out["order"]) == (1, 1, 64, 1, [])


# ---------------------------------------------------------------- loaded_latency


@pytest.mark.parametrize("target", ["anon", "file"])
def test_loaded_every_traffic_thread_runs_in_every_row(tools, tmp_path, target):
    threads, span, tspan = 3, 64 * 1024, 64 * 1024
    dev = "anon" if target == "anon" else sparse(tmp_path, 2 * MiB)
    out = run(tools, "loaded_latency", "--target", dev, "--span", span, "--traffic-span", tspan,
              "--threads", threads, "--delay-cycles", "0,3000", "--read-pct", 0, "--min-ms", 20)
    assert out["kind"] == target and out["threads"] == threads and out["delay_unit"] == "cycles"
    assert out["visited_lines_per_lap"] == out["lines"] == span // 64 and out["lap_closed"]
    assert [r["delay"] for r in out["rows"]] == [0, 3000]
    for row in out["rows"]:
        assert len(row["thread_accesses"]) == threads
        assert all(c > 0 for c in row["thread_accesses"]), row
        assert row["accesses"] == sum(row["thread_accesses"])
        assert row["bytes"] == 64 * row["accesses"]
        assert row["laps"] >= 1 and row["loads"] == row["laps"] * out["lines"]
        assert row["seconds"] > 0 and row["bandwidth_MBps"] > 0 and row["latency_ns"] > 0
    if target == "file":   # --read-pct 0: every thread wrote its own region (and only that)
        for i in range(threads):
            region = words(dev, span + i * tspan, tspan // 8)
            assert any(region), f"traffic thread {i} wrote nothing"
        assert not any(words(dev, span + threads * tspan, 1024))


def test_loaded_delay_ns_and_no_traffic(tools):
    out = run(tools, "loaded_latency", "--target", "anon", "--span", "32K", "--threads", 2,
              "--delays", "0,20000", "--delay-unit", "ns", "--read-pct", 50, "--min-ms", 10)
    assert out["delay_unit"] == "ns" and len(out["rows"]) == 2
    assert all(c > 0 for r in out["rows"] for c in r["thread_accesses"])
    assert run(tools, "loaded_latency", "--target", "anon", "--span", "32K", "--delay-ns", "7",
               "--threads", 2, "--min-ms", 5)["delay_unit"] == "ns"
    out = run(tools, "loaded_latency", "--target", "anon", "--span", "32K", "--threads", 0,
              "--delays", 0, "--min-ms", 1)
    (row,) = out["rows"]
    assert row["thread_accesses"] == [] and row["accesses"] == 0 and row["bandwidth_MBps"] == 0.0


# ---------------------------------------------------------------- bandwidth

SIZES = [32, 64, 128, 256, 512, 1024]


def test_bandwidth_moves_exactly_the_requested_bytes(tools):
    nbytes, threads, read_pct = 48 * 1024, [1, 2, 3], 70
    out = run(tools, "bandwidth", "--target", "anon", "--bytes", "48K", "--span", "256K",
              "--threads", "1,2,3", "--read-pct", read_pct)
    rows = out["results"]
    expect = [(p, o, s, t) for p in ("seq", "random") for o in ("read", "write", "mixed")
              for s in SIZES for t in threads]
    assert [(r["pattern"], r["op"], r["size"], r["threads"]) for r in rows] == expect
    for r in rows:
        assert r["bytes_requested"] == r["bytes_moved"] == nbytes, r
        assert len(r["thread_bytes"]) == r["threads"] and sum(r["thread_bytes"]) == nbytes
        assert all(b % r["size"] == 0 and b > 0 for b in r["thread_bytes"])
        assert r["transfers"] == nbytes // r["size"]
        assert r["read_transfers"] + r["write_transfers"] == r["transfers"]
        per_thread = [b // r["size"] for b in r["thread_bytes"]]
        want_reads = {"read": r["transfers"], "write": 0,
                      "mixed": sum(n * read_pct // 100 for n in per_thread)}[r["op"]]
        assert r["read_transfers"] == want_reads, r
        assert r["seconds"] >= 0 and r["MBps"] >= 0


def test_bandwidth_writes_land_where_they_should(tools, tmp_path):
    span = 64 * 1024
    # seq write of exactly the span by 1 and 2 threads: every word holds daxio's pattern
    for threads in ("1", "2"):
        dev = sparse(tmp_path, 2 * MiB, f"seq{threads}.img")
        out = run(tools, "bandwidth", "--target", dev, "--pattern", "seq", "--op", "write",
                  "--sizes", "32,1024", "--threads", threads, "--bytes", span, "--span", span)
        assert out["kind"] == "file" and out["write_seed"] == 0x4257
        assert all(r["bytes_moved"] == span for r in out["results"])
        with open(dev, "rb") as f:
            assert f.read(span) == pattern.pattern_bytes(0x4257, 0, span)
            assert not any(f.read(MiB))     # nothing past the span
    # random writes: size-aligned, every written word correct for its address
    dev = sparse(tmp_path, 2 * MiB, "random.img")
    run(tools, "bandwidth", "--target", dev, "--pattern", "random", "--op", "write,mixed",
        "--sizes", 256, "--threads", "1,4", "--bytes", "16K", "--span", span)
    mem = words(dev, 0, span // 8)
    written = [i for i, w in enumerate(mem) if w]
    assert written and all(mem[i] == pattern.word(0x4257, 8 * i) for i in written)
    for slot in range(span // 256):   # whole transfers only
        chunk = mem[32 * slot: 32 * slot + 32]
        assert all(chunk) or not any(chunk), slot


def test_bandwidth_stripe_touches_only_granule_k_of_every_n(tools, tmp_path):
    # one module of a 16-way 4 KiB interleave: every access, seq and random, lands in granule 3 mod 16
    span, g, n, k = 64 * 1024, 4096, 16, 3
    dev = sparse(tmp_path, 2 * MiB)
    out = run(tools, "bandwidth", "--target", dev, "--pattern", "seq,random", "--op", "write",
              "--sizes", "64,1024", "--bytes", span, "--span", span, "--stripe", f"{g},{n},{k}",
              "--rotate", "8K")
    assert out["stripe"] == [g, n, k] and out["rotate"] == 8192
    mem = words(dev, 0, n * span // 8)
    written = [i for i, w in enumerate(mem) if w]
    assert {8 * i // g % n for i in written} == {k}
    assert all(mem[i] == pattern.word(0x4257, 8 * i) for i in written)
    # seq at 64 B writes the whole logical span: every byte of each K-th granule
    assert len(written) == span // 8


def test_bandwidth_rotate_starts_the_seq_walk_later(tools, tmp_path):
    dev = sparse(tmp_path, 2 * MiB)
    run(tools, "bandwidth", "--target", dev, "--pattern", "seq", "--op", "write", "--sizes", "1024",
        "--bytes", "2K", "--span", "64K", "--rotate", "4K")
    written = {8 * i // 1024 for i, w in enumerate(words(dev, 0, 8192)) if w}
    assert written == {4, 5}


def test_bandwidth_on_a_file_read_and_mixed(tools, tmp_path):
    dev = sparse(tmp_path, 2 * MiB)
    out = run(tools, "bandwidth", "--target", dev, "--sizes", ",".join(map(str, SIZES)),
              "--threads", "1,2", "--bytes", "8K", "--span", "64K")
    assert len(out["results"]) == 2 * 3 * 6 * 2
    assert all(r["bytes_moved"] == r["bytes_requested"] == 8192 for r in out["results"])


# ---------------------------------------------------------------- errors


BAD = [
    ("idle_latency", []),                                             # no --target
    ("idle_latency", ["--target", "anon", "extra"]),                  # positional
    ("idle_latency", ["--target", "anon", "--bogus", "1"]),
    ("idle_latency", ["--target", "anon", "--span"]),                 # missing value
    ("idle_latency", ["--target", "anon", "--span", "1X"]),
    ("idle_latency", ["--target", "anon", "--span", "100"]),          # not a multiple of 64
    ("idle_latency", ["--target", "anon", "--span", "64"]),           # one line
    ("idle_latency", ["--target", "anon", "--span", "4K", "--span=8K"]),
    ("idle_latency", ["--target", "anon", "--mode", "readwrite"]),
    ("idle_latency", ["--target", "anon", "--laps", "0"]),
    ("idle_latency", ["--target", "anon", "--laps", "-1"]),
    ("idle_latency", ["--target", "anon", "--warmup-laps", "0"]),
    ("idle_latency", ["--target", "anon", "--span", "4K", "--dump-order", "65"]),
    ("idle_latency", ["--target", "{small}", "--span", "8K"]),        # file too small
    ("idle_latency", ["--target", "{missing}"]),
    ("idle_latency", ["--target", "{dir}"]),
    ("loaded_latency", ["--target", "anon", "--threads", "257"]),
    ("loaded_latency", ["--target", "anon", "--delays", "1,,2"]),
    ("loaded_latency", ["--target", "anon", "--delays", ""]),
    ("loaded_latency", ["--target", "anon", "--delays", "1", "--delay-ns", "2"]),
    ("loaded_latency", ["--target", "anon", "--delay-ns", "2", "--delay-unit", "ns"]),
    ("loaded_latency", ["--target", "anon", "--delays", "1", "--delay-unit", "us"]),
    ("loaded_latency", ["--target", "anon", "--read-pct", "101"]),
    ("loaded_latency", ["--target", "anon", "--traffic-span", "100"]),
    ("loaded_latency", ["--target", "{small}", "--span", "4K", "--traffic-span", "4K"]),
    ("bandwidth", ["--target", "anon", "--sizes", "12"]),
    ("bandwidth", ["--target", "anon", "--sizes", "0"]),
    ("bandwidth", ["--target", "anon", "--sizes", "1024", "--bytes", "1000"]),
    ("bandwidth", ["--target", "anon", "--op", "copy"]),
    ("bandwidth", ["--target", "anon", "--pattern", "seq,"]),
    ("bandwidth", ["--target", "anon", "--threads", "0"]),
    ("bandwidth", ["--target", "anon", "--threads", "4", "--span", "2K", "--sizes", "1024"]),
    ("bandwidth", ["--target", "{small}", "--span", "8K"]),
    ("bandwidth", ["--target", "anon", "--span", "64K", "--stripe", "4096,16,16"]),   # K >= N
    ("bandwidth", ["--target", "anon", "--span", "64K", "--stripe", "4000,16,1"]),    # G not 64-aligned
    ("bandwidth", ["--target", "anon", "--span", "64K", "--stripe", "4096,16"]),
    ("bandwidth", ["--target", "anon", "--span", "64K", "--sizes", "64", "--rotate", "100"]),
    ("bandwidth", ["--target", "anon", "--span", "64K", "--sizes", "1024", "--stripe", "512,2,0"]),
]


@pytest.mark.parametrize("name,args", BAD, ids=[f"{n}:{' '.join(a)}" for n, a in BAD])
def test_bad_arguments_exit_2_with_one_line(tools, tmp_path, name, args):
    small = sparse(tmp_path, 4096, "small.img")
    subst = {"{small}": str(small), "{missing}": str(tmp_path / "nope"), "{dir}": str(tmp_path)}
    res = subprocess.run([str(tools[name]), *(subst.get(a, a) for a in args)],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert res.stdout == ""
    assert res.stderr.startswith(f"{name}: ") and res.stderr.count("\n") == 1, res.stderr
