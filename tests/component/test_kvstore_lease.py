"""One writer per host (docs/kvstore.md, "One writer per host"): the lease in the host's header
line, taken on open, released on close, kept by the heartbeat; a second opener of a host is
refused in one line naming it, by the Python binding and the C tool alike; a dead holder's lease
expires after stale_s, as its claims do."""

import multiprocessing
import os
import signal
import struct
import subprocess
import time

import pytest

from pfcxl.host_tools.cli import main as cli
from pfcxl.guest.python import pfcxl_kvstore as kv

from .conftest import compile_guest_tool, kv_pool

BUSY = "host {h} is open for writing by another process (its lease is held and its heartbeat moves): close it " \
       "there, or use another host"

pytestmark = pytest.mark.component


@pytest.fixture(scope="module")
def tool():
    return compile_guest_tool("kvstore")


def lease_of(path: str, host: int) -> int:
    with kv.Store.open(path) as s:
        return s._header(host)["lease"]


def _writer(path, host, blocks, ready, results):
    try:
        with kv.Store.open(path, host=host, stale_s=2.0) as s:
            ready.wait(30)
            acked = [i for i in range(blocks) if s.put(f"w{os.getpid()}/{i}", bytes([i % 251]) * 4096)]
            results.put((os.getpid(), acked, None))
    except kv.KVError as exc:
        ready.wait(30)
        results.put((os.getpid(), [], str(exc)))


def test_two_processes_opening_one_host_one_is_refused_and_no_acknowledged_put_is_lost(tmp_path):
    """Both open host 0 and put 150 blocks each: the second opener is refused (one line naming the
    host); every put the first acknowledged reads back and verify finds nothing bad."""
    path = kv_pool(tmp_path, 32 << 20, hosts=2, slots=512)
    ctx = multiprocessing.get_context("fork")
    ready, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(path, 0, 150, ready, results)) for _ in range(2)]
    procs[0].start()
    while lease_of(path, 0) == 0:                # the first holds the lease before the second opens
        time.sleep(0.01)
    procs[1].start()
    time.sleep(0.5)
    ready.set()
    outcome = {pid: (acked, err) for pid, acked, err in (results.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(60)
    assert outcome[procs[1].pid] == ([], BUSY.format(h=0))
    acked, err = outcome[procs[0].pid]
    assert err is None and len(acked) == 150
    with kv.Store.open(path) as s:
        assert all(s.get(f"w{procs[0].pid}/{i}") == bytes([i % 251]) * 4096 for i in acked)
        assert s.verify() == {"good": 150, "bad": [], "claims": 0}
    assert lease_of(path, 0) == 0                # released on close


def test_close_releases_the_lease_and_an_idle_holder_keeps_it(tmp_path):
    path = kv_pool(tmp_path, 8 << 20, hosts=2, slots=8)
    with kv.Store.open(path, host=1, stale_s=0.3) as s:
        assert lease_of(path, 1) == s.lease != 0
        time.sleep(1.0)                          # idle for three times stale_s: the heartbeat goes on
        with pytest.raises(kv.KVError, match=f"^{BUSY.format(h=1)}$".replace("(", r"\(").replace(")", r"\)")):
            kv.Store.open(path, host=1, stale_s=0.3)
        assert s.put("still-mine", b"x" * 100)
    assert lease_of(path, 1) == 0
    with kv.Store.open(path, host=1, stale_s=0.3) as again:   # at once: nothing to wait for
        assert again.get("still-mine") == b"x" * 100


def _hold_and_claim(path):
    with kv.Store.open(path, host=1, stale_s=0.5) as s:
        s.put("dead-claim", bytes(256 << 20))     # long enough to be killed in the middle


def test_a_killed_holders_lease_expires_after_stale_s_and_the_next_opener_takes_the_host(tmp_path):
    path = kv_pool(tmp_path, 600 << 20, hosts=2, slots=8)
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_hold_and_claim, args=(path,))
    child.start()
    with kv.Store.open(path) as view:
        deadline = time.monotonic() + 60
        while not any(st & 1 for h, _, _, st in view.scan() if h == 1) and time.monotonic() < deadline:
            time.sleep(0.005)
        dead = view._header(1)["lease"]
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert dead != 0 and lease_of(path, 1) == dead
    with kv.Store.open(path, host=1, stale_s=0.5) as s:       # waits out stale_s, then takes it
        assert s.lease not in (0, dead) and s.verify()["claims"] == 0     # the dead one's claim withdrawn
        assert s.put("after", b"y" * 4096)


def test_a_process_whose_lease_was_taken_stops_writing(tmp_path):
    path = kv_pool(tmp_path, 8 << 20, hosts=2, slots=8)
    with kv.Store.open(path, host=0) as s:
        assert s.put("before", b"a" * 64)
        struct.pack_into("<Q", s.m.mem, s._header_at(0) + kv.HEADER.offset["lease"], 12345)   # another opener
        with pytest.raises(kv.KVError, match="^host 0's lease was taken by another process: this store no longer "
                                             "writes$"):
            s.put("after", b"b" * 64)
        assert s.get("after") is None
    assert lease_of(path, 0) == 12345            # not ours to release


def test_the_c_tool_and_python_refuse_each_other_and_the_tool_releases_on_every_exit(tool, tmp_path):
    path = kv_pool(tmp_path, 16 << 20, hosts=4, slots=16)

    def kvstore(*args):
        return subprocess.run([str(tool), *args], capture_output=True, text=True, timeout=60)
    with kv.Store.open(path, host=2):
        done = kvstore("put", path, "--host", "2", "--key", "k", "--size", "64")
        assert done.returncode == 2 and done.stderr == f"kvstore: {path} {BUSY.format(h=2)}\n"
        assert kvstore("put", path, "--host", "3", "--key", "k", "--size", "64").returncode == 0
        assert kvstore("get", path, "--key", "k").returncode == 0               # reading takes no lease
    assert kvstore("put", path, "--host", "2", "--key", "k2", "--size", "64").returncode == 0
    assert lease_of(path, 2) == 0 and lease_of(path, 3) == 0
    done = kvstore("put", path, "--host", "2", "--key", "big", "--size", "8M")   # dies after taking the lease
    assert done.returncode == 2 and "does not fit" in done.stderr and lease_of(path, 2) == 0


def test_a_version_1_store_is_refused_in_one_line_by_every_opener(tool, tmp_path, capsys):
    path = kv_pool(tmp_path, 8 << 20, hosts=2, slots=8)
    with open(path, "r+b") as f:                  # the superblock as version 1 wrote it: no lease field
        f.seek(kv.HOME)
        raw = bytearray(f.read(kv.SUPER.st.size))
        struct.pack_into("<I", raw, kv.SUPER.offset["version"], 1)
        struct.pack_into("<I", raw, kv.SUPER.offset["crc"], __import__("zlib").crc32(raw[:-4]))
        f.seek(kv.HOME)
        f.write(raw)
    why = f"store version 1 is not this code's version {kv.VERSION}: format it anew (every block is lost)"
    with pytest.raises(kv.KVError, match=f"^{why.replace('(', '[(]').replace(')', '[)]')}$"):
        kv.Store.open(path)
    done = subprocess.run([str(tool), "verify", path], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr == f"kvstore: {path} {why}\n"
    assert cli.main(["kv", "stats", "--pool", path]) == 1
    assert capsys.readouterr().err.strip() == f"pfcxl: error: {why}"
