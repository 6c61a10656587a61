"""Talking to the appliance service, and starting and stopping it.

The service runs in the background with its socket (mode 0600), pid file and log in its run
directory (default: $PFCXL_CACHE/appliance/<topology name>). Leftovers of a crashed run are
recognised and named, never silently reused.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pfcxl.device import appliance_protocol as proto
from pfcxl.device.topology import Topology
from pfcxl.errors import ApplianceError

from . import cache

SOCKET, PID, LOG = "appliance.sock", "appliance.pid", "appliance.log"
START_TIMEOUT = 30.0


def default_dir(topo: Topology) -> Path:
    return cache.cache_dir() / "appliance" / topo.name


@dataclass
class Region:
    name: str            # shared | private
    partition: str       # shared | private/<slot>
    size: int
    pool_offset: int
    fd: int


@dataclass
class Attachment:
    host: int
    port: int
    regions: list[Region]

    def region(self, name: str) -> Region:
        return next(r for r in self.regions if r.name == name)

    def close(self) -> None:
        for r in self.regions:
            try:
                os.close(r.fd)
            except OSError:
                pass


class Client:
    """One connection to the service. Attachments live as long as it does; use `with`."""

    def __init__(self, run_dir: Path, timeout: float = 30.0) -> None:
        self.path = run_dir / SOCKET
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(str(self.path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            self.sock.close()
            raise ApplianceError(f"no appliance is serving {self.path} ({exc.strerror}): start one with "
                                 f"'pfcxl appliance start'") from None
        self._buffer = bytearray()
        self._fds: list[int] = []
        self.attachments: list[Attachment] = []

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
        self.sock.sendall((json.dumps({"op": op, "v": proto.VERSION, **fields}) + "\n").encode())
        while b"\n" not in self._buffer:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, 65536, 16)
            except socket.timeout:
                raise ApplianceError(f"the appliance did not answer '{op}' in time") from None
            if not data:
                raise ApplianceError(f"the appliance closed the connection during '{op}'")
            self._buffer += data
            self._fds += fds
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        fds, self._fds = self._fds, []
        return json.loads(line), fds

    def call(self, op: str, **fields: object) -> dict:
        """A request that must succeed; its descriptors, if any, are closed."""
        reply, fds = self.request(op, **fields)
        for fd in fds:
            os.close(fd)
        if not reply.get("ok"):
            raise ApplianceError(f"appliance refused '{op}': {reply.get('error')}")
        return reply

    def attach(self, host: int, port: int | None = None) -> Attachment:
        fields = {"host": host} if port is None else {"host": host, "port": port}
        reply, fds = self.request("attach", **fields)
        if not reply.get("ok"):
            for fd in fds:
                os.close(fd)
            raise ApplianceError(f"appliance refused host {host}: {reply.get('error')}")
        regions = [Region(r["name"], r["partition"], r["size"], r["pool_offset"], fd)
                   for r, fd in zip(reply["regions"], fds)]
        att = Attachment(reply["host"], reply["port"], regions)
        self.attachments.append(att)
        return att


# --------------------------------------------------------------------------- process control


def running_pid(run_dir: Path) -> int | None:
    """The pid of a live service for `run_dir`, None if none; stale leftovers raise, named."""
    pid_file, sock = run_dir / PID, run_dir / SOCKET
    if not pid_file.exists():
        if sock.exists():
            raise ApplianceError(f"{sock} is left from a crashed run (no pid file): remove it, or run "
                                 f"'pfcxl appliance stop --run-dir {run_dir}' to clean up")
        return None
    try:
        pid = int(pid_file.read_text().strip())
    except ValueError:
        raise ApplianceError(f"{pid_file} does not hold a pid: left by a crashed run; remove it") from None
    if not _alive(pid) or not _is_service(pid):
        raise ApplianceError(f"{pid_file} names pid {pid}, which is not a running appliance: left by a "
                             f"crashed run; 'pfcxl appliance stop --run-dir {run_dir}' cleans up")
    return pid


def _alive(pid: int) -> bool:
    # A service this very process started (multihost's temporary appliance) is its child: once
    # it exits it stays a zombie, which kill(pid, 0) still finds, until reaped. Reap it here, or
    # stop() waited out its whole timeout on a process that had already stopped.
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _is_service(pid: int) -> bool:
    # Match the module argument exactly: a substring test took any process whose command line
    # merely mentions the file (an editor on appliance_service.py, its tests) that reused a stale
    # pid for the service, and stop() then signalled it.
    try:
        return b"pfcxl.device.appliance_service" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def start(topo: Topology, topo_path: Path, run_dir: Path, *, foreground: bool = False,
          scan_interval: float = 5.0) -> int:
    """Start the service for `topo` (read from `topo_path`) in the background and wait until it
    answers; its pid."""
    if topo.appliance is None:
        raise ApplianceError(f"topology '{topo.name}' has no [appliance] section")
    run_dir.mkdir(parents=True, exist_ok=True)
    pid = running_pid(run_dir)
    if pid is not None:
        raise ApplianceError(f"an appliance is already running for {run_dir} (pid {pid})")
    argv = [sys.executable, "-m", "pfcxl.device.appliance_service", "--topology", str(topo_path),
            "--run-dir", str(run_dir), "--scan-interval", str(scan_interval)]
    if foreground:
        os.execv(argv[0], argv)
    with open(run_dir / LOG, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ApplianceError(f"the appliance exited at start (status {proc.returncode}): "
                                 f"{_log_tail(run_dir)}")
        if (run_dir / SOCKET).exists():
            try:
                with Client(run_dir, timeout=5) as c:
                    c.call("hello")
                return proc.pid
            except ApplianceError:
                pass
        time.sleep(0.1)
    proc.kill()
    raise ApplianceError(f"the appliance did not answer within {START_TIMEOUT:.0f}s: {_log_tail(run_dir)}")


def stop(run_dir: Path, timeout: float = 15.0) -> str:
    """Stop the service (shutdown request, then SIGTERM, then SIGKILL) and clean its leftovers."""
    pid_file, sock = run_dir / PID, run_dir / SOCKET
    try:
        pid = running_pid(run_dir)
    except ApplianceError:
        for leftover in (pid_file, sock):
            leftover.unlink(missing_ok=True)
        return "removed the leftovers of a crashed run"
    if pid is None:
        return "no appliance was running"
    try:
        with Client(run_dir, timeout=5) as c:
            c.call("shutdown")
    except ApplianceError:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    for leftover in (pid_file, sock):
        leftover.unlink(missing_ok=True)
    return f"stopped pid {pid}"


def _log_tail(run_dir: Path, lines: int = 5) -> str:
    try:
        return " | ".join((run_dir / LOG).read_text(errors="replace").strip().splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
