"""The appliance service's life, run for real (no VMs): one service per run directory, crashes
that keep the pool, connections that cannot lock anyone out, temporary appliances that die with
their parent, private files. Hostile cases.

Every service is started and stopped through `appliance` (the `services` fixture checks that
its process is gone); anything else a test starts, it kills."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pfcxl.device.appliance import rundir
from pfcxl.device.appliance.service import MAX_CLIENTS, MAX_PER_PROCESS
from pfcxl.errors import ApplianceError
from pfcxl.host_tools.vm import qemu
from pfcxl.host_tools import appliance_client as appliance
from pfcxl.device import topology

from .appliance_helpers import Raw, peek, poke, wait_until, write_topology

pytestmark = pytest.mark.component


def _gone(pid: int) -> bool:
    """Exited (and reaped, when it is this process's child: a zombie is not gone)."""
    return not appliance._alive(pid)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def no_traceback_one_line(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def service_pids(run_dir: Path) -> list[int]:
    """Appliance services whose command line names `run_dir`."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"pfcxl.device.appliance.service" in argv and str(run_dir).encode() in argv:
                out.append(int(entry.name))
    return out


@pytest.fixture
def small(tmp_path):
    return write_topology(tmp_path / "small.toml")


# --------------------------------------------------------------------------- item 2: one service per directory


def test_two_starts_at_once_leave_one_reachable_appliance(small, tmp_path):
    topo, path = small
    for attempt in range(3):             # the race lost 3 times in 4
        run_dir = tmp_path / f"race-{attempt}"
        procs = [subprocess.Popen([sys.executable, "-m", "pfcxl.host_tools.cli.main", "appliance", "start",
                                   "-t", str(path), "--run-dir", str(run_dir)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        done = [(p.wait(120), *p.communicate()) for p in procs]
        try:
            assert sorted(rc for rc, _, _ in done) == [0, 7], done
            winner = appliance.running_pid(run_dir)
            assert winner is not None and service_pids(run_dir) == [winner]
            (_, won, _), = [d for d in done if d[0] == 0]
            assert f"running (pid {winner})" in won
            (_, _, lost), = [d for d in done if d[0] == 7]
            assert lost.strip() == f"pfcxl: error: an appliance is already running for {run_dir} (pid {winner})"
            status = cli("appliance", "status", "-t", str(path), "--run-dir", str(run_dir), "--json")
            assert status.returncode == 0 and f'"pid": {winner}' in status.stdout, status.stderr
        finally:
            stopped = cli("appliance", "stop", "-t", str(path), "--run-dir", str(run_dir))
        assert stopped.stdout.strip() == f"stopped pid {winner}"
        assert service_pids(run_dir) == [] and not rundir.shm_dir(run_dir).exists()


def test_the_service_run_directly_on_a_live_directory_leaves_it_alone(services):
    s = services()
    done = subprocess.run([sys.executable, "-m", "pfcxl.device.appliance.service", "--topology", str(s.path),
                           "--run-dir", str(s.run_dir)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 7
    assert done.stderr.strip().endswith(f"ERROR {s.run_dir} is in use by the appliance pid {s.pid} (it holds "
                                        f"{s.run_dir / rundir.LOCK}): one appliance per run directory")
    assert int((s.run_dir / appliance.PID).read_text()) == s.pid
    assert (s.run_dir / appliance.SOCKET).exists()
    with s.client() as c:                    # the first one still serves, on its socket
        assert c.call("status")["pid"] == s.pid


# --------------------------------------------------------------------------- item 3: a crash keeps the pool


HOLDER = textwrap.dedent("""
    import mmap, os, sys, time
    from pathlib import Path
    from pfcxl.host_tools import appliance_client as appliance
    c = appliance.Client(Path(sys.argv[1]))
    att = c.attach(0)
    def poke(region, offset, data):
        fd = att.region(region).fd
        with mmap.mmap(fd, os.fstat(fd).st_size) as m:
            m[offset:offset + len(data)] = data
    poke("shared", 4096, b"before the crash")
    poke("private", 8192, b"private before")
    print("attached", flush=True)
    sys.stdin.readline()                     # the test kills and restarts the service meanwhile
    poke("shared", 1 << 20, b"after the crash")
    print("wrote", flush=True)
    time.sleep(3600)
""")


def _holder(run_dir: Path) -> subprocess.Popen:
    """Host 0 in another process: attaches, writes, waits; writes again when told."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "attached\n"
    return proc


def _kill_service(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: _gone(pid), f"appliance pid {pid} gone")


@pytest.mark.parametrize("backing", ["shm", "memfd"])
def test_a_restarted_appliance_finds_its_pool_and_names_hosts_of_the_crashed_one(services, backing):
    s = services(backing=backing)
    holder = _holder(s.run_dir)
    try:
        with s.client() as c:
            first = c.call("hello")["appliance"]
        _kill_service(s.pid)                                  # kill -9: nothing cleaned up
        s2 = services(s.run_dir, backing=backing)             # restart on the same directory
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "wrote\n"          # written after the crash, through the old fd
        with s2.client() as c:
            status = c.call("status")
            assert status["incarnation"] != first["incarnation"]
            same = backing == "shm"
            assert (status["pool_id"] == first["pool_id"]) == same
            assert status["previous_incarnations"] == [{"host": 0, "port": 0, "pid": holder.pid, "same_memory": same,
                                                        "incarnation": first["incarnation"]}]
            assert status["hosts"] == []
            reply, fds = c.request("attach", host=0)          # host 0's process still maps its region
            assert fds == [] and reply == {"ok": False, "error": f"host 0 is still attached to incarnation "
                                           f"{first['incarnation']} of this appliance (pid {holder.pid}, port 0): "
                                           "stop that process first"}
            h1 = c.attach(1)
            assert h1.port == 1                               # port 0 stays with the old host 0
            shared = h1.region("shared").fd
            if same:
                assert peek(shared, 4096, 16) == b"before the crash"
                assert peek(shared, 1 << 20, 15) == b"after the crash"
            else:                                             # new memory: reported, not hidden
                assert peek(shared, 4096, 16) == bytes(16)
            shown = cli("appliance", "status", "-t", str(s2.path), "--run-dir", str(s2.run_dir))
            assert shown.returncode == 0, shown.stderr
            assert (f"host 0 (pid {holder.pid}, port 0) is still attached to incarnation {first['incarnation']}"
                    in " ".join(shown.stderr.split()))
            holder.kill()
            holder.wait()
            wait_until(lambda: c.call("status")["previous_incarnations"] == [], "the dead host 0 forgotten")
            h0 = c.attach(0)
            assert peek(h0.region("private").fd, 8192, 14) == (b"private before" if same else bytes(14))
    finally:
        holder.kill()
        holder.wait()


def test_a_run_directory_that_cannot_take_the_records_does_not_stop_the_service(services):
    s = services()
    (s.run_dir / rundir.ATTACHMENTS).unlink()
    (s.run_dir / rundir.ATTACHMENTS).mkdir()                   # every write of the records now fails
    with s.client() as c:
        assert c.attach(0).port == 0
        c.call("detach", host=0)
        c.attach(1)
    with s.client() as c:                                      # the dropped connection detached host 1
        assert c.call("status")["hosts"] == []
    assert "cannot record the attachments in" in (s.run_dir / appliance.LOG).read_text()


def test_stop_discards_an_shm_pool_and_a_crashed_one_too(services, small, tmp_path):
    s = services()
    pool = rundir.shm_dir(s.run_dir)
    with s.client() as c:
        poke(c.attach(0).region("shared").fd, 0, b"x")
    assert sorted(p.name for p in pool.iterdir()) == ["layout.json", "pool-id", "private-0.pool",
                                                      "private-1.pool", "shared.pool"]
    assert appliance.stop(s.run_dir) == f"stopped pid {s.pid}"
    assert not pool.exists()
    s2 = services(s.run_dir)
    _kill_service(s2.pid)
    assert rundir.shm_dir(s.run_dir).exists()                # a crash keeps it ...
    assert appliance.stop(s.run_dir) == "removed the leftovers of a crashed run"
    assert not rundir.shm_dir(s.run_dir).exists()            # ... until stop


# --------------------------------------------------------------------------- item 6: connections


HOARDER = textwrap.dedent("""
    import socket, sys, time
    conns = []
    for _ in range(int(sys.argv[2])):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sys.argv[1])
        conns.append(s)
    print("holding", flush=True)
    time.sleep(3600)
""")


def test_idle_connections_do_not_lock_out_status_where_and_stop(services):
    s = services()
    # more idle connections than the service serves, from several processes each under the
    # per-process limit, and from this one over it
    hoarders = [subprocess.Popen([sys.executable, "-c", HOARDER, str(s.run_dir / appliance.SOCKET),
                                  str(MAX_PER_PROCESS - 1)], stdout=subprocess.PIPE, text=True)
                for _ in range(MAX_CLIENTS // (MAX_PER_PROCESS - 1) + 1)]
    mine = [Raw(s.run_dir) for _ in range(MAX_PER_PROCESS + 20)]
    try:
        for h in hoarders:
            assert h.stdout.readline() == "holding\n"
        t = ["-t", str(s.path), "--run-dir", str(s.run_dir)]
        status = cli("appliance", "status", *t)
        assert status.returncode == 0 and f"(pid {s.pid}," in status.stdout, status.stderr
        where = cli("appliance", "where", "0x1000", *t)
        assert where.returncode == 0 and "module 1" in where.stdout, where.stderr
        stop = cli("appliance", "stop", *t)
        assert stop.returncode == 0 and stop.stdout.strip() == f"stopped pid {s.pid}", stop.stderr
        assert _gone(s.pid)
    finally:
        for h in hoarders:
            h.kill()
            h.wait()
        for raw in mine:
            raw.close()


def test_a_process_over_its_connection_limit_gets_one_line(services):
    s = services()
    clients = [s.client() for _ in range(MAX_PER_PROCESS)]
    try:
        for c in clients:
            c.call("hello")
        extra = s.client()                                   # connect succeeds: the refusal is a reply
        with pytest.raises(ApplianceError) as refused:
            extra.call("hello")
        extra.close()
        assert str(refused.value) == (f"the appliance closed the connection during 'hello': pid {os.getpid()} "
                                      f"already holds {MAX_PER_PROCESS} connections to this appliance (the limit "
                                      f"per process is {MAX_PER_PROCESS}): close some")
    finally:
        for c in clients:
            c.close()

    def room_again() -> bool:                                # once the service has seen the closes
        try:
            with s.client() as c:
                return c.call("hello")["ok"]
        except ApplianceError:
            return False
    wait_until(room_again, "a connection served again once ours were closed")


def test_idle_connections_are_closed_unless_they_hold_an_attachment(small, tmp_path):
    topo, path = small
    run_dir = tmp_path / "idle"
    for bad in (0, -1):
        with pytest.raises(ApplianceError, match=rf"^idle timeout {bad}s: it must be more than 0 seconds$"):
            appliance.start(topo, path, run_dir, idle_timeout=bad)
    assert not run_dir.exists()
    pid = appliance.start(topo, path, run_dir, scan_interval=3600, idle_timeout=1)
    try:
        raw = Raw(run_dir)
        assert raw.until_closed() == [{"ok": False, "error": "closed: idle for 1s without an attachment",
                                       "closed": "idle"}]
        raw.close()
        with appliance.Client(run_dir) as idle, appliance.Client(run_dir) as host:
            host.attach(0)
            assert idle.call("hello")["ok"]
            wait_until(lambda: not _socket_open(idle.sock), "the idle connection closed by the service")
            assert idle.call("status")["hosts"][0]["host"] == 0   # reconnected; host 0 still attached
            assert host.call("status")["ok"]                      # the attached one was never closed
    finally:
        appliance.stop(run_dir)
    assert _gone(pid)


def _socket_open(sock: socket.socket) -> bool:
    """False once the peer has closed (the idle notice may be waiting unread)."""
    try:
        data = sock.recv(1 << 16, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True
    return not data.endswith(b"\n")


def test_stop_signals_a_service_that_does_not_answer_and_has_lost_its_files(services):
    s = services()
    os.kill(s.pid, signal.SIGSTOP)                           # answers nothing
    try:
        (s.run_dir / appliance.PID).unlink()
        (s.run_dir / appliance.SOCKET).unlink()
        assert appliance.running_pid(s.run_dir) == s.pid      # the lock still names it
        assert appliance.stop(s.run_dir) == f"stopped pid {s.pid}"
    finally:
        if not _gone(s.pid):
            os.kill(s.pid, signal.SIGKILL)
    assert _gone(s.pid)
    assert not rundir.shm_dir(s.run_dir).exists()


def test_a_client_that_cannot_connect_gets_one_line(tmp_path):
    path = tmp_path / appliance.SOCKET
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(0)                                     # never accepts: the backlog fills
    hangers = []
    try:
        with pytest.raises(ApplianceError, match=rf"cannot connect to the appliance at {path}: it accepts no connections \(its queue is full\)$"):
            for _ in range(8):
                hangers.append(appliance.Client(tmp_path, timeout=1))
    finally:
        for c in hangers:
            c.close()
        listener.close()


# --------------------------------------------------------------------------- item 7: signals and parents


# The parent takes SIGHUP's default action even when the suite runs under nohup, which leaves
# SIGHUP ignored in every child: the test is of the appliance's end, not of the caller's shell.
PARENT = textwrap.dedent("""
    import signal, sys, time
    from pathlib import Path
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    from pfcxl.device import topology
    from pfcxl.host_tools.fleet import multihost
    path = Path(sys.argv[1])
    with multihost.appliance_for(topology.load(path), path, None, print) as (where, temporary):
        print(f"up {where} {temporary}", flush=True)
        time.sleep(3600)
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP, signal.SIGTERM])
def test_a_temporary_appliance_dies_with_its_parent_and_leaves_nothing(small, tmp_path, sig):
    topo, path = small
    env = {**os.environ, "PFCXL_CACHE": str(tmp_path / "cache")}   # no default appliance runs there
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert parent.stdout.readline().startswith("starting a temporary appliance in ")
        up, where, temporary = parent.stdout.readline().split()
        where = Path(where)
        assert (up, temporary) == ("up", "True")
        pid = appliance.running_pid(where)
        assert pid is not None and rundir.shm_dir(where).exists()
        os.kill(parent.pid, sig)
        parent.wait(60)
        wait_until(lambda: _gone(pid), f"the temporary appliance (pid {pid}) gone after {sig.name} of its parent")
        assert not where.exists() and not rundir.shm_dir(where).exists()
    finally:
        parent.kill()
        parent.wait()


def test_the_service_stops_cleanly_on_sighup(services):
    s = services()
    os.kill(s.pid, signal.SIGHUP)
    wait_until(lambda: _gone(s.pid), "the service gone after SIGHUP")
    assert not (s.run_dir / appliance.PID).exists() and not (s.run_dir / appliance.SOCKET).exists()
    assert "stopped" in (s.run_dir / appliance.LOG).read_text().splitlines()[-1]
    assert not rundir.shm_dir(s.run_dir).exists()


# --------------------------------------------------------------------------- item 12: private files, own logs


def test_run_and_appliance_directories_and_backing_files_are_private(services, tmp_path):
    from pfcxl.machine import _run_directory
    with _run_directory(tmp_path / "run", True, lambda m: None) as run_dir:
        paths = qemu.prepare_backing(topology.load(topology.resolve("two-hb-interleave")), run_dir)
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
        assert paths and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in paths.values())
    s = services(tmp_path / "appliance")
    assert stat.S_IMODE(s.run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((s.run_dir / appliance.LOG).stat().st_mode) == 0o600
    pool = rundir.shm_dir(s.run_dir)
    assert stat.S_IMODE(pool.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in pool.glob("*.pool"))


def test_guests_on_one_run_directory_get_their_own_names(tmp_path):
    from pfcxl.host_tools.vm.guest_names import guest_name
    with guest_name(tmp_path) as a, guest_name(tmp_path) as b, guest_name(tmp_path) as c:
        assert (a, b, c) == ("guest", "guest-1", "guest-2")
    with guest_name(tmp_path) as again:                      # released with its guest
        assert again == "guest"
    other = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                              "from pfcxl.host_tools.vm.guest_names import guest_name\n"
                              "with guest_name(Path(sys.argv[1])) as n: print(n, flush=True); time.sleep(3600)",
                              str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline() == "guest\n"
        with guest_name(tmp_path) as mine:                   # held by another process: not ours
            assert mine == "guest-1"
    finally:
        other.kill()
        other.wait()


HALF_STARTED = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from pfcxl.device.appliance import rundir
    run_dir = Path(sys.argv[1])
    run_dir.mkdir(parents=True)
    lock = rundir.take(run_dir)
    rundir.shm_dir(run_dir).mkdir()          # its pool made, its socket and signal handlers not yet
    (run_dir / rundir.PID).write_text(f"{os.getpid()}\\n")
    print("ready", flush=True)
    time.sleep(600)
""")


def test_stop_of_a_service_that_sigterm_ends_before_its_cleanup_discards_its_shm_pool(tmp_path):
    """A service still building its pool has no socket and no SIGTERM handler: stop's SIGTERM
    ends it before it cleans up, and its shm pool stayed in /dev/shm (the foreground
    test, stopped that early when its Raw connection found no socket yet)."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HALF_STARTED, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n" and rundir.shm_dir(run_dir).exists()
        assert appliance.stop(run_dir) == f"stopped pid {proc.pid}"
        proc.wait(timeout=30)
        assert not rundir.shm_dir(run_dir).exists() and not (run_dir / rundir.PID).exists()
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(rundir.shm_dir(run_dir), ignore_errors=True)
