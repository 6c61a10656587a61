"""A kept-up machine's control socket under hostile clients, without a
guest: the daemon's socket side runs in a process of its own, its machine still "booting".

Before: one thread per connection and no idle timeout (1,000 idle connections = 1,002 threads),
no line limit (a 512 MB line grew the daemon to 582 MB), an accept thread that died for good at
EMFILE, and clients that hung or ended in a BlockingIOError traceback, so `down` could not work."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from pfcxl.device.appliance.protocol import MAX_LINE
from pfcxl.errors import VMError
from pfcxl.host_tools.fleet import detached

NAME = "limits"
# The daemon's socket side, with its idle timeout and, if asked, only `spare` descriptors left.
SOCKET_SIDE = """
import os, resource, sys, time
from pathlib import Path
from pfcxl.host_tools.fleet import detached
detached.IDLE_TIMEOUT = float(sys.argv[2])
daemon = detached.Daemon(Path(sys.argv[1]))
daemon.listen()
spare = int(sys.argv[3])
if spare:
    used = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + spare, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
print("listening", flush=True)
time.sleep(600)
"""

pytestmark = pytest.mark.component


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PFCXL_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def daemon():
    """start(idle seconds, spare descriptors) -> the socket side's process, killed afterwards."""
    procs, held = [], []

    def start(idle: float, spare: int = 0) -> subprocess.Popen:
        where = detached.machine_dir(NAME)
        where.mkdir(parents=True)
        proc = subprocess.Popen([sys.executable, "-c", SOCKET_SIDE, str(where), str(idle), str(spare)],
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "listening"
        (where / detached.DAEMON).write_text(json.dumps({"pid": proc.pid, "started": time.time()}))
        return proc

    start.held = held
    yield start
    for s in held:
        s.close()
    for proc in procs:
        proc.kill()
        proc.wait()


def open_idle(count: int, held: list) -> None:
    """`count` connections that never send anything (a few tries each while the queue is full)."""
    path = str(detached.machine_dir(NAME) / detached.SOCKET)
    for _ in range(count):
        for _ in range(50):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(path)
            except BlockingIOError:
                s.close()
                time.sleep(0.01)
                continue
            held.append(s)
            break


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("Threads:")))


def status_eventually(seconds: float = 60) -> dict:
    """status, asked again until it is answered (connections are being dropped meanwhile)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return detached.call(NAME, {"op": "status"}, timeout=5)
        except VMError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_idle_connections_are_bounded_and_refused_in_one_line(daemon):
    proc = daemon(idle=600)
    open_idle(100, daemon.held)
    # the held ones take every slot: one thread each, no more; the rest were told why and closed
    assert threads(proc.pid) <= detached.MAX_CONNECTIONS + 2
    with pytest.raises(VMError, match=rf"closed the connection: all {detached.MAX_CONNECTIONS} connections "
                       "to this machine are in use"):
        detached.call(NAME, {"op": "status"})
    assert detached.describe(NAME)["state"].startswith("busy (all ")


def test_an_idle_connection_is_closed_with_a_line_saying_so(daemon):
    daemon(idle=1)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(str(detached.machine_dir(NAME) / detached.SOCKET))
        reply = json.loads(s.makefile("rb").readline())
    assert reply == {"error": "closed: no request within 1s", "closed": "idle"}
    assert status_eventually()["state"] == "booting"


@pytest.mark.parametrize("size", [MAX_LINE + 1, 16 * MAX_LINE])
def test_a_request_line_over_the_limit_is_refused_not_buffered(daemon, size):
    daemon(idle=600)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(str(detached.machine_dir(NAME) / detached.SOCKET))
        try:
            s.sendall(b"x" * size)            # no newline: the old daemon read on for ever
        except (BrokenPipeError, ConnectionResetError):
            pass                              # closed after the reply: it is still there to read
        reply = json.loads(s.makefile("rb").readline())
    assert reply == {"error": f"request line longer than {MAX_LINE} bytes; closing", "closed": "refused"}
    assert status_eventually()["state"] == "booting"


def test_out_of_descriptors_the_daemon_goes_on_answering(daemon):
    # 8 descriptors to spare, 50 connections (twice what the descriptors and the listen queue of 16
    # hold): accept() fails with EMFILE; the accept thread waits for descriptors to come free (idle
    # ones are closed after 1 s) and answers again
    proc = daemon(idle=1, spare=8)
    open_idle(50, daemon.held)
    reply = status_eventually()
    assert (reply["state"], reply["daemon_pid"]) == ("booting", proc.pid)


def test_a_daemon_that_accepts_nothing_is_one_line_and_down_still_works(tmp_path, capsys):
    # a socket whose queue is full and that never accepts: the client's connect fails at once
    # (EAGAIN); that was a BlockingIOError traceback, and `down` never got to its signals
    where = detached.machine_dir(NAME)
    where.mkdir(parents=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(where / detached.SOCKET))
    listener.listen(0)
    held: list = []
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (where / detached.DAEMON).write_text(json.dumps({"pid": stuck.pid, "started": time.time()}))
        open_idle(5, held)
        with pytest.raises(VMError, match=f"machine '{NAME}' did not take 'status': accepts no connections"):
            detached.call(NAME, {"op": "status"})
        from pfcxl.host_tools.cli.main import main
        assert main(["down", "--all"]) == 0
        assert stuck.wait(timeout=60) == -15           # SIGTERM, once the request could not be sent
        assert not where.exists()
        assert capsys.readouterr().err.strip() == f"machine '{NAME}' is down"
    finally:
        for s in held:
            s.close()
        listener.close()
        stuck.kill()
        stuck.wait()
