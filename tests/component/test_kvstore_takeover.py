"""A holder that resumes (docs/kvstore.md, "A holder that resumes"): a process holding host 1 is
stopped (SIGSTOP) inside put() for longer than stale_s, another opener takes the host over and
acknowledges puts, and the first one resumes. It must write nothing over the new holder's blocks,
leave no claim that makes a lower host's put of its key wait for ever, and a get() it makes
afterwards must neither raise nor write.

The deterministic tests stop the holder at each point of its put in turn: the Python holder at
each line that put() and the writing methods it calls execute (a trace function, so the same test
runs against any version of the binding), the C tool before each of its writes to shared state
(PFCXL_KV_TEST_STOP, a -DKV_TEST_HOOKS build). The stress test
(host_tools/experiments/kv_takeover.py) stops Python and C holders at random moments."""

from __future__ import annotations

import functools
import itertools
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pfcxl.compile import compile_cached
from pfcxl.host_tools.experiments import kv_takeover
from pfcxl.guest.python import pfcxl_kvstore as kv
from pfcxl.host_tools.image import initramfs as image

from .conftest import compile_guest_tool, sparse_file

pattern = functools.lru_cache(kv_takeover.pattern)

pytestmark = pytest.mark.component

STALE = 0.5
SLOTS = 32
# the methods a put runs that write or decide to write; left out: readers (find, _valid), and the
# lease check's own lines (_confirm, _own_lease) and _set_header's, where a stop acts as one at the
# line that calls them
WRITERS = {"put", "_place", "_evict", "_withdraw", "_set_state", "_beat", "_may_write", "_contend"}
PUT_DONE, PUT_LOST, PUT_FAILED = 10, 11, 12


def _same_window(key: str, n: int, prefix: str) -> list[str]:
    """n keys whose bucket is `key`'s: the new holder's puts go where the stopped one's was going."""
    want = kv.bucket(kv.key_digest(key), SLOTS)
    return list(itertools.islice((k for k in (f"{prefix}/{i}" for i in itertools.count())
                                  if kv.bucket(kv.key_digest(k), SLOTS) == want), n))


def _pool(tmp_path: Path) -> tuple[str, int]:
    """A store of 2 hosts whose arenas hold 4 blocks each: the held-up put evicts one."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = str(sparse_file(tmp_path / "pool", 4 << 20))              # the C tool maps whole 2 MiB
    kv.format(path, hosts=2, slots=SLOTS, chunk_tokens=256, size=256 << 10)
    with kv.Store.open(path) as s:
        return path, s.sb["arena_bytes"] // 4 // 64 * 64


def _holder(path: str, size: int, stop_at: int, report_fd: int) -> None:
    """Child: hold host 1, store 4 blocks, then put "pending", stopping itself (SIGSTOP) at the
    stop_at-th line of the put (0: never; the count of lines is written to report_fd). After it
    resumes, get one of the new holder's keys. Exit status: PUT_DONE, PUT_LOST or PUT_FAILED."""
    lines = 0

    def local(frame, event, arg):
        nonlocal lines
        if event == "line":
            lines += 1
            if lines == stop_at:
                os.kill(os.getpid(), signal.SIGSTOP)
        return local

    def calls(frame, event, arg):
        code = frame.f_code
        return local if code.co_filename == kv.__file__ and code.co_name in WRITERS else None

    status = PUT_FAILED
    try:
        with kv.Store.open(path, host=1, stale_s=STALE) as s:
            for i in range(4):
                assert s.put(f"a/{i}", pattern(f"a/{i}", size))
            sys.settrace(calls)
            try:
                stored = s.put("pending", pattern("pending", size))
            except kv.KVError:
                stored = None
            finally:
                sys.settrace(None)
            if not stop_at:
                os.write(report_fd, f"{lines}\n".encode())
            for key in _same_window("pending", 2, "b"):
                got = s.get(key)
                assert got in (None, pattern(key, size))
            status = PUT_DONE if stored else PUT_LOST
    except BaseException as exc:     # the test names what went wrong (KeyError in _touch, before)
        os.write(2, f"holder: {type(exc).__name__}: {exc}\n".encode())
    os._exit(status)


def _fork_holder(path: str, size: int, stop_at: int) -> tuple[int, int]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _holder(path, size, stop_at, w)
    os.close(w)
    return pid, r


def _stopped(pid: int, timeout: float = 60) -> int | None:
    """Wait until `pid` stops (None) or ends (its exit status)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WUNTRACED | os.WNOHANG)
        if done:
            return None if os.WIFSTOPPED(status) else os.waitstatus_to_exitcode(status)
        time.sleep(0.002)
    raise AssertionError(f"holder {pid} neither stopped nor ended")


def _exit_status(pid: int, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -1      # a hang


def _take_over_and_check(path: str, size: int, resume, tool) -> dict:
    """Another process (this one) takes host 1 over from the stopped holder and acknowledges puts in
    the stopped put's window, `resume()` lets the holder go on; then a lower host stores the key
    the holder was storing (`lower_put`, must not wait for ever) and every acknowledged block of
    the new holder must read back, with nothing bad in the store."""
    with kv.Store.open(path, host=1, stale_s=STALE) as s:
        acked = [k for k in _same_window("pending", 3, "b") if s.put(k, pattern(k, size))]
        outcome = resume()
        try:
            done = subprocess.run([str(tool), "put", path, "--host", "0", "--key", "pending", "--size", str(size),
                                   "--stale-ms", str(round(STALE * 1000))], capture_output=True, text=True, timeout=20)
            lower = (done.returncode, done.stderr)
        except subprocess.TimeoutExpired:
            lower = ("hang", "")
        kept = [k for k in acked if any(rec["key"] == kv.key_digest(k) for rec in s.own.values())]
        return dict(outcome=outcome, acked=len(acked), kept=len(kept),
                    destroyed=[k for k in kept if s.get(k) != pattern(k, size)],
                    lower=lower,
                    bad=s.verify()["bad"])


def _problems(results, outcomes) -> dict:
    """What went wrong at each stopping point: the holder's end, the new holder's acknowledged
    blocks destroyed, the lower host's put, bad blocks (one dict, so that a failure lists them all)."""
    found = {}
    for n, r in results:
        why = [f"ended {r['outcome']}"] if r["outcome"] not in outcomes else []
        why += [f"{r['acked'] - r['kept'] + len(r['destroyed'])} of 3 acknowledged blocks destroyed"] \
            if r["destroyed"] or r["kept"] != r["acked"] or r["acked"] != 3 else []
        why += [f"lower put {r['lower']}"] if r["lower"][0] != 0 else []
        why += [f"verify: {len(r['bad'])} bad"] if r["bad"] else []
        if why:
            found[n] = why
    return found


@pytest.fixture(scope="module")
def tool():
    return compile_guest_tool("kvstore")


@pytest.fixture(scope="module")
def stopping_tool(tmp_path_factory):
    """kvstore built with -DKV_TEST_HOOKS: PFCXL_KV_TEST_STOP=N stops it before its N-th write."""
    src = image.GUEST_SOURCES / "kvstore.c"
    return compile_cached(src, image.tool_inputs(src), (*image.CFLAGS, "-DKV_TEST_HOOKS"),
                          tmp_path_factory.mktemp("kvstore-stopping"), "kvstore-stopping")


def test_a_python_holder_stopped_at_any_line_of_its_put_destroys_nothing_of_the_new_holders(tmp_path, tool):
    dry_path, size = _pool(tmp_path / "dry")
    pid, r = _fork_holder(dry_path, size, 0)
    assert _stopped(pid) == PUT_DONE
    lines = int(os.read(r, 100).split()[0])
    os.close(r)
    assert lines > 20, lines          # the put and its evictions, line by line
    cases = []
    for n in range(1, lines + 1):     # every holder forked before any thread starts here
        path, _ = _pool(tmp_path / f"at{n}")
        pid, r = _fork_holder(path, size, n)
        os.close(r)
        cases.append((n, path, pid))
    for n, _, pid in cases:
        assert _stopped(pid) is None, f"the holder did not reach line {n} of {lines}"

    def case(n, path, pid):
        def resume():
            os.kill(pid, signal.SIGCONT)
            return _exit_status(pid)
        return n, _take_over_and_check(path, size, resume, tool)
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda c: case(*c), cases))
    assert _problems(results, (PUT_DONE, PUT_LOST)) == {}


def test_a_c_holder_stopped_before_any_of_its_writes_destroys_nothing_of_the_new_holders(tmp_path, tool, stopping_tool):
    def start(path: str, size: int, n: int):
        with kv.Store.open(path, host=1, stale_s=STALE) as s:          # 4 blocks: the C put evicts one
            for i in range(4):
                s.put(f"a/{i}", pattern(f"a/{i}", size))
        return subprocess.Popen([str(stopping_tool), "put", path, "--host", "1", "--key", "pending", "--size",
                                 str(size), "--stale-ms", str(round(STALE * 1000))], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "PFCXL_KV_TEST_STOP": str(n)})
    cases, n = [], 1
    while True:
        path, size = _pool(tmp_path / f"at{n}")
        proc = start(path, size, n)
        deadline = time.monotonic() + 30
        while not _state_is_stopped(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        if proc.poll() is not None:                  # put done before an n-th write: every point tried
            assert proc.returncode == 0 and '"stored":1' in proc.stdout.read()
            break
        assert _state_is_stopped(proc.pid), f"the C holder neither stopped nor ended at write {n}"
        cases.append((n, path, size, proc))
        n += 1
    assert len(cases) > 8                            # evict, claim, copy, record, publish, header words

    def case(n, path, size, proc):
        def resume():
            os.kill(proc.pid, signal.SIGCONT)
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                return "hang"
            return proc.returncode, err
        return n, _take_over_and_check(path, size, resume, tool)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda c: case(*c), cases))
    assert _problems(results, ((0, ""), (2, "kvstore: host 1's lease was taken by another process: this tool no "
                                            "longer writes\n"))) == {}


def _state_is_stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] in "Tt"


def test_a_lost_lease_is_noticed_by_get_which_neither_raises_nor_writes(tmp_path):
    """The old holder's get of a key the new holder stored in its segment: it used to raise
    KeyError in _touch after writing the new holder's header clock and the record's last use."""
    path, size = _pool(tmp_path)
    old = kv.Store.open(path, host=1, stale_s=STALE)
    old._stop.set()
    old._beater.join()                    # a stopped holder: its heartbeat stands still
    try:
        with kv.Store.open(path, host=1, stale_s=STALE) as new:
            assert new.put("k", pattern("k", size))
            before = bytes(new.m.mem[new._header_at(1):new._header_at(1) + 64]), \
                bytes(new.m.mem[new.sb["index_off"] + SLOTS * 64:new.sb["arena_off"]])
            assert old.get("k") == pattern("k", size)          # reading needs no lease
            after = bytes(new.m.mem[new._header_at(1):new._header_at(1) + 64]), \
                bytes(new.m.mem[new.sb["index_off"] + SLOTS * 64:new.sb["arena_off"]])
            assert after[1] == before[1]                        # host 1's segment: not a byte written
            assert kv.HEADER.unpack(after[0])["clock"] == kv.HEADER.unpack(before[0])["clock"]
            with pytest.raises(kv.KVError, match="lease was taken"):
                old.put("k2", b"x")
    finally:
        old._beater = None
        old.close()


def test_the_takeover_stress_finds_no_wrong_read_no_destroyed_block_and_no_hang(tmp_path):
    r = kv_takeover.run(stale_s=STALE, seed=3, pool=str(tmp_path / "pool"), cycles=4)
    assert r["wrong"] == 0 and r["destroyed"] == 0 and r["hangs"] == 0, r
    assert r["verify_bad"] == 0 and r["evictions"] == 0, r
    assert r["takeovers"] == 4 and len(r["pairs"]) == 4, r          # every holder -> taker pairing
    assert r["acked"] > 100 and r["gets"] > 100, r
