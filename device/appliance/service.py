"""`pfcxl appliance` itself: one process that owns the pool and serves it to hosts.

A single-threaded selector loop: no client can block it (non-blocking sockets, bounded buffers,
bounded line length), every request gets a reply, and a failing handler is answered with an error
and logged, never allowed to take the service down. Slow work (the change scan, checksums) runs
in a worker thread that hands its result back through a wake-up socket.

Connections cannot lock others out: one process may hold at most MAX_PER_PROCESS of them, a
connection without an attachment that stays silent for the idle timeout is closed, and when all
MAX_CLIENTS are taken the longest-idle one without an attachment makes room. A connection closed
by the service gets one last line saying why (`"closed": "idle"` or `"refused"`).

Run by `pfcxl appliance start` as `python -m pfcxl.device.appliance.service ...`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path

from pfcxl.errors import PfcxlError

from pfcxl.device.appliance import protocol as proto
from pfcxl.device.appliance import rundir, timeline
from pfcxl.device import topology
from pfcxl.device.appliance.ops import AttachedHost, Connection, Operations
from pfcxl.device.appliance.timing import ApplianceTiming
from pfcxl.device.fabric.telemetry import ISSUES, APPLIANCE_FABRICS
from pfcxl.device.appliance.pool import Pool

log = logging.getLogger("pfcxl.appliance")
MAX_CLIENTS = 256
MAX_PER_PROCESS = 32           # connections one peer process may hold at once
MAX_PENDING = 1 << 20          # bytes of replies a client may leave unread before it is dropped
MAX_CHECKSUMS_WAITING = 64     # checksum requests one connection may have waiting for the worker


class Service(Operations):
    def __init__(self, topo: topology.Topology, run_dir: Path, socket_path: Path, scan_interval: float,
                 idle_timeout: float = proto.IDLE_TIMEOUT, fabric: str | None = None, issue: str = "dependent",
                 capture: Path | None = None, quantum_ns: int | None = None) -> None:
        if topo.appliance is None:
            raise PfcxlError(f"topology '{topo.name}' has no [appliance] section")
        self.topo, self.appliance = topo, topo.appliance
        self.run_dir, self.socket_path, self.scan_interval = run_dir, socket_path, scan_interval
        self.idle_timeout = idle_timeout
        self.incarnation = uuid.uuid4().hex[:12]
        backing = self.appliance.backing
        self.pool = Pool(self.appliance, rundir.pool_dir(run_dir, backing),
                         rundir.pool_dir(run_dir, "directory") if backing == "shm" else None)
        self.attached: dict[int, AttachedHost] = {}          # host -> attachment
        self.slots: dict[int, int] = self._load_slots()     # host -> private slot (sticky)
        self._adopt_previous()
        self.selector = selectors.DefaultSelector()
        self.clients: dict[int, Connection] = {}
        self.running = True
        self.last_scan: dict[str, float | None] = {"at": None, "seconds": None}
        self._wake_r, self._wake_w = socket.socketpair()
        self._results: list[tuple[Connection, dict]] = []
        self._checksum_waiting: list[tuple[Connection, object]] = []
        self._checksum_worker: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        # --fabric: the appliance's timing, one model of that fabric system over every attached
        # host's trace ring (device/appliance/timing.py)
        if capture is not None and not fabric:
            raise PfcxlError("--capture keeps what the timing drains: it needs --fabric pf|electrical")
        self.timing = ApplianceTiming(topo, fabric, issue, capture=capture).start() if fabric else None
        # --clock virtual: the timeline its timed hosts' plugins keep in step (device/appliance/timeline.py)
        self.timeline = timeline.create(timeline.path_in(run_dir), quantum_ns) if quantum_ns is not None else None

    # ------------------------------------------------------------------ lifecycle

    def serve(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)                       # the socket is created 0600
        try:
            listener.bind(str(self.socket_path))
        finally:
            os.umask(old_umask)
        listener.listen(64)
        listener.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ, "listener")
        self.selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        scanner = threading.Thread(target=self._scan_loop, daemon=True, name="scan")
        scanner.start()
        log.info("serving %s: %d modules x %d bytes, %d ports, shared %d, private %d per host, %s (pool %s), "
                 "incarnation %s", self.socket_path, self.appliance.modules, self.appliance.module_capacity,
                 self.appliance.ports, self.appliance.shared, self.appliance.private, self.appliance.backing,
                 self.pool.directory or "memfd", self.incarnation)
        if self.timing is not None:
            log.info("timing every host's traffic on the %s model (%s issue)", self.timing.system, self.timing.issue)
        try:
            while self.running:
                self._close_idle()
                for key, events in self.selector.select(timeout=1.0):
                    if key.data == "listener":
                        self._accept(listener)
                    elif key.data == "wake":
                        self._deliver_results()
                    else:
                        self._service_client(key.data, events)
        finally:
            self._stopping.set()
            for client in list(self.clients.values()):
                self._drop(client, "service stopping")
            self.selector.close()
            listener.close()
            scanner.join(timeout=60)       # the scan reads the pool: let it finish before closing
            with self._lock:
                worker = self._checksum_worker
            if worker is not None:         # so does a checksum
                worker.join(timeout=60)
            if self.timing is not None:
                try:                       # whatever the timing's end says, the pool is released
                    self.timing.close()
                except Exception:
                    log.error("closing the timing failed:\n%s", traceback.format_exc())
            self.pool.close()
            log.info("stopped")

    def stop(self, *_: object) -> None:
        self.running = False

    # ------------------------------------------------------------------ connections

    def _accept(self, listener: socket.socket) -> None:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(False)
        pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        client = Connection(sock, pid)
        live = [c for c in self.clients.values() if not c.closing]
        self.clients[sock.fileno()] = client
        self.selector.register(sock, selectors.EVENT_READ, client)
        mine = sum(1 for c in live if c.pid == pid)
        if mine >= MAX_PER_PROCESS:
            self._close_with(client, "refused", f"pid {pid} already holds {mine} connections to this appliance "
                             f"(the limit per process is {MAX_PER_PROCESS}): close some")
        elif len(live) >= MAX_CLIENTS:
            idle = [c for c in live if self._idle(c)]
            if not idle:
                self._close_with(client, "refused", f"all {MAX_CLIENTS} connections are in use")
                return
            oldest = min(idle, key=lambda c: c.last_active)
            self._close_with(oldest, "idle", f"closed: the longest idle of {MAX_CLIENTS} connections, "
                             "making room for a new one")

    def _idle(self, client: Connection) -> bool:
        """Holds nothing: no attachment, no reply owed, not already closing."""
        return not (client.hosts or client.outbox or client.waiting or client.closing)

    def _close_idle(self) -> None:
        limit = time.monotonic() - self.idle_timeout
        for client in [c for c in self.clients.values() if self._idle(c) and c.last_active < limit]:
            self._close_with(client, "idle", f"closed: idle for {self.idle_timeout:g}s without an attachment")

    def _close_with(self, client: Connection, kind: str, why: str) -> None:
        """One last line for the client, then the connection is closed."""
        log.info("closing a connection of pid %d: %s", client.pid, why)
        client.closing = True
        client.inbox.clear()
        self._reply(client, {"ok": False, "error": why, "closed": kind})

    def _service_client(self, client: Connection, events: int) -> None:
        if events & selectors.EVENT_WRITE:
            self._flush(client)
        if events & selectors.EVENT_READ and not client.closing:
            try:
                data = client.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                # A client may shut its sending side after its last request and then read (as
                # `socat` and `nc -N` do): send it what it asked for before dropping it, where
                # dropping at once lost every reply still queued.
                if client.outbox:
                    client.closing = True
                    self._flush(client)
                else:
                    self._drop(client, "disconnected")
                return
            client.inbox += data
            client.last_active = time.monotonic()
            while b"\n" in client.inbox and not client.closing:
                line, _, rest = bytes(client.inbox).partition(b"\n")
                client.inbox = bytearray(rest)
                if len(line) > proto.MAX_LINE:
                    self._too_long(client)
                    break
                self._handle(client, line)
            if len(client.inbox) > proto.MAX_LINE and not client.closing:
                self._too_long(client)

    def _too_long(self, client: Connection) -> None:
        # closing first: the reply usually goes out at once, and only a flush that sees `closing`
        # drops the client; set after it, the connection stayed open, never read again, and its
        # pending input kept the loop spinning
        client.closing = True
        client.inbox.clear()
        self._reply(client, {"ok": False, "error": f"request line longer than {proto.MAX_LINE} bytes; closing"})

    def _reply(self, client: Connection, message: dict, fds: list[int] | None = None) -> None:
        client.outbox.append(((json.dumps(message) + "\n").encode(), fds or []))
        if sum(len(b) for b, _ in client.outbox) > MAX_PENDING:
            self._drop(client, "does not read its replies")
            return
        self._flush(client)

    def _flush(self, client: Connection) -> None:
        while client.outbox:
            data, fds = client.outbox[0]
            try:
                sent = socket.send_fds(client.sock, [data], fds) if fds else client.sock.send(data)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._drop(client, f"send failed: {exc}")
                return
            client.outbox[0] = (data[sent:], [])   # fds went with the first byte
            if sent == len(data):
                client.outbox.pop(0)
            client.last_active = time.monotonic()
        if client.closing and not client.outbox:
            self._drop(client, "closed after its last reply")
            return
        # a closing client is not read any more: waiting for its input too (always ready, at
        # least with the end of file) made the loop spin until its replies went out
        wanted = (0 if client.closing else selectors.EVENT_READ) | (selectors.EVENT_WRITE if client.outbox else 0)
        if client.sock.fileno() in self.clients:
            self.selector.modify(client.sock, wanted, client)

    def _drop(self, client: Connection, why: str) -> None:
        fd = client.sock.fileno()
        # requests already read from it must not be served (an attach would hold a port for good)
        client.closing = True
        if fd not in self.clients:
            return
        for host in sorted(client.hosts):
            self._detach(host)
            log.info("host %d detached: its connection %s", host, why)
        del self.clients[fd]
        self.selector.unregister(client.sock)
        client.sock.close()

    # ------------------------------------------------------------------ requests

    def _handle(self, client: Connection, line: bytes) -> None:
        request: dict = {}
        try:
            request = proto.parse(line)
            handler = getattr(self, f"op_{request['op']}")
            reply, fds = handler(client, request)
        except proto.RequestError as exc:
            reply, fds = {"ok": False, "error": str(exc)}, None
        except Exception as exc:  # never let one request take the service down
            log.error("request %r failed:\n%s", line[:200], traceback.format_exc())
            reply, fds = {"ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"}, None
        if reply is None:
            return                                   # answered later by a worker thread
        if "id" in request:
            reply["id"] = request["id"]
        self._reply(client, reply, fds)

    def op_checksum(self, client, request):
        # One worker reads the pool, and each of its passes answers every request that came before
        # the pass began: a thread per request let one client start any number of whole-pool
        # reads at once (CPU, and a read buffer each).
        with self._lock:
            if sum(1 for c, _ in self._checksum_waiting if c is client) >= MAX_CHECKSUMS_WAITING:
                raise proto.RequestError(f"{MAX_CHECKSUMS_WAITING} checksum requests of this connection are "
                                         "already waiting: read their replies first")
            self._checksum_waiting.append((client, request.get("id")))
            client.waiting += 1
            if self._checksum_worker is None:
                self._checksum_worker = threading.Thread(target=self._checksum_loop, daemon=True, name="checksum")
                self._checksum_worker.start()
        return None, None

    # ------------------------------------------------------------------ workers

    def _checksum_loop(self) -> None:
        while True:
            with self._lock:
                waiting, self._checksum_waiting = self._checksum_waiting, []
                if not waiting or self._stopping.is_set():
                    self._checksum_worker = None
                    return
            try:
                result = {"ok": True, "checksums": self.pool.checksums()}
            except Exception as exc:
                log.error("checksum failed:\n%s", traceback.format_exc())
                result = {"ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"}
            with self._lock:
                for client, request_id in waiting:
                    self._results.append((client, result if request_id is None else {**result, "id": request_id}))
            self._wake_w.send(b"x")

    def _deliver_results(self) -> None:
        self._wake_r.recv(4096)
        with self._lock:
            results, self._results = self._results, []
        for client, result in results:
            client.waiting -= 1
            if client.sock.fileno() in self.clients:
                self._reply(client, result)

    def _scan_loop(self) -> None:
        while not self._stopping.is_set():
            start = time.monotonic()
            try:
                self.pool.scan()
                self.last_scan = {"at": time.time(), "seconds": round(time.monotonic() - start, 3)}
            except Exception:
                log.error("scan failed:\n%s", traceback.format_exc())
            self._stopping.wait(self.scan_interval)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pfcxl.device.appliance.service",
                                 description="The pfcxl appliance service (normally started by "
                                 "'pfcxl appliance start').")
    ap.add_argument("--topology", required=True)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--scan-interval", type=float, default=5.0)
    ap.add_argument("--idle-timeout", type=float, default=proto.IDLE_TIMEOUT)
    ap.add_argument("--fabric", "--timing", choices=tuple(APPLIANCE_FABRICS),        # --timing: its old spelling
                    help="model every host's traffic on this fabric system")
    ap.add_argument("--issue", choices=ISSUES, default="dependent")
    ap.add_argument("--capture", type=Path, help="with --fabric: keep every host's drained records here")
    ap.add_argument("--quantum", type=int, metavar="NS",
                    help="keep the timed hosts (--clock virtual) in one timeline in quanta of NS ns")
    ap.add_argument("--temporary-for", type=int, metavar="PID",
                    help="a temporary appliance of process PID, its parent (which has it signalled when it "
                    "dies): remove the run directory at exit")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    run_dir = args.run_dir
    try:
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = rundir.take(run_dir)                 # before anything is written
    except (PfcxlError, OSError) as exc:
        log.error("%s", exc)
        return getattr(exc, "exit_code", 1)
    service, clean = None, False
    try:
        if args.temporary_for is not None and os.getppid() != args.temporary_for:
            log.error("pid %d, which this temporary appliance serves, is gone", args.temporary_for)
            return 1
        removed = rundir.clear_leftovers(run_dir)   # ours now: the lock proves nobody serves them
        if removed:
            log.warning("took over %s from a service that died", " and ".join(removed))
        service = Service(topology.load(topology.resolve(args.topology)), run_dir, run_dir / rundir.SOCKET,
                          args.scan_interval, args.idle_timeout, args.fabric, args.issue, args.capture,
                          args.quantum)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, service.stop)
        (run_dir / rundir.PID).write_text(f"{os.getpid()}\n")
        service.serve()
        clean = True
    except PfcxlError as exc:
        log.error("%s", exc)
        return exc.exit_code
    finally:
        # Only what this process made: it holds the lock, so the socket and pid file are its own.
        if service is not None:
            rundir.clear_leftovers(run_dir)
        # A clean stop ends an shm pool; a crash keeps it for the next start, unless nobody can
        # start this one again (a temporary appliance).
        if (clean and service is not None and service.appliance.backing == "shm") or args.temporary_for is not None:
            rundir.discard_pool(run_dir)
        if args.temporary_for is not None:
            shutil.rmtree(run_dir, ignore_errors=True)
        os.close(lock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
