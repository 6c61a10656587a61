"""`pfcxl kv` on a pool file: format, stats, dump, verify (a bad block named, exit 1), bench."""

import json
import os

import pytest

from pfcxl.host_tools.cli import main as cli
from pfcxl.host_tools.cli import kv as cli_kv
from pfcxl.serving.chunks import KV_CHUNK_TOKENS

pytestmark = pytest.mark.unit


@pytest.fixture
def pool(tmp_path):
    path = tmp_path / "shared.pool"
    path.write_bytes(b"")
    os.truncate(path, 32 << 20)
    return str(path)


def run(capsys, *argv):
    status = cli.main(["kv", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_format_stats_dump_verify_and_a_corrupted_block_named(pool, capsys):
    assert run(capsys, "format", "--pool", pool, "--hosts", "4", "--slots", "32")[0] == 0
    status, _, err = run(capsys, "format", "--pool", pool)
    assert status == 1 and "already holds a store; --force" in err and len(err.strip().splitlines()) == 1
    with cli_kv.kv.Store.open(pool, host=2) as s:
        assert s.chunk_tokens == KV_CHUNK_TOKENS
        s.put("a", b"x" * 5000)
        s.put("b", b"y" * 7000)
        (_, slot, rec), = s.find("b")
    status, text, _ = run(capsys, "stats", "--pool", pool, "--json")
    st = json.loads(text)
    assert status == 0 and st["blocks"] == 2 and st["bytes"] == 12000 and st["hosts"][2]["blocks"] == 2
    status, text, _ = run(capsys, "dump", "--pool", pool)
    records = [json.loads(line) for line in text.splitlines()]
    assert {(r["host"], r["length"], r["state"]) for r in records} == {(2, 5000, "published"), (2, 7000, "published")}
    assert run(capsys, "verify", "--pool", pool)[0] == 0
    with open(pool, "r+b") as f:                     # one byte of b's block flipped
        f.seek(cli_kv.kv.HOME + rec["offset"] + 10)   # the store starts at the file's byte HOME
        f.write(b"Z")
    status, text, _ = run(capsys, "verify", "--pool", pool)
    assert status == 1 and f"bad: host 2 slot {slot} key {rec['key'].hex()}: block fails its crc" in text


def test_bench_measures_the_host_path_and_prints_the_modelled_table(pool, capsys):
    run(capsys, "format", "--pool", pool, "--hosts", "2", "--slots", "64")
    status, text, _ = run(capsys, "bench", "--pool", pool, "--host", "1", "--blocks", "8", "--size", "64K", "--json")
    report = json.loads(text)
    m = report["measured"]
    assert status == 0 and m["blocks"] == 8 and m["block_bytes"] == 65536 and m["store_gbs"] > 0 and m["load_gbs"] > 0
    rows = {r["model"]: r for r in report["modelled"]}
    assert rows["llama-8b"]["chunk_bytes"] == 131072 * KV_CHUNK_TOKENS
    for r in rows.values():      # the photonic appliance sits between host DRAM and the electrical pool
        assert r["dram_ms"] < r["pf_ms"] < r["electrical_ms"] < r["recompute_ms"]
    status, text, _ = run(capsys, "stats", "--pool", pool, "--json")
    assert json.loads(text)["blocks"] == 0 and json.loads(text)["hosts"][1]["evictions"] == 0


def test_bad_input_is_one_line(pool, capsys, tmp_path):
    status, _, err = run(capsys, "stats", "--pool", pool)
    assert status == 1 and err.strip() == f"pfcxl: error: {pool} holds no store (no PFKVSTOR magic at byte 2097152); " \
                                          "format it first"
    run(capsys, "format", "--pool", pool, "--hosts", "2")
    status, _, err = run(capsys, "bench", "--pool", pool, "--host", "5")
    assert status == 1 and err.strip() == "pfcxl: error: host 5 is out of range (0 <= host < 2)"
    status, _, err = run(capsys, "bench", "--pool", pool, "--size", "64M")
    assert status == 1 and err.startswith("pfcxl: error: bench --blocks 16 --size 64 MiB: host 0's arena (") \
        and "slots) holds 0 such blocks" in err and len(err.strip().splitlines()) == 1
    status, _, err = run(capsys, "stats", "--pool", str(tmp_path / "absent"))
    assert status == 1 and "cannot open" in err and len(err.strip().splitlines()) == 1
    for action in ("stats", "dump", "verify", "bench", "format"):   # no appliance: ApplianceError's status
        status, _, err = run(capsys, action, "--run-dir", str(tmp_path / "nowhere"))
        assert status == 7 and "no pool there" in err and len(err.strip().splitlines()) == 1


def test_every_action_takes_the_stores_base(pool, capsys):
    """--offset (or --base) puts the store anywhere in the file; every action opens it there, and a
    bad base is one line before anything is written."""
    status, text, _ = run(capsys, "format", "--pool", pool, "--hosts", "2", "--slots", "8", "--offset", "4M")
    assert status == 0 and "store at byte 4194304" in text
    with open(pool, "rb") as f:
        assert f.read(4 << 20) == bytes(4 << 20) and f.read(8) == cli_kv.kv.MAGIC
    status, text, _ = run(capsys, "bench", "--pool", pool, "--base", "4M", "--blocks", "2", "--size", "8K", "--json")
    assert status == 0 and json.loads(text)["measured"]["blocks"] == 2
    for action in ("stats", "dump", "verify"):
        assert run(capsys, action, "--pool", pool, "--offset", "4194304")[0] == 0
    status, _, err = run(capsys, "stats", "--pool", pool)
    assert status == 1 and err.strip().endswith("(no PFKVSTOR magic at byte 2097152); format it first")
    for bad, why in (("100", "store base 100 is not a non-negative multiple of 4096"),
                     ("32M", f"{pool} is 33554432 bytes: too small for a store at byte 33554432")):
        status, _, err = run(capsys, "format", "--pool", pool, "--force", "--base", bad)
        assert status == 1 and err.strip() == f"pfcxl: error: {why}"
    with pytest.raises(SystemExit):
        cli.main(["kv", "stats", "--pool", pool, "--base", "x"])
    assert "argument --base/--offset: 'x' is not a size" in capsys.readouterr().err
    assert run(capsys, "verify", "--pool", pool, "--base", "4M")[0] == 0      # still there, untouched


@pytest.mark.parametrize("argv,why", [(["--size", "12"], "--size 12 must be a positive multiple of 8"),
                                      (["--blocks", "0"], "--blocks 0 at least 1"),
                                      (["--size", "lots"], "'lots' is not a size")])
def test_the_kv_path_benchmark_refuses_bad_input_before_booting(argv, why, capsys):
    from pfcxl.host_tools.experiments import kv_path as kv_path_bench
    with pytest.raises(SystemExit) as exc:
        kv_path_bench.main(argv)
    assert exc.value.code == 2 and why in capsys.readouterr().err


def test_the_kv_path_benchmark_rates():
    from pfcxl.host_tools.experiments import kv_path as kv_path_bench
    r = kv_path_bench.row("direct", "guest C", 16, 1 << 20, store_s=2.0, load_s=0.5, base=0)
    assert (r["store_blocks_s"], r["load_blocks_s"]) == (8.0, 32.0)
    assert r["store_GBps"] == 16 * (1 << 20) / 2.0 / 1e9 and r["load_GBps"] == 4 * r["store_GBps"]


def test_an_empty_pool_file_and_a_huge_bench_block_are_one_line(pool, capsys, tmp_path):
    empty = tmp_path / "empty.pool"
    empty.write_bytes(b"")
    for action in ("stats", "format", "dump", "verify", "bench"):
        status, _, err = run(capsys, action, "--pool", str(empty))
        assert status == 1 and err == f"pfcxl: error: {empty} is 0 bytes: too small for a store at byte 2097152\n"
    run(capsys, "format", "--pool", pool, "--hosts", "2")
    for size in ("1T", "64G"):                    # checked against the arena before the payload is made
        status, _, err = run(capsys, "bench", "--pool", pool, "--size", size)
        assert status == 1 and err.startswith("pfcxl: error: bench --blocks ") and "holds 0 such blocks" in err
        assert err.count("\n") == 1


@pytest.mark.parametrize("blocks,size", [(1, "9M"), (40, "4K"), (9, "1M"), (200, "1K"), (8, "1000000")])
def test_bench_that_cannot_fit_the_arena_says_so_before_writing_anything(pool, capsys, blocks, size):
    """4 arenas of ~8 MiB with 32 slots each: too many blocks for the slots, or too many bytes for
    the arena, is one line naming the room, and the store is as it was (nothing stored, nothing
    evicted); what fits runs."""
    run(capsys, "format", "--pool", pool, "--hosts", "4", "--slots", "32")
    with cli_kv.kv.Store.open(pool, host=3) as s:
        s.put("kept", b"k" * 1000)
        lo, hi = s.arena(3)
    before = json.loads(run(capsys, "stats", "--pool", pool, "--json")[1])
    block = cli_kv._size(size)
    fits = blocks <= 32 and blocks * (-(-block // 64) * 64) <= hi - lo
    status, _, err = run(capsys, "bench", "--pool", pool, "--host", "3", "--blocks", str(blocks), "--size", size,
                         "--json")
    if fits:
        assert status == 0, err
    else:
        assert status == 1 and len(err.strip().splitlines()) == 1 and "such blocks; give fewer" in err, err
        assert json.loads(run(capsys, "stats", "--pool", pool, "--json")[1]) == before


def test_bench_defaults_fit_the_default_format(tmp_path, capsys):
    """`kv format` then `kv bench` with their defaults, on a pool of pf-appliance's shared size."""
    from pfcxl.device import topology
    topo = topology.load(topology.resolve(cli_kv.DEFAULT_APPLIANCE))
    path = tmp_path / "shared.pool"
    path.write_bytes(b"")
    os.truncate(path, topo.appliance.shared)
    assert run(capsys, "format", "--pool", str(path))[0] == 0
    for host in (0, 15):
        status, _, err = run(capsys, "bench", "--pool", str(path), "--host", str(host), "--json")
        assert status == 0, err
