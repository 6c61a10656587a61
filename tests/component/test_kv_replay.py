"""`pfcxl kv replay` (host_tools/kv/replay.py): host processes replaying a trace through the real
store on a pool file. Hits are checked against hand-computed ones; every load is checked."""

import json
import os
import random
import struct
import zlib

import pytest

from pfcxl.errors import PfcxlError
from pfcxl.host_tools.kv import replay as R
from pfcxl.host_tools.cli.main import main as cli_main
from pfcxl.host_tools.kv import replay_host as H
from pfcxl.serving.traces import Request

pytestmark = pytest.mark.component

from tests.replay_cases import DOZEN, HAND, requests


def pool(tmp_path, hosts=4, size=64 << 20):
    path = tmp_path / "pool"
    path.write_bytes(b"")
    os.truncate(path, size)
    R.kv.format(str(path), hosts=hosts, slots=16, chunk_tokens=512)
    return str(path)


def synthetic(n, seed, same_time=False):
    """Conversations that grow: each request extends an earlier one's blocks or starts anew."""
    rng = random.Random(seed)
    out, fresh = [], 1000
    for i in range(n):
        if out and rng.random() < 0.7:
            base = list(rng.choice(out))[:rng.randint(1, 6)]
        else:
            base = []
        tail = list(range(fresh, fresh + rng.randint(1, 4)))
        fresh += len(tail)
        out.append(base + tail)
    return requests(out, 0 if same_time else 1000)


@pytest.mark.parametrize("mode,routing", sorted(HAND))
def test_a_dozen_requests_hit_as_worked_out_by_hand(tmp_path, mode, routing):
    path = pool(tmp_path)
    reqs = requests(DOZEN)
    out = R.run(R.ReplaySetup(path, None, 3, 64, 4096, routing=routing), reqs, mode)
    assert [(h["hits"], h["own"], h["other"]) for h in out["hosts"]] == HAND[(mode, routing)]
    o = out["overall"]
    assert o["requests"] == 12 and o["blocks"] == 35 and o["bad"] == 0 and o["lost"] == 0
    assert o["checked"] == o["hits"]                         # every load was compared with its id's bytes
    assert o["stored"] == o["blocks"] - o["hits"] - o["present"]
    assert out["check"] == dict(good=o["stored"], bad=0, claims=0)


def test_local_never_reads_another_arena_and_one_host_shared_equals_local(tmp_path):
    path = pool(tmp_path)
    reqs = synthetic(150, seed=3)
    local = R.run(R.ReplaySetup(path, None, 4, 40, 1000, routing="round-robin"), reqs, "local")
    assert local["overall"]["evictions"] > 0 and local["overall"]["hits"] > 0
    assert all(h["other"] == 0 and h["own"] == h["hits"] for h in local["hosts"])
    one = [R.run(R.ReplaySetup(path, None, 1, 40, 1000), reqs, m) for m in R.MODES]
    assert one[0]["results"] == one[1]["results"] and one[0]["overall"] == one[1]["overall"]
    assert one[0]["overall"]["evictions"] > 0


@pytest.mark.parametrize("routing", R.ROUTINGS)
def test_concurrent_hosts_with_evictions_load_only_correct_bytes(tmp_path, routing):
    path = pool(tmp_path)
    reqs = synthetic(300, seed=7, same_time=True)          # one batch: four hosts at once
    out = R.run(R.ReplaySetup(path, None, 4, 30, 3000, routing=routing), reqs, "shared")
    o = out["overall"]
    assert o["requests"] == 300 and o["bad"] == 0 and o["checked"] == o["hits"] and o["evictions"] > 0
    assert out["check"]["bad"] == 0 and out["check"]["claims"] == 0
    if routing == "round-robin":                             # conversations spread: hosts read each other's
        assert o["other"] > 0


def test_a_block_that_fails_its_check_is_counted_and_never_served(tmp_path):
    path = pool(tmp_path, hosts=1)
    reqs = requests([[1, 2, 3]])
    R.run(R.ReplaySetup(path, None, 1, 16, 4096), reqs, "shared")
    with R.kv.Store.open(path, host=0) as s:
        (_, slot2, rec2), = s.find(H.block_key(2))
        s.m.mem[rec2["offset"]] ^= 0xFF                     # block 2's bytes no longer match its crc
        (_, slot3, rec3), = s.find(H.block_key(3))
        # block 3's record now names block 1's (crc-correct) bytes: only the id check can see it
        (_, _, rec1), = s.find(H.block_key(1))
        s.m.mem[rec3["offset"]:rec3["offset"] + 4096] = s.m.mem[rec1["offset"]:rec1["offset"] + 4096]
        raw = bytearray(R.kv.RECORD.pack(**dict(rec3, crc=rec1["crc"])))
        struct.pack_into("<I", raw, R.kv.SIGNED, zlib.crc32(raw[:R.kv.SIGNED]))
        at = s._slot_at(0, slot3)
        s.m.mem[at:at + R.kv.LINE] = raw
        c = H.serve(s, [1, 2], False, 4096)
        assert (c["hits"], c["bad"], c["checked"]) == (1, 1, 1)     # block 2 refused, not loaded
        c = H.serve(s, [1, 3], False, 4096)
        assert (c["hits"], c["bad"], c["checked"]) == (1, 1, 2)     # block 3 read, compared, refused


def test_a_host_killed_mid_replay_leaves_no_wrong_block_and_the_others_finish(tmp_path):
    path = pool(tmp_path)
    reqs = synthetic(3000, seed=11, same_time=True)
    out = R.run(R.ReplaySetup(path, None, 4, 64, 4096, routing="round-robin", kill_host=2, kill_at=0.3, stale_s=0.2),
                reqs, "shared")
    k = out["killed"]
    assert k["host"] == 2 and k["at_s"] is not None and k["unfinished"]
    assert all(out["host_of"][i] == 2 for i in k["unfinished"])
    unfinished = set(k["unfinished"])
    assert all((r is None) == (i in unfinished) for i, r in enumerate(out["results"]))
    assert out["overall"]["bad"] == 0 and out["check"]["bad"] == 0
    with R.kv.Store.open(path) as s:
        assert s.verify()["bad"] == []


def test_bad_input_is_one_line_and_leaves_the_store_as_it_was(tmp_path):
    path = pool(tmp_path, hosts=2, size=8 << 20)
    before = open(path, "rb").read()
    reqs = requests(DOZEN)
    cases = [(R.ReplaySetup(path, None, 3, 16, 4096), "more than the store's 2 hosts"),
             (R.ReplaySetup(path, None, 2, 1 << 20, 4096), "--capacity 1048576 blocks"),
             (R.ReplaySetup(path, None, 2, 16, 4096, routing="random"), "routing 'random'"),
             (R.ReplaySetup(path, None, 2, 16, 4096, kill_host=5), "--kill-host 5"),
             (R.ReplaySetup(path, None, 2, 16, 4096, window_ms=-1), "--window -1")]
    for setup, words in cases:
        for mode in R.MODES:
            with pytest.raises(PfcxlError, match=words) as e:
                R.run(setup, reqs, mode)
            assert "\n" not in str(e.value)
    with pytest.raises(PfcxlError, match="no requests"):
        R.run(R.ReplaySetup(path, None, 2, 16, 4096), [], "shared")
    assert open(path, "rb").read() == before


def cli(capsys, *argv):
    status = cli_main(["kv", "replay", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_the_command_reports_both_modes_and_says_the_payloads_are_scaled(tmp_path, capsys):
    path = pool(tmp_path)
    trace = tmp_path / "dozen.jsonl"
    trace.write_text("".join(json.dumps(dict(timestamp=i * 1000, input_length=len(b) * 512, output_length=1,
                                             hash_ids=b)) + "\n" for i, b in enumerate(DOZEN)))
    status, text, _ = cli(capsys, str(trace), "--pool", path, "--hosts", "3", "--capacity", "64", "--compare",
                          "--routing", "session", "--json")
    out = json.loads(text)
    assert status == 0 and [m["mode"] for m in out["modes"]] == ["local", "shared"]
    for m in out["modes"]:
        assert [h["hits"] for h in m["hosts"]] == [14, 6, 1] and m["check"]["bad"] == 0
        assert m["ttft"]["pf"]["p50_ms"] > 0
    assert "scaled to 4 KiB" in out["note"] and "160 MiB per 512-token block" in out["note"]


def test_bad_input_at_the_command_is_one_line_and_leaves_the_store(tmp_path, capsys):
    path = pool(tmp_path, hosts=2, size=8 << 20)
    before = open(path, "rb").read()
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(dict(timestamp=0, input_length=512, output_length=1, hash_ids=[1])) + "\n")
    broken = tmp_path / "broken.jsonl"
    broken.write_text(good.read_text() + '{"timestamp": 5, "input_length": 512, "output_length": 1}\n')
    for argv, words in [([str(broken)], "hash_ids"),
                        ([str(good), "--hosts", "3"], "more than the store's 2 hosts"),
                        ([str(good), "--hosts", "2", "--capacity", "100000"], "--capacity 100000 blocks"),
                        ([str(good), "--hosts", "2", "--fabric", "pf"], "--fabric is for --on guests"),
                        ([str(good), "--hosts", "2", "--data-path", "direct"], "--data-path is for --on guests"),
                        ([str(good), "--on", "guests", "--kill-host", "1"], "--kill-host is for --on host"),
                        ([str(good), "--on", "guests", "--base", "0"], "--base 0: in guests")]:
        status, _, err = cli(capsys, *argv, "--pool", path, "--compare")
        assert status != 0 and words in err and len(err.strip().splitlines()) == 1, err
    assert open(path, "rb").read() == before


def test_a_host_that_cannot_open_the_store_is_one_line(tmp_path, monkeypatch):
    path = pool(tmp_path)
    real = H.kv.Store.open

    def refuse_host_1(*args, host=None, **kw):              # the hosts are forked: they see this
        if host == 1:
            raise H.kv.KVError("host 1 is open for writing by another process")
        return real(*args, host=host, **kw)
    monkeypatch.setattr(H.kv.Store, "open", refuse_host_1)
    with pytest.raises(PfcxlError, match="^replay host 1: host 1 is open for writing by another process$"):
        R.run(R.ReplaySetup(path, None, 3, 16, 4096), requests(DOZEN), "shared")


@pytest.mark.parametrize("stale", [0.01, 0.05])
def test_a_stale_shorter_than_the_heartbeat_does_not_fool_the_live_writer_check(tmp_path, stale):
    """An idle Python holder beats every 0.1 s: a replay with --stale 0.01 used to watch it for
    0.01 s, see no beat and format the store under it."""
    path = pool(tmp_path)
    with R.kv.Store.open(path, host=1) as live:
        live.put(b"theirs", b"x" * 4096)
        with pytest.raises(PfcxlError, match="host 1 of its store is open for writing by another process"):
            R.run(R.ReplaySetup(path, None, 3, 16, 4096, stale_s=stale), requests(DOZEN), "shared")
        assert live.get(b"theirs") == b"x" * 4096 and live.put(b"still", b"y")


@pytest.mark.parametrize("writer", range(4))
def test_replay_refuses_a_store_another_process_writes_and_leaves_it(tmp_path, writer):
    """A host of the store open for writing elsewhere (its lease held, its heartbeat moving): the
    replay says so in one line and formats nothing; a lease a dead process left does not stop it."""
    path = pool(tmp_path)
    with R.kv.Store.open(path, host=writer) as live:
        live.put(b"theirs", b"x" * 4096)
        for mode in R.MODES:
            with pytest.raises(PfcxlError, match=f"host {writer} of its store is open for writing by another "
                               "process") as e:
                R.run(R.ReplaySetup(path, None, 3, 16, 4096, stale_s=0.5), requests(DOZEN), mode)
            assert "\n" not in str(e.value)
        assert live.get(b"theirs") == b"x" * 4096 and live.find(b"theirs")[0][0] == writer
    pid = os.fork()
    if pid == 0:                                             # opens as `writer` and dies holding the lease
        R.kv.Store.open(path, host=writer)
        os._exit(0)
    os.waitpid(pid, 0)
    with R.kv.Store.open(path) as s:
        assert s.header(writer)["lease"] != 0
    out = R.run(R.ReplaySetup(path, None, 3, 16, 4096, stale_s=0.5), requests(DOZEN), "shared")
    assert out["overall"]["requests"] == 12 and out["check"]["bad"] == 0
