"""`pfcxl appliance` itself: one process that owns the pool and serves it to hosts.

A single-threaded selector loop: no client can block it (non-blocking sockets, bounded buffers,
bounded line length), every request gets a reply, and a failing handler is answered with an error
and logged, never allowed to take the service down. Slow work (the change scan, checksums) runs
in a worker thread that hands its result back through a wake-up socket.

Run by `pfcxl appliance start` as `python -m pfcxl.device.appliance_service ...`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from pfcxl.errors import PfcxlError

from . import appliance_protocol as proto
from . import topology
from .pool import Pool, bytes_per_module, where

log = logging.getLogger("pfcxl.appliance")
MAX_CLIENTS = 256
MAX_PENDING = 1 << 20          # bytes of replies a client may leave unread before it is dropped
MAX_CHECKSUMS_WAITING = 64     # checksum requests one connection may have waiting for the worker
SLOTS_FILE = "slots.json"


@dataclass
class Client:
    sock: socket.socket
    inbox: bytearray = field(default_factory=bytearray)
    outbox: list[tuple[bytes, list[int]]] = field(default_factory=list)
    hosts: set[int] = field(default_factory=set)
    closing: bool = False          # no more requests are read: its last replies go out, then it is dropped


@dataclass
class Attachment:
    host: int
    port: int
    slot: int | None
    client: Client
    since: float


class Service:
    def __init__(self, topo: topology.Topology, run_dir: Path, socket_path: Path, scan_interval: float) -> None:
        if topo.appliance is None:
            raise PfcxlError(f"topology '{topo.name}' has no [appliance] section")
        self.topo, self.appliance = topo, topo.appliance
        self.run_dir, self.socket_path, self.scan_interval = run_dir, socket_path, scan_interval
        self.pool = Pool(self.appliance, run_dir / "pool" if self.appliance.backing == "directory" else None)
        self.attached: dict[int, Attachment] = {}          # host -> attachment
        self.slots: dict[int, int] = self._load_slots()     # host -> private slot (sticky)
        self.selector = selectors.DefaultSelector()
        self.clients: dict[int, Client] = {}
        self.running = True
        self.last_scan = {"at": None, "seconds": None}
        self._wake_r, self._wake_w = socket.socketpair()
        self._results: list[tuple[Client, dict]] = []
        self._checksum_waiting: list[tuple[Client, object]] = []
        self._checksum_worker: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()

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
        log.info("serving %s: %d modules x %d bytes, %d ports, shared %d, private %d per host, %s",
                 self.socket_path, self.appliance.modules, self.appliance.module_capacity,
                 self.appliance.ports, self.appliance.shared, self.appliance.private, self.appliance.backing)
        try:
            while self.running:
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
        if len(self.clients) >= MAX_CLIENTS:
            sock.close()
            log.warning("refused a connection: %d clients already", MAX_CLIENTS)
            return
        sock.setblocking(False)
        client = Client(sock)
        self.clients[sock.fileno()] = client
        self.selector.register(sock, selectors.EVENT_READ, client)

    def _service_client(self, client: Client, events: int) -> None:
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
            while b"\n" in client.inbox and not client.closing:
                line, _, rest = bytes(client.inbox).partition(b"\n")
                client.inbox = bytearray(rest)
                if len(line) > proto.MAX_LINE:
                    self._too_long(client)
                    break
                self._handle(client, line)
            if len(client.inbox) > proto.MAX_LINE and not client.closing:
                self._too_long(client)

    def _too_long(self, client: Client) -> None:
        # closing first: the reply usually goes out at once, and only a flush that sees `closing`
        # drops the client; set after it, the connection stayed open, never read again, and its
        # pending input kept the loop spinning
        client.closing = True
        client.inbox.clear()
        self._reply(client, {"ok": False, "error": f"request line longer than {proto.MAX_LINE} bytes; closing"})

    def _reply(self, client: Client, message: dict, fds: list[int] | None = None) -> None:
        client.outbox.append(((json.dumps(message) + "\n").encode(), fds or []))
        if sum(len(b) for b, _ in client.outbox) > MAX_PENDING:
            self._drop(client, "does not read its replies")
            return
        self._flush(client)

    def _flush(self, client: Client) -> None:
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
        if client.closing and not client.outbox:
            self._drop(client, "closed after its last reply")
            return
        # a closing client is not read any more: waiting for its input too (always ready, at
        # least with the end of file) made the loop spin until its replies went out
        wanted = (0 if client.closing else selectors.EVENT_READ) | (selectors.EVENT_WRITE if client.outbox else 0)
        if client.sock.fileno() in self.clients:
            self.selector.modify(client.sock, wanted, client)

    def _drop(self, client: Client, why: str) -> None:
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

    def _handle(self, client: Client, line: bytes) -> None:
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

    def op_hello(self, client, request):
        return {"ok": True, "version": proto.VERSION, "appliance": self._summary()}, None

    def op_attach(self, client, request):
        host, a = request["host"], self.appliance
        if host in self.attached:
            raise proto.RequestError(f"host {host} is already attached at port {self.attached[host].port}")
        used = {att.port: att.host for att in self.attached.values()}
        port = request.get("port")
        if port is not None:
            if not 0 <= port < a.ports:
                raise proto.RequestError(f"port {port} does not exist (ports 0..{a.ports - 1})")
            if port in used:
                raise proto.RequestError(f"port {port} is in use by host {used[port]}")
        else:
            free = [p for p in range(a.ports) if p not in used]
            if not free:
                raise proto.RequestError(f"all {a.ports} ports are in use (hosts "
                                         f"{', '.join(map(str, sorted(used.values())))}): detach one first")
            port = free[0]
        slot = self._slot_for(host) if a.private else None
        self.attached[host] = Attachment(host, port, slot, client, time.time())
        client.hosts.add(host)
        regions = [self._region_info("shared")] + ([self._region_info(f"private/{slot}")] if slot is not None else [])
        log.info("host %d attached at port %d%s", host, port, f", private slot {slot}" if slot is not None else "")
        return ({"ok": True, "host": host, "port": port, "regions": regions},
                [self.pool.partition(r["partition"]).fd for r in regions])

    def op_region(self, client, request):
        host, name = request["host"], request["name"]
        att = self.attached.get(host)
        if att is None or att.client is not client:
            raise proto.RequestError(f"host {host} is not attached through this connection")
        if name == "private":
            name = f"private/{att.slot}"
        if name.startswith("private/"):
            owner = next((h for h, s in self.slots.items() if f"private/{s}" == name), None)
            if att.slot is None or name != f"private/{att.slot}":
                raise proto.RequestError(f"region {name} belongs to "
                                         f"{'host ' + str(owner) if owner is not None else 'no host'}, not host {host}")
        elif name != "shared":
            raise proto.RequestError(f"no region '{name[:40]}' (shared, private)")
        info = self._region_info(name)
        return {"ok": True, "host": host, "regions": [info]}, [self.pool.partition(name).fd]

    def op_detach(self, client, request):
        host = request["host"]
        att = self.attached.get(host)
        if att is None:
            raise proto.RequestError(f"host {host} is not attached")
        if att.client is not client:
            raise proto.RequestError(f"host {host} was attached by another connection")
        self._detach(host)
        return {"ok": True, "host": host, "port": att.port}, None

    def op_status(self, client, request):
        a = self.appliance
        mapped = [0] * a.modules
        for att in self.attached.values():
            for name in ["shared"] + ([f"private/{att.slot}"] if att.slot is not None else []):
                p = self.pool.partition(name)
                mapped = [x + y for x, y in zip(mapped, bytes_per_module(a, p.pool_offset, p.size))]
        modules = [{"module": i, "capacity": a.module_capacity, "hbm_cache": a.hbm_cache,
                    "bytes_mapped": mapped[i], "bytes_changed": self.pool.changed[i]} for i in range(a.modules)]
        by_port = {att.port: att for att in self.attached.values()}
        ports = [{"port": p, "host": by_port[p].host if p in by_port else None,
                  "since": by_port[p].since if p in by_port else None} for p in range(a.ports)]
        hosts = [{"host": att.host, "port": att.port, "private_slot": att.slot,
                  "bytes_mapped": a.shared + (a.private if att.slot is not None else 0)}
                 for att in sorted(self.attached.values(), key=lambda x: x.host)]
        return {"ok": True, "appliance": self._summary(), "modules": modules, "ports": ports, "hosts": hosts,
                "private_slots": {str(h): s for h, s in sorted(self.slots.items())},
                "scan": {"interval": self.scan_interval, **self.last_scan}, "pid": os.getpid()}, None

    def op_layout(self, client, request):
        return {"ok": True, "appliance": self._summary(),
                "partitions": [self._region_info(p.name) for p in self.pool.partitions]}, None

    def op_where(self, client, request):
        try:
            return {"ok": True, **where(self.appliance, request["offset"])}, None
        except PfcxlError as exc:
            raise proto.RequestError(str(exc)) from None

    def op_checksum(self, client, request):
        # One worker reads the pool, and each of its passes answers every request that came before
        # the pass began: a thread per request let one client start any number of whole-pool
        # reads at once (CPU, and a read buffer each).
        with self._lock:
            if sum(1 for c, _ in self._checksum_waiting if c is client) >= MAX_CHECKSUMS_WAITING:
                raise proto.RequestError(f"{MAX_CHECKSUMS_WAITING} checksum requests of this connection are "
                                         "already waiting: read their replies first")
            self._checksum_waiting.append((client, request.get("id")))
            if self._checksum_worker is None:
                self._checksum_worker = threading.Thread(target=self._checksum_loop, daemon=True, name="checksum")
                self._checksum_worker.start()
        return None, None

    def op_shutdown(self, client, request):
        self.running = False
        return {"ok": True, "stopping": True}, None

    # ------------------------------------------------------------------ helpers

    def _summary(self) -> dict:
        a = self.appliance
        return {"topology": self.topo.name, "modules": a.modules, "module_capacity": a.module_capacity,
                "hbm_cache": a.hbm_cache, "ports": a.ports, "granularity": a.granularity,
                "shared": a.shared, "private": a.private, "backing": a.backing}

    def _region_info(self, name: str) -> dict:
        p = self.pool.partition(name)
        return {"name": "shared" if name == "shared" else "private", "partition": name,
                "pool_offset": p.pool_offset, "size": p.size}

    def _slot_for(self, host: int) -> int:
        if host in self.slots:
            return self.slots[host]
        taken = set(self.slots.values())
        free = [s for s in range(self.appliance.ports) if s not in taken]
        if not free:
            owners = ", ".join(str(h) for h in sorted(self.slots))
            raise proto.RequestError(f"no private region left: all {self.appliance.ports} belong to hosts {owners}")
        self.slots[host] = free[0]
        self._save_slots()
        return free[0]

    def _load_slots(self) -> dict[int, int]:
        path = self.run_dir / SLOTS_FILE
        if self.appliance.backing != "directory" or not path.exists():
            return {}
        try:
            return {int(h): int(s) for h, s in json.loads(path.read_text()).items()}
        except (ValueError, OSError, AttributeError) as exc:
            raise PfcxlError(f"{path} is unreadable ({exc}): private regions cannot be matched to hosts") from None

    def _save_slots(self) -> None:
        path = self.run_dir / SLOTS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({str(h): s for h, s in self.slots.items()}) + "\n")
        os.replace(tmp, path)

    def _detach(self, host: int) -> None:
        att = self.attached.pop(host, None)
        if att is not None:
            att.client.hosts.discard(host)
            log.info("host %d detached from port %d", host, att.port)

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
    ap = argparse.ArgumentParser(prog="python -m pfcxl.device.appliance_service",
                                 description="The pfcxl appliance service (normally started by "
                                 "'pfcxl appliance start').")
    ap.add_argument("--topology", required=True)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--scan-interval", type=float, default=5.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    run_dir = args.run_dir
    socket_path, pid_path = run_dir / "appliance.sock", run_dir / "appliance.pid"
    try:
        service = Service(topology.load(topology.resolve(args.topology)), run_dir, socket_path, args.scan_interval)
    except PfcxlError as exc:
        log.error("%s", exc)
        return exc.exit_code
    signal.signal(signal.SIGTERM, service.stop)
    signal.signal(signal.SIGINT, service.stop)
    pid_path.write_text(f"{os.getpid()}\n")
    try:
        service.serve()
    finally:
        for path in (socket_path, pid_path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
