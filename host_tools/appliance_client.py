"""Talking to the appliance service, and starting and stopping it.

The service runs in the background with its socket (mode 0600), pid file and log in its run
directory (default: $PFCXL_CACHE/appliance/<topology name>). The service's lock on that directory
(device/appliance/rundir.py) says whether one is running and which pid it is; a crashed run's pid
file and socket are taken over by the next service, and cleaned up by `stop`.

Connection trouble (a refused, reset or silent socket) is an ApplianceError, one line.
"""

from __future__ import annotations

import json
import os
import contextlib
import errno
import functools
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pfcxl.device.appliance import protocol as proto
from pfcxl.device.appliance import rundir, timeline
from pfcxl.device.trace import capture as trace_capture
from pfcxl.device.fabric.modes import ISSUES, APPLIANCE_FABRICS
from pfcxl.device.topology import Topology
from pfcxl.errors import ApplianceError, PfcxlError

from pfcxl import cache
from pfcxl.renamed import renamed
from pfcxl.host_tools import timeouts
from pfcxl import process

SOCKET, PID, LOG = rundir.SOCKET, rundir.PID, rundir.LOG
MAX_SOCKET_PATH = 108     # sun_path in Linux's sockaddr_un, the terminating NUL included
START_TIMEOUT = timeouts.SERVICE_START_S


def default_dir(topo: Topology) -> Path:
    return cache.cache_dir() / "appliance" / topo.name


@dataclass
class PoolRegion:
    name: str            # shared | private
    partition: str       # shared | private/<slot>
    size: int
    pool_offset: int
    fd: int


@dataclass
class Attachment:
    host: int
    port: int
    regions: list[PoolRegion]
    incarnation: str | None = None      # of the service that attached it
    pool_id: str | None = None          # of the memory it handed out
    ring_fd: int | None = None          # a timed appliance's trace ring for this host's plugin
    ring: dict | None = None            # its capacity, and the system and issue it is modelled with

    def region(self, name: str) -> PoolRegion:
        return next(r for r in self.regions if r.name == name)

    def close(self) -> None:
        for fd in [r.fd for r in self.regions] + ([self.ring_fd] if self.ring_fd is not None else []):
            try:
                os.close(fd)
            except OSError:
                pass


class Client:
    """One connection to the service. Attachments live as long as it does; use `with`."""

    def __init__(self, run_dir: Path, timeout: float = timeouts.SERVICE_S) -> None:
        self.path, self.timeout = run_dir / SOCKET, timeout
        self.attachments: list[Attachment] = []
        self._connect()

    def _connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        try:
            self.sock.connect(str(self.path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            self.sock.close()
            raise ApplianceError(f"no appliance is serving {self.path} ({exc.strerror}): start one with "
                                 f"'pfcxl appliance start'") from exc
        except OSError as exc:
            self.sock.close()
            why = ("it accepts no connections (its queue is full)" if exc.errno == errno.EAGAIN
                   else exc.strerror or f"no answer within {self.timeout:g}s")
            raise ApplianceError(f"cannot connect to the appliance at {self.path}: {why}") from exc
        self._buffer = bytearray()
        self._fds: list[int] = []

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for att in self.attachments:
            att.close()
        self.attachments = []
        self.sock.close()

    def request(self, op: str, **fields: object) -> tuple[dict, list[int]]:
        """Send one request; return the reply and any descriptors that came with it."""
        reply, fds = self._exchange(op, fields)
        if reply.get("closed") == "idle" and not self.attachments:
            # The service closes connections that stay silent without an attachment. Such a
            # connection held nothing, so a new one serves as well; this request was never read.
            _close_all(fds)
            self.sock.close()
            self._connect()
            reply, fds = self._exchange(op, fields)
        if "closed" in reply:
            _close_all(fds)
            raise ApplianceError(f"the appliance closed the connection during '{op}': {reply.get('error')}")
        return reply, fds

    def _exchange(self, op: str, fields: dict) -> tuple[dict, list[int]]:
        try:
            self.sock.sendall((json.dumps({"op": op, "v": proto.VERSION, **fields}) + "\n").encode())
        except OSError:
            pass              # closed by the service: the line saying why may still be waiting
        while b"\n" not in self._buffer:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, 65536, 16)
            except socket.timeout as exc:
                raise ApplianceError(f"the appliance did not answer '{op}' within {self.timeout:g}s") from exc
            except OSError as exc:
                raise ApplianceError(f"lost the connection to the appliance during '{op}': {exc.strerror}") from exc
            if not data:
                raise ApplianceError(f"the appliance closed the connection during '{op}'")
            self._buffer += data
            self._fds += fds
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        fds, self._fds = self._fds, []
        try:
            return json.loads(line), fds
        except ValueError as exc:
            _close_all(fds)
            raise ApplianceError(f"the appliance answered '{op}' with a line that is not JSON: {line[:80]!r}") from exc

    def call(self, op: str, **fields: object) -> dict:
        """A request that must succeed; its descriptors, if any, are closed."""
        reply, fds = self.request(op, **fields)
        _close_all(fds)
        if not reply.get("ok"):
            raise ApplianceError(f"appliance refused '{op}': {reply.get('error')}")
        return reply

    def attach(self, host: int, port: int | None = None) -> Attachment:
        fields = {"host": host} if port is None else {"host": host, "port": port}
        reply, fds = self.request("attach", **fields)
        if not reply.get("ok"):
            _close_all(fds)
            raise ApplianceError(f"appliance refused host {host}: {reply.get('error')}")
        regions = [PoolRegion(r["name"], r["partition"], r["size"], r["pool_offset"], fd)
                   for r, fd in zip(reply["regions"], fds)]
        extra = fds[len(regions):]
        ring_fd = extra.pop(0) if "ring" in reply and extra else None
        _close_all(extra)
        att = Attachment(reply["host"], reply["port"], regions, reply.get("incarnation"), reply.get("pool_id"),
                         ring_fd, reply.get("ring"))
        self.attachments.append(att)
        return att


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


# --------------------------------------------------------------------------- process control


def running_pid(run_dir: Path) -> int | None:
    """The pid of the service holding `run_dir`, None if none does."""
    return rundir.holder(run_dir)


def _alive(pid: int) -> bool:
    # A service this very process started (multihost's temporary appliance) is its child: once
    # it exits it stays a zombie, which kill(pid, 0) still finds, until reaped. Reap it here, or
    # stop() waited out its whole timeout on a process that had already stopped.
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:      # a zombie some other process has still to reap has exited too ...
        if process.is_running(pid):
            return True
        # ... unless it is a zombie thread-group leader whose other threads are still exiting:
        # until the last one has gone, the process's files (its run-directory lock) stay open.
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except (OSError, ValueError):
        return False


def check_options(topo: Topology, *, scan_interval: float = 5.0, idle_timeout: float | None = None,
                  fabric: str | None = None, issue: str = "dependent", capture: Path | None = None,
                  quantum_ns: int | None = None, timing: str | None = None) -> None:
    """The service's options (device/appliance/service.py), checked before anything starts: the
    first bad one is one line (ApplianceError). The capture folder's contents are start()'s to check.
    `timing`: fabric's old spelling (a DeprecationWarning)."""
    fabric = renamed("check_options", "timing", timing, "fabric", fabric)
    if topo.appliance is None:
        raise ApplianceError(f"topology '{topo.name}' has no [appliance] section")
    if fabric is not None and fabric not in APPLIANCE_FABRICS:
        raise ApplianceError(f"appliance timing '{fabric}' is not one of {', '.join(APPLIANCE_FABRICS)}")
    if issue not in ISSUES:
        raise ApplianceError(f"issue '{issue}' is not one of {', '.join(ISSUES)}")
    if capture is not None and fabric is None:
        raise ApplianceError("--capture keeps what the appliance's timing drains: give --fabric pf|electrical too")
    if idle_timeout is not None and not idle_timeout > 0:
        raise ApplianceError(f"idle timeout {idle_timeout:g}s: it must be more than 0 seconds")
    if not 0 < scan_interval < float("inf"):
        raise ApplianceError(f"scan interval {scan_interval:g}s: it must be more than 0 seconds, and finite")
    if quantum_ns is not None:
        try:
            timeline.check_quantum(quantum_ns)
        except PfcxlError as exc:
            raise ApplianceError(f"--quantum: {exc}") from None


def start(topo: Topology, topo_path: Path, run_dir: Path, *, foreground: bool = False,
          scan_interval: float = 5.0, idle_timeout: float | None = None, temporary: bool = False,
          fabric: str | None = None, issue: str = "dependent", capture: Path | None = None,
          quantum_ns: int | None = None, timing: str | None = None) -> int:
    """Start the service for `topo` (read from `topo_path`) in the background and wait until it
    answers; its pid. A `temporary` one is stopped (SIGTERM) when this process dies, however it
    dies, and removes `run_dir` as it exits. `fabric` (pf, electrical) has it model every host's
    traffic on that fabric (device/appliance/timing.py), with `issue` dependent or independent;
    `capture` (an absent or empty directory) keeps every host's drained records there
    (device/trace/capture.py). `quantum_ns` has it keep its timed hosts (--clock virtual) in one
    timeline, in quanta of that many ns (device/appliance/timeline.py). `timing`: fabric's old
    spelling (a DeprecationWarning)."""
    fabric = renamed("start", "timing", timing, "fabric", fabric)
    check_options(topo, scan_interval=scan_interval, idle_timeout=idle_timeout, fabric=fabric, issue=issue,
                  capture=capture, quantum_ns=quantum_ns)
    if capture is not None:
        capture = trace_capture.check_dir(capture)
    socket_path = (run_dir / SOCKET).absolute()
    if len(os.fsencode(socket_path)) >= MAX_SOCKET_PATH:
        raise ApplianceError(f"run directory {run_dir}: its control socket {socket_path} would be "
                             f"{len(os.fsencode(socket_path))} bytes long, and a unix socket's path is at most "
                             f"{MAX_SOCKET_PATH - 1}: use a shorter --run-dir (or PFCXL_CACHE)")
    try:
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ApplianceError(f"cannot create the run directory {run_dir}: {exc.strerror}") from exc
    pid = running_pid(run_dir)
    if pid is not None:
        raise ApplianceError(f"an appliance is already running for {run_dir} (pid {pid})")
    argv = [sys.executable, "-m", "pfcxl.device.appliance.service", "--topology", str(topo_path),
            "--run-dir", str(run_dir), "--scan-interval", str(scan_interval)]
    if idle_timeout is not None:
        argv += ["--idle-timeout", str(idle_timeout)]
    if temporary:
        argv += ["--temporary-for", str(os.getpid())]
    if fabric is not None:
        argv += ["--fabric", fabric, "--issue", issue]
    if capture is not None:
        argv += ["--capture", str(capture)]
    if quantum_ns is not None:
        argv += ["--quantum", str(quantum_ns)]
    if foreground:
        process.replace_with(argv)
    with open(run_dir / LOG, "ab") as log:
        os.chmod(run_dir / LOG, 0o600)
        proc = process.start(argv, stdin=process.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                             preexec_fn=functools.partial(process.die_with_parent, signal.SIGTERM)
                             if temporary else None)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            holder = running_pid(run_dir)
            if holder is not None:        # another start won the directory
                raise ApplianceError(f"an appliance is already running for {run_dir} (pid {holder})")
            raise ApplianceError(f"the appliance exited at start (status {proc.returncode}): "
                                 f"{_log_tail(run_dir)}")
        if (run_dir / SOCKET).exists() and running_pid(run_dir) == proc.pid:
            try:
                with Client(run_dir, timeout=timeouts.SERVICE_PROBE_S) as c:
                    c.call("hello")
                return proc.pid
            except ApplianceError:
                pass
        time.sleep(0.1)
    proc.kill()
    raise ApplianceError(f"the appliance did not answer within {START_TIMEOUT:.0f}s: {_log_tail(run_dir)}")


def stop(run_dir: Path, timeout: float = timeouts.SERVICE_STOP_S) -> str:
    """Stop the service: a shutdown request, or SIGTERM when its socket does not answer, then
    SIGKILL. With none running, clean up what a crashed one left (its shm pool too)."""
    pid = running_pid(run_dir)
    if pid is None:
        removed = rundir.clear_leftovers(run_dir) + (["its pool"] if rundir.discard_pool(run_dir) else [])
        return "removed the leftovers of a crashed run" if removed else "no appliance was running"
    try:
        with Client(run_dir, timeout=timeouts.SERVICE_PROBE_S) as c:
            c.call("shutdown")
    except ApplianceError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGCONT)          # a stopped service must run to act on it
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        while running_pid(run_dir) == pid:        # the kernel drops its lock as it dies
            time.sleep(0.05)
    if running_pid(run_dir) is None:              # gone, however it ended: the SIGTERM may have come before
        rundir.clear_leftovers(run_dir)           # its handlers (still building its pool), so nothing of
        rundir.discard_pool(run_dir)              # its own cleaned up
    return f"stopped pid {pid}"


def _log_tail(run_dir: Path, lines: int = 5) -> str:
    try:
        return " | ".join((run_dir / LOG).read_text(errors="replace").strip().splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
