"""`pfcxl kv replay` hosts that do not wait for each other at every batch's end (replay.drive), the
blocks a request is served on (the ones its input fills, as the serving model counts them), host
processes that leave with the replay however it dies, and inputs refused before the store is
formatted. The scheduling tests drive a crew that answers when the test says, so what they see
does not depend on the machine's speed."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pfcxl.errors import PfcxlError
from pfcxl.host_tools.kv import replay as R
from pfcxl.host_tools.kv.replay_host import COUNTS
from pfcxl.serving import traces
from pfcxl.serving.hosts_sim import HostsSetup, replay_hosts
from pfcxl.serving.traces import Request

from tests.replay_cases import DOZEN, requests
from .test_kv_replay import cli, pool

pytestmark = pytest.mark.component


class HeldCrew:
    """A crew for replay.drive whose hosts serve in order and answer at once, except that a
    request in `held` is answered only when no other host has anything to answer. `posted`: every
    request in the order it was sent, with `answered` (the held ones answered so far) at that time."""

    def __init__(self, requests: int, held: set[int]) -> None:
        self.held, self.queues, self.posted = held, {}, []
        self.answered: set[int] = set()
        self.counts: list[dict | None] = [None] * requests

    def post(self, h, work):
        for i, blocks in work:
            self.queues.setdefault(h, []).append((i, blocks))
            self.posted.append((i, h, frozenset(self.answered)))

    def ready(self, timeout):
        heads = [(h, q[0]) for h, q in self.queues.items() if q]
        quick = [(h, w) for h, w in heads if w[0] not in self.held]
        done = []
        for h, (i, blocks) in quick or heads[:1]:
            self.queues[h].pop(0)
            self.counts[i] = dict(dict.fromkeys(COUNTS, 0), blocks=len(blocks))
            if i in self.held:
                self.answered.add(i)
            done.append(i)
        return done

    def kill(self, h):
        raise AssertionError("no kill here")

    def results(self):
        return list(self.counts)


def drive(tmp_path, reqs, mode, held, **kw):
    path = pool(tmp_path, hosts=2)
    setup = R.ReplaySetup(path, None, 2, 64, 4096, **kw)
    crew = HeldCrew(len(reqs), held)
    with R.kv.Store.open(path) as reader:
        out = R.drive(setup, reqs, mode, reader, crew)
    return out, crew


def pairs(n, shared_block=None):
    """n batches of two requests (round-robin: host 0 then host 1), request i on block 10 i + 1;
    with shared_block=(k, i): batch k's second request needs request i's block first."""
    out = []
    for k in range(n):
        a, b = [10 * (2 * k) + 1], [10 * (2 * k + 1) + 1]
        if shared_block is not None and shared_block[0] == k:
            b = [10 * shared_block[1] + 1, *b]
        out += [Request(k * 1000, 512 * len(a), 1, tuple(a)), Request(k * 1000, 512 * len(b), 1, tuple(b))]
    return out


@pytest.mark.parametrize("mode", R.MODES)
def test_a_host_goes_on_while_another_still_serves_an_earlier_batch(tmp_path, mode):
    reqs = pairs(40)
    out, crew = drive(tmp_path, reqs, mode, held={0})          # host 0's first request is slow
    before = [i for i, h, answered in crew.posted if 0 not in answered]
    # host 1 got its share of the batches within AHEAD of the held one, not only batch 0's
    assert {i for i in before if i % 2} == {2 * k + 1 for k in range(R.AHEAD + 1)}
    assert all(r is not None for r in out["results"]) and out["overall"]["requests"] == 80
    assert out["ahead"] == R.AHEAD and out["waits"]["batches"] == 40


def test_ahead_0_waits_at_every_batch_end(tmp_path):
    reqs = pairs(10)
    _, crew = drive(tmp_path, reqs, "shared", held={0}, ahead=0)
    assert [i for i, _, answered in crew.posted if 0 not in answered] == [0, 1]


def test_prefix_routing_waits_for_the_batch_before(tmp_path):
    reqs = pairs(10)
    out, crew = drive(tmp_path, reqs, "shared", held={0}, routing="prefix")
    assert out["ahead"] == 0
    assert {i for i, _, answered in crew.posted if 0 not in answered} == {0, 1}


def test_shared_a_request_waits_for_the_first_holder_of_its_blocks_and_no_more(tmp_path):
    reqs = pairs(20, shared_block=(3, 0))        # batch 3's request on host 1 needs request 0's block
    _, crew = drive(tmp_path, reqs, "shared", held={0})
    order = [i for i, _, _ in crew.posted]
    sent = {i: answered for i, _, answered in crew.posted}
    assert 0 in sent[7]                          # request 7 (batch 3, host 1) went after request 0's answer
    assert all(0 not in sent[i] for i in (1, 3, 5))       # host 1's earlier requests did not wait for it
    assert order.index(7) > order.index(5)        # and host 1 served its share in trace order
    # local caches never read another host's blocks: nothing to wait for
    _, crew = drive(tmp_path, reqs, "local", held={0})
    assert {i for i, _, answered in crew.posted if 0 not in answered} >= {1, 3, 5, 7}


def test_streamed_hosts_count_what_lockstep_hosts_count_without_evictions(tmp_path):
    """No evictions: every request sees the blocks of its blocks' first holders, whichever host
    runs ahead, so each request's counts are the lockstep replay's (processes on a pool file)."""
    full = traces.load(traces.bundled("conversation"))
    # a second apart: no two requests in a batch, so no race decides who stores a block
    reqs = [Request(i * 1000, r.input_length, r.output_length, r.hash_ids) for i, r in enumerate(full.requests[:400])]
    path = pool(tmp_path, size=64 << 20)
    blocks = len({b for r in reqs for b in r.hash_ids})
    runs = {a: R.run(R.ReplaySetup(path, None, 4, 2 * blocks, 256, ahead=a), reqs, "shared") for a in (0, 16)}
    assert runs[0]["overall"]["evictions"] == 0 and runs[0]["overall"]["other"] > 0
    for key in ("host_of", "results", "overall", "check"):
        assert runs[16][key] == runs[0][key], key
    for r in runs.values():
        w = r["waits"]
        assert len(w["host_s"]) == 4 and all(s >= 0 for s in w["host_s"])
        assert w["total_s"] == pytest.approx(sum(w["host_s"]), abs=0.01)


def test_a_request_is_served_on_the_blocks_its_input_fills_as_the_serving_model_counts(tmp_path):
    """A hand-made trace whose requests carry more ids than their input fills: the store's replay
    and the serving model serve ceil(input_length / 512) blocks of each, request by request."""
    rows = [(512, [1, 2, 3, 4]), (1024, [1, 2, 9]), (1, [1, 7, 7, 7]), (1536, [1, 2, 3, 5]), (513, [1, 2, 8]),
            (512, [1, 2])]
    trace_file = tmp_path / "extra.jsonl"
    trace_file.write_text("".join(json.dumps(dict(timestamp=i * 1000, input_length=n, output_length=1, hash_ids=ids))
                                  + "\n" for i, (n, ids) in enumerate(rows)))
    trace = traces.load(trace_file)
    served = [-(-n // 512) for n, _ in rows]                      # 1, 2, 1, 3, 2, 1
    for mode in R.MODES:
        store = R.run(R.ReplaySetup(pool(tmp_path), None, 2, 64, 256), list(trace.requests), mode)
        model = replay_hosts(HostsSetup(trace, 2, mode, "round-robin"))
        assert [r["blocks"] for r in store["results"]] == served
        assert [r["hits"] for r in store["results"]] == model.hits
        assert store["overall"]["blocks"] == sum(h["blocks"] for h in model.hosts) == sum(served)
        assert store["overall"]["stored"] == sum(h["stored"] for h in model.hosts)
    # by hand, shared: 1 stored; 1 hit, 2 stored; 1 hit; 1 2 hit, 3 stored; 1 2 hit; 1 hit
    assert model.hits == [0, 1, 1, 2, 2, 1]


# ---- inputs refused before anything is written

@pytest.mark.parametrize("at", [float("nan"), float("inf"), float("-inf"), -1.0])
def test_a_kill_time_that_is_not_a_finite_number_is_one_line_and_formats_nothing(tmp_path, at):
    path = pool(tmp_path, hosts=2, size=8 << 20)
    before = open(path, "rb").read()
    with pytest.raises(PfcxlError, match="--at .* must be a finite number of seconds") as e:
        R.run(R.ReplaySetup(path, None, 2, 16, 4096, kill_host=0, kill_at=at), requests(DOZEN), "shared")
    assert "\n" not in str(e.value) and open(path, "rb").read() == before


def test_a_kill_time_past_the_replay_leaves_every_host_alive(tmp_path):
    out = R.run(R.ReplaySetup(pool(tmp_path), None, 2, 64, 4096, kill_host=0, kill_at=1e308), requests(DOZEN),
                "shared")
    assert out["killed"] == dict(host=0, at_s=None, unfinished=[]) and out["overall"]["requests"] == 12


def test_killing_the_only_host_is_refused_before_the_store_is_formatted(tmp_path, capsys):
    path = pool(tmp_path, hosts=2, size=8 << 20)
    before = open(path, "rb").read()
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(dict(timestamp=0, input_length=512, output_length=1, hash_ids=[1])) + "\n")
    for argv, words in [(["--hosts", "1", "--kill-host", "0", "--at", "0"], "give 2 or more hosts"),
                        (["--hosts", "2", "--kill-host", "0", "--at", "nan"], "--at nan must be a finite"),
                        (["--hosts", "2", "--kill-host", "0", "--at", "inf"], "--at inf must be a finite"),
                        (["--hosts", "2", "--ahead", "-1"], "--ahead -1 must not be negative")]:
        status, _, err = cli(capsys, str(trace), "--pool", path, "--capacity", "16", *argv)
        assert status != 0 and words in err and len(err.strip().splitlines()) == 1, err
    assert open(path, "rb").read() == before


# ---- the hosts leave with the replay

DRIVER = textwrap.dedent("""
    import sys, time
    from pfcxl.host_tools.kv import replay as R
    setup = R.ReplaySetup(sys.argv[1], None, 3, 16, 4096)
    crew = R.Processes(setup, 100, False)
    if sys.argv[2] == "busy":                  # each host mid-request, waiting on a claim's rendezvous
        for h in range(3):
            crew.post(h, [(h, list(range(100000)))])
    print(" ".join(str(p.pid) for p in crew.procs), flush=True)
    time.sleep(3600)
""")


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
@pytest.mark.parametrize("state", ["idle", "busy"])
def test_the_hosts_leave_when_the_replay_dies_however_it_dies(tmp_path, how, state):
    path = pool(tmp_path)
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, path, state], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in driver.stdout.readline().split()]
        assert len(pids) == 3 and not any(gone(p) for p in pids)
        driver.send_signal(how)
        driver.wait(timeout=60)
        deadline = time.monotonic() + 60
        while not all(gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(gone(p) for p in pids), [p for p in pids if not gone(p)]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        driver.stdout.close()
    # the leases they left are dead ones: the next replay on the pool goes ahead
    out = R.run(R.ReplaySetup(path, None, 3, 16, 4096, stale_s=0.3), requests(DOZEN), "shared")
    assert out["overall"]["requests"] == 12 and out["check"]["bad"] == 0
