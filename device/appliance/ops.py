"""The appliance service's requests: what each op does to the attachments, slots and pool.

A mixin of `Service` (device/appliance/service.py), which owns the connections and the event loop.
Each op returns (reply, descriptors), raises proto.RequestError for the client, or returns
(None, None) when a worker thread answers later.

Attachments are also written to `attachments.json`, stamped with this incarnation and the pool's
id. A service restarted after a crash reads them: hosts whose process still runs keep their host
id and port (reported in status as attached to an earlier incarnation) until that process ends,
and status says whether they still map this pool's memory or memory that is gone.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pfcxl.errors import PfcxlError

from pfcxl.device.appliance import protocol as proto
from pfcxl.device.appliance import rundir, timeline
from pfcxl.device.appliance.pool import Pool, bytes_per_module, where
from pfcxl.device.appliance.timing import ApplianceTiming
from pfcxl.device.topology.model import ApplianceSpec, Topology


log = logging.getLogger("pfcxl.appliance")
MAX_SYNC_WAITING = 64            # synced stats requests one connection may have waiting


@dataclass
class Connection:
    """The service's end of one peer's connection (host_tools/appliance_client.py's Client is the other end)."""

    sock: socket.socket
    pid: int                       # the peer process (SO_PEERCRED)
    last_active: float = field(default_factory=time.monotonic)
    waiting: int = 0               # checksum replies a worker still owes it
    inbox: bytearray = field(default_factory=bytearray)
    outbox: list[tuple[bytes, list[int]]] = field(default_factory=list)
    hosts: set[int] = field(default_factory=set)
    closing: bool = False          # no more requests are read: its last replies go out, then it is dropped


@dataclass
class AttachedHost:
    """The service's record of one attached host (host_tools/appliance_client.py's Attachment is the host's)."""

    host: int
    port: int
    slot: int | None
    client: Connection       # the connection that holds it
    since: float


class Operations:
    # the service's state these ops use (Service.__init__ sets it)
    topo: Topology
    appliance: ApplianceSpec
    run_dir: Path
    incarnation: str
    pool: Pool
    attached: dict[int, AttachedHost]           # host -> its record
    slots: dict[int, int]                       # host -> private slot
    running: bool
    timing: ApplianceTiming | None
    timeline: Path | None                       # --clock virtual: its timeline file
    _lock: threading.Lock
    _results: list[tuple[Connection, dict]]
    _wake_w: socket.socket
    scan_interval: float                        # seconds between pool scans
    last_scan: dict[str, float | None]          # when the last scan ran and how long it took

    # ------------------------------------------------------------------ earlier incarnations

    def _adopt_previous(self) -> None:
        """Hosts attached by an earlier incarnation whose process still runs (they map its
        memory, with nothing to tell them the service restarted)."""
        old = rundir.read_attachments(self.run_dir)
        self.previous: dict[int, dict] = {}
        for host, record in old.get("hosts", {}).items():
            if rundir.still_running(record):
                self.previous[host] = {**record, "same_memory": record["pool_id"] == self.pool.pool_id}
        for host, r in sorted(self.previous.items()):
            log.warning("host %d (pid %d, port %d) is still attached to incarnation %s: %s", host, r["pid"],
                        r["port"], r["incarnation"], "same pool memory" if r["same_memory"]
                        else "memory this service does not own; its writes are not in this pool")
        self._save_attachments()

    def _prune_previous(self) -> None:
        gone = [h for h, r in self.previous.items() if not rundir.still_running(r)]
        for host in gone:
            log.info("host %d of incarnation %s is gone (pid %d)", host, self.previous[host]["incarnation"],
                     self.previous[host]["pid"])
            del self.previous[host]
        if gone:
            self._save_attachments()

    def _save_attachments(self) -> None:
        hosts = {str(h): r for h, r in self.previous.items()}
        for att in self.attached.values():
            hosts[str(att.host)] = {"port": att.port, "slot": att.slot, "pid": att.client.pid,
                                    "start": rundir.process_start(att.client.pid), "since": att.since,
                                    "incarnation": self.incarnation, "pool_id": self.pool.pool_id}
        try:
            rundir.write_json(self.run_dir / rundir.ATTACHMENTS,
                              {"incarnation": self.incarnation, "pool_id": self.pool.pool_id, "hosts": hosts})
        except OSError as exc:    # the hosts are served all the same; only a crash would not know them
            log.error("cannot record the attachments in %s: %s", self.run_dir / rundir.ATTACHMENTS, exc)

    # ------------------------------------------------------------------ requests

    def op_hello(self, client, request):
        return {"ok": True, "version": proto.VERSION, "appliance": self._summary()}, None

    def op_attach(self, client, request):
        host, a = request["host"], self.appliance
        self._prune_previous()
        if host in self.attached:
            raise proto.RequestError(f"host {host} is already attached at port {self.attached[host].port}")
        if host in self.previous:
            r = self.previous[host]
            raise proto.RequestError(f"host {host} is still attached to incarnation {r['incarnation']} of this "
                                     f"appliance (pid {r['pid']}, port {r['port']}): stop that process first")
        used = {att.port: att.host for att in self.attached.values()}
        used.update({r["port"]: h for h, r in self.previous.items()})
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
        self.attached[host] = AttachedHost(host, port, slot, client, time.time())
        client.hosts.add(host)
        self._save_attachments()
        regions = [self._region_info("shared")] + ([self._region_info(f"private/{slot}")] if slot is not None else [])
        fds = [self.pool.partition(r["partition"]).fd for r in regions]
        reply = {"ok": True, "host": host, "port": port, "regions": regions, **self._identity()}
        if self.timing is not None:      # the host's trace ring: one more descriptor, after the regions'
            fds.append(self.timing.attach(host, port, {p.name: p.pool_offset for p in self.pool.partitions}, slot))
            reply["ring"] = {"capacity": self.timing.capacity, "system": self.timing.system,
                             "issue": self.timing.issue}
        log.info("host %d attached at port %d%s", host, port, f", private slot {slot}" if slot is not None else "")
        return reply, fds

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
        self._prune_previous()
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
        previous = [{"host": h, "port": r["port"], "pid": r["pid"], "incarnation": r["incarnation"],
                     "same_memory": r["same_memory"]} for h, r in sorted(self.previous.items())]
        return {"ok": True, "appliance": self._summary(), "modules": modules, "ports": ports, "hosts": hosts,
                "previous_incarnations": previous, **self._identity(),
                "private_slots": {str(h): s for h, s in sorted(self.slots.items())},
                "scan": {"interval": self.scan_interval, **self.last_scan}, "pid": os.getpid()}, None

    def op_layout(self, client, request):
        return {"ok": True, "appliance": self._summary(),
                "partitions": [self._region_info(p.name) for p in self.pool.partitions]}, None

    def op_where(self, client, request):
        try:
            return {"ok": True, **where(self.appliance, request["offset"])}, None
        except PfcxlError as exc:
            raise proto.RequestError(str(exc)) from exc

    def op_stats(self, client, request):
        """The fabric telemetry (device/appliance/timing.py); with "sync", once the rings' records of
        this moment are modelled (answered from the timing thread)."""
        timing = self.timing
        if timing is None and self.timeline is not None:       # the guests' own clocks are the figures
            return {"ok": True, "appliance": self._summary(), **self._timeline(), "pid": os.getpid()}, None
        if timing is None:
            raise proto.RequestError("this appliance models no traffic and keeps no timeline: it was started "
                                     "without --fabric or --clock virtual (pfcxl appliance start --fabric "
                                     "pf|electrical, or --clock virtual)")
        if not request.get("sync"):
            return self._stats(timing), None
        if client.waiting >= MAX_SYNC_WAITING:
            raise proto.RequestError(f"{MAX_SYNC_WAITING} requests of this connection are already waiting: "
                                     "read their replies first")
        client.waiting += 1
        request_id = request.get("id")

        def done() -> None:
            reply = self._stats(timing)
            with self._lock:
                self._results.append((client, reply if request_id is None else {**reply, "id": request_id}))
            self._wake_w.send(b"x")
        timing.sync(done)
        return None, None

    def _stats(self, timing: ApplianceTiming) -> dict:
        return {"ok": True, "appliance": self._summary(), **timing.stats(), **self._timeline(), "pid": os.getpid()}

    def _timeline(self) -> dict:
        """{"timeline": its state} when this appliance keeps its timed hosts in one timeline."""
        if self.timeline is None:
            return {}
        try:
            return {"timeline": timeline.read(self.timeline)}
        except PfcxlError as exc:
            return {"timeline": {"error": str(exc)}}

    def op_shutdown(self, client, request):
        self.running = False
        return {"ok": True, "stopping": True}, None

    # ------------------------------------------------------------------ helpers

    def _identity(self) -> dict:
        return {"incarnation": self.incarnation, "pool_id": self.pool.pool_id}

    def _summary(self) -> dict:
        a = self.appliance
        return {"topology": self.topo.name, "modules": a.modules, "module_capacity": a.module_capacity,
                "hbm_cache": a.hbm_cache, "ports": a.ports, "granularity": a.granularity,
                "shared": a.shared, "private": a.private, "backing": a.backing, **self._identity(),
                "timing": None if self.timing is None else {
                    "system": self.timing.system, "issue": self.timing.issue,
                    "capture": str(self.timing.capture.folder) if self.timing.capture is not None else None},
                "timeline": str(self.timeline) if self.timeline is not None else None}

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
        if self.pool.directory is not None:       # private regions outlive the service: so do slots
            rundir.write_json(self.run_dir / rundir.SLOTS, {str(h): s for h, s in self.slots.items()})
        return free[0]

    def _load_slots(self) -> dict[int, int]:
        path = self.run_dir / rundir.SLOTS
        if self.pool.directory is None or not path.exists():
            return {}
        try:
            return {int(h): int(s) for h, s in json.loads(path.read_text()).items()}
        except (ValueError, OSError, AttributeError) as exc:
            raise PfcxlError(f"{path} is unreadable ({exc}): private regions cannot be matched to hosts") from exc

    def _detach(self, host: int) -> None:
        att = self.attached.pop(host, None)
        if att is not None:
            if self.timing is not None:
                self.timing.detach(host)
            att.client.hosts.discard(host)
            self._save_attachments()
            log.info("host %d detached from port %d", host, att.port)
