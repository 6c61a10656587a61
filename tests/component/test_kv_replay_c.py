"""The C store's replay hosts (guest/src/kvreplay.c, fed through mailboxes in the pool by
host_tools/kv/replay_mailbox.py, as `kv replay --on guests` feeds them in guests) against the
Python hosts of `--on host`, here on one pool file: the same requests, routed alike, give the same
counts request by request wherever the protocol is deterministic (one request at a time)."""

import dataclasses

import pytest

from pfcxl.errors import PfcxlError
from pfcxl.host_tools.kv import replay as R
from pfcxl.host_tools.kv import replay_guest as G
from pfcxl.serving import traces

from .conftest import compile_guest_tool
from .test_kv_replay import DOZEN, pool, requests, synthetic

pytestmark = pytest.mark.component


@pytest.fixture(scope="module")
def tool():
    return compile_guest_tool("kvreplay")


def c_replay(setup, reqs, modes, tool):
    return G.replay(setup, reqs, modes, lambda at: G.c_on_host(setup, tool, at), hello_s=60)


def same(c, py):
    """Everything the two replays report alike (the C side adds its lookup counts)."""
    for key in ("mode", "routing", "hosts", "overall", "host_of", "results", "check", "never_routed"):
        assert c[key] == py[key], key


def one_at_a_time(reqs):
    """The requests a second apart: each batch is one request, so no two hosts race for a block
    (requests that arrive together race, and who wins is not deterministic)."""
    return [dataclasses.replace(r, timestamp_ms=i * 1000) for i, r in enumerate(reqs)]


CASES = [("dozen", 3, 64, 4096), ("synthetic", 3, 30, 3000), ("synthetic", 1, 40, 1000),
         ("conversation", 2, 100, 4096), ("conversation", 4, 25, 512)]


@pytest.mark.parametrize("trace,hosts,capacity,size", CASES)
@pytest.mark.parametrize("routing", R.ROUTINGS)
def test_c_hosts_count_exactly_what_python_hosts_count(tmp_path, tool, trace, hosts, capacity, size, routing):
    reqs = (requests(DOZEN) if trace == "dozen" else synthetic(200, seed=5) if trace == "synthetic"
            else one_at_a_time(traces.load(traces.bundled("conversation")).requests[:60]))
    path = pool(tmp_path)
    # ahead=0: each batch after the one before. With evictions, a host that runs ahead evicts
    # sooner than the trace's order says, and then who finds what depends on the hosts' speed
    setup = R.ReplaySetup(path, None, hosts, capacity, size, routing=routing, ahead=0)
    c = c_replay(setup, reqs, R.MODES, tool)
    for mode, got in zip(R.MODES, c):
        py = R.run(setup, reqs, mode)
        same(got, py)
        o = got["overall"]
        assert o["bad"] == 0 and o["checked"] == o["hits"] and got["check"]["bad"] == 0
        if mode == "local":
            assert o["other"] == 0
        # a lookup reads at most a window of lines per host it looks in, whatever the slots
        for h, st in enumerate(got["lookups"]):
            assert st["lookups"] > 0
            assert st["index_lines"] <= st["lookups"] * R.kv.WINDOW * (1 if mode == "local" else 4)   # the store's hosts
    if trace != "dozen":
        assert c[0]["overall"]["evictions"] > 0


@pytest.mark.parametrize("routing", R.ROUTINGS)
def test_c_hosts_at_once_load_only_correct_bytes_and_account_for_every_block(tmp_path, tool, routing):
    """One batch: four C hosts at once, with evictions. Who wins a block's race is not
    deterministic; what must hold: every load checked and right, every block a request did not
    hit stored, found present or lost in a race, and the store clean."""
    path = pool(tmp_path)
    reqs = synthetic(300, seed=7, same_time=True)
    out, = c_replay(R.ReplaySetup(path, None, 4, 30, 3000, routing=routing), reqs, ["shared"], tool)
    o = out["overall"]
    assert o["requests"] == 300 and o["bad"] == 0 and o["checked"] == o["hits"] and o["evictions"] > 0
    for r in out["results"]:
        assert r["stored"] + r["present"] + r["lost"] == r["blocks"] - r["hits"]
        assert r["written"] == 3000 * r["stored"] and r["read"] == 3000 * r["hits"]
    assert out["check"]["bad"] == 0 and out["check"]["claims"] == 0
    assert out["check"]["good"] == o["stored"] - o["evictions"]       # what was stored and not evicted


def test_a_pool_without_room_for_the_mailboxes_is_one_line_and_left_alone(tmp_path, tool):
    path = pool(tmp_path, hosts=2, size=4 << 20)
    before = open(path, "rb").read()
    with pytest.raises(PfcxlError, match="needs .* bytes") as e:
        c_replay(R.ReplaySetup(path, None, 2, 16, 4096), requests(DOZEN), R.MODES, tool)
    assert "\n" not in str(e.value) and open(path, "rb").read() == before


def test_a_kvreplay_that_ends_is_one_line_not_a_wait(tmp_path, tool):
    path = pool(tmp_path)
    setup = R.ReplaySetup(path, None, 2, 16, 4096)
    with pytest.raises(PfcxlError, match="ended before they started: host [01] exit 2: kvreplay: --mailbox .* is not inside") as e:
        G.replay(setup, requests(DOZEN), R.MODES,
                 lambda at: G.c_on_host(setup, tool, at + (64 << 20)), hello_s=60)
    assert "\n" not in str(e.value)      # both hosts fail; whichever ends first is named


C_DRIVER = """
import sys, time
from pathlib import Path
from pfcxl.host_tools.kv import replay as R
from pfcxl.host_tools.kv import replay_guest as G
setup = R.ReplaySetup(sys.argv[1], None, 2, 16, 256)
need = R.fresh_store(setup, [R.Request(0, 512, 1, (1,))], G.room(2))
boxes = G.Mailboxes(setup.path, R.kv.HOME + G.offset(need), 2, 1, lambda: None)   # zeroes them: first
with G.c_on_host(setup, Path(sys.argv[2]), G.offset(need)):
    boxes.hello(60)
    boxes.open(False, 1.0)
    print("open", flush=True)
    time.sleep(3600)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_kvreplay_leaves_and_releases_its_lease_when_its_starter_dies(tmp_path, tool):
    import os
    import signal
    import subprocess
    import sys
    import time
    path = pool(tmp_path)
    driver = subprocess.Popen([sys.executable, "-c", C_DRIVER, path, str(tool)], stdout=subprocess.PIPE, text=True)
    kids: list[int] = []
    try:
        assert driver.stdout.readline().strip() == "open"
        with R.kv.Store.open(path) as s:
            assert all(s.header(h)["lease"] for h in range(2))
        kids = [int(p) for p in subprocess.run(["pgrep", "-P", str(driver.pid)], capture_output=True,
                                               text=True).stdout.split()]
        assert len(kids) == 2
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=60)
        deadline = time.monotonic() + 60
        while any(alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(k) for k in kids)
        with R.kv.Store.open(path) as s:
            assert not any(s.header(h)["lease"] for h in range(2))      # each released its lease as it left
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        driver.stdout.close()
        for k in kids:                       # what did not leave is not left behind by the test
            if alive(k):
                os.kill(k, signal.SIGKILL)
