"""Appliance-side timing (`pfcxl appliance start --fabric pf|electrical`): the service owns one
trace ring per attachment, one thread that drains them all and one that feeds what it drained to
the fabric telemetry.

At attach the service creates the host's ring in a memfd (trace_ring.Ring.create_memfd) and
hands its descriptor out after the pool's; the host's QEMU inherits it and the TCG plugin maps it
as ring=/proc/self/fd/N (host_tools/vm/host.py). The plugin produces, the drainer consumes: it empties
every ring every DRAIN_INTERVAL, and at once again while a ring was more than a quarter full,
noting the largest fill any ring had and the records the plugin ever dropped. The modeller takes what was
drained every WINDOW seconds (or sooner when WINDOW_RECORDS are waiting, a host detaches, or a
caller asks to sync) and models it as one window (fabric_telemetry.Telemetry.model); the rings
keep being drained while it does (the kernel runs without the GIL). See docs/appliance-timing.md.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pfcxl.device.trace.ring import Ring
from pfcxl.errors import TimingError

from pfcxl.device.topology import address_map
from pfcxl.device.fabric.telemetry import ISSUES, APPLIANCE_FABRICS, Telemetry
from pfcxl.device.topology import Topology
from pfcxl.device.trace.capture import CaptureWriter
from pfcxl.device.trace.plausible import Plausible

log = logging.getLogger("pfcxl.appliance")
RING_CAPACITY = 1 << 19          # records per host (12 MiB): half a second of the busiest host's traffic
DRAIN_INTERVAL = 0.02            # seconds between drains when the rings were empty
WINDOW = 0.5                     # seconds of drained records modelled together
WINDOW_RECORDS = 1 << 20         # ... or this many, whichever comes first


def host_ranges(topo: Topology, partitions: dict[str, int], slot: int | None) -> list[tuple[int, int, int]]:
    """(host physical base, size, pool offset) of every range a host reaches the pool through:
    the CXL DAX device of each appliance-served device's region (one device per region) and, for
    a direct data path, that device's NVDIMM. `partitions`: partition name -> pool offset."""
    served = {d.id: d.appliance for d in topo.devices if d.appliance}

    def pool_offset(device: str) -> int | None:
        kind = served[device]
        name = "shared" if kind == "shared" else (f"private/{slot}" if slot is not None else None)
        return partitions.get(name) if name else None

    out = []
    regions = {r.id: r for r in topo.regions}
    for p in address_map.dax_placements(topo):
        devices = regions[p.what].devices
        if len(devices) == 1 and devices[0] in served and (offset := pool_offset(devices[0])) is not None:
            out.append((p.base, p.size, offset))
    for p in address_map.direct_placements(topo):
        if p.what in served and (offset := pool_offset(p.what)) is not None:
            out.append((p.base, p.size, offset))
    return out


@dataclass
class _Attached:
    host: int
    port: int
    ring: Ring
    plausible: Plausible
    detached: bool = False
    closed: bool = False
    cut: str | None = None         # why its ring was taken away (it broke the ring's invariants)
    largest_fill: int = 0
    drained: int = 0
    batches: list = field(default_factory=list)


class ApplianceTiming:
    """The rings, the drainer thread and the telemetry of one timed appliance service."""

    def __init__(self, topo: Topology, system: str, issue: str = "dependent",
                 capacity: int = RING_CAPACITY, capture: Path | None = None) -> None:
        if system not in APPLIANCE_FABRICS:
            raise ValueError(f"appliance timing '{system}' is not one of {', '.join(APPLIANCE_FABRICS)}")
        if issue not in ISSUES:
            raise ValueError(f"issue '{issue}' is not one of {', '.join(ISSUES)}")
        self.topo, self.system, self.issue, self.capacity = topo, system, issue, capacity
        self.telemetry = Telemetry(topo, system, issue=issue)
        # --capture: every stream's records as they are modelled (device/trace/capture.py)
        self.capture = CaptureWriter(capture, system) if capture is not None else None
        self._keys = itertools.count(1)
        self._lock = threading.Lock()
        self._live: dict[int, _Attached] = {}               # stream key -> its ring
        self._by_host: dict[int, int] = {}                  # host -> its current stream key
        self._rings: dict[int, dict] = {}                   # host -> ring figures, kept after detach
        self._sync: list[Callable[[], None]] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._drain_lock = threading.Lock()                 # one drain at a time; rings close under it
        self._threads = [threading.Thread(target=self._drain_loop, daemon=True, name="ring-drainer"),
                         threading.Thread(target=self._model_loop, daemon=True, name="fabric-model")]
        self.error: str | None = None
        self.failures = 0

    def start(self) -> "ApplianceTiming":
        for t in self._threads:
            t.start()
        return self

    def close(self) -> None:
        """Model what is left, then release every ring."""
        self._stop.set()
        self._wake.set()
        for t in self._threads:                             # the drainer, then the modeller's last window
            if t.is_alive():
                t.join(timeout=60)
        with self._drain_lock:
            for att in self._live.values():
                att.ring.close()
                att.closed = True
            self._live.clear()
        if self.capture is not None:
            self.capture.close()                            # the manifest last, saying it is complete

    # ------------------------------------------------------------------ attachments (service thread)

    def attach(self, host: int, port: int, partitions: dict[str, int], slot: int | None) -> int:
        """A new ring for `host`; the descriptor to hand out (the ring keeps it open)."""
        ring = Ring.create_memfd(f"pfcxl-ring-host{host}", self.capacity)
        key = next(self._keys)
        self.telemetry.add_stream(key, host, port, host_ranges(self.topo, partitions, slot))
        if self.capture is not None:
            self.capture.stream(key, host, port)
        with self._lock:
            self._live[key] = _Attached(host, port, ring, Plausible(time.monotonic()))
            self._by_host[host] = key
            figures = self._rings.setdefault(host, {"capacity": self.capacity, "largest_fill": 0, "dropped": 0,
                                                    "drained": 0, "implausible": 0})
            figures["cut"] = None                           # a new ring: the last one's fate is history
        log.info("host %d: trace ring of %d records for the %s model", host, self.capacity, self.system)
        return ring.fd

    def detach(self, host: int) -> None:
        """The host is gone: its ring is drained one last time, modelled, then closed."""
        with self._lock:
            key = self._by_host.pop(host, None)
            if key is not None:
                self._live[key].detached = True
        self._wake.set()

    def sync(self, done: Callable[[], None]) -> None:
        """Call `done` (from the timing thread) once everything the rings hold now is modelled."""
        with self._lock:
            self._sync.append(done)
        self._wake.set()

    # ------------------------------------------------------------------ the threads

    def _drain(self) -> int:
        """Empty every ring; the largest fill found."""
        most = 0
        with self._drain_lock:
            with self._lock:
                live = [att for att in self._live.values() if not att.closed]
            for att in live:
                try:
                    batch = att.ring.drain()
                except TimingError as exc:                  # its client wrote its ring: it alone stops
                    self._cut(att, str(exc))
                    continue
                fill, rejected = len(batch), att.plausible.rejected
                batch = att.plausible.check(batch, time.monotonic())
                with self._lock:
                    figures = self._rings[att.host]
                    att.largest_fill = max(att.largest_fill, fill)
                    figures["largest_fill"] = max(figures["largest_fill"], fill)
                    figures["dropped"] = max(figures["dropped"], att.ring.dropped)
                    figures["drained"] += len(batch)
                    figures["implausible"] += att.plausible.rejected - rejected
                    if len(batch):
                        att.batches.append(batch)
                if att.plausible.rejected and not rejected:
                    log.warning("host %d: trace records its plugin cannot have written (a vCPU's count going back, "
                                "or beyond %d instructions since attach); not modelled, counted in stats",
                                att.host, att.plausible.limit(time.monotonic()))
                most = max(most, fill)
        return most

    def _cut(self, att: _Attached, why: str) -> None:
        """A ring that broke its invariants is closed and its stream ended (what it gave before
        is still modelled): reported once in the log and in stats (its ring's `cut`)."""
        log.error("host %d: trace ring detached, its timing stops (the other hosts go on): %s", att.host, why)
        att.ring.close()                                    # under the drain lock
        with self._lock:
            att.closed = att.detached = True
            att.cut = why
            self._rings[att.host]["cut"] = why
            if self._by_host.get(att.host) is not None and self._live.get(self._by_host[att.host]) is att:
                del self._by_host[att.host]

    def _model(self) -> None:
        import numpy as np
        with self._lock:
            live = list(self._live.items())
            batches = {key: np.concatenate(att.batches) for key, att in live if att.batches}
            for _, att in live:
                att.batches = []
        if batches:
            if self.capture is not None:
                for key, recs in batches.items():
                    self.capture.add(key, recs)
            self.telemetry.model(batches)
        gone = [(key, att) for key, att in live if att.detached]
        if gone:
            with self._drain_lock, self._lock:
                for key, att in gone:
                    att.ring.close()
                    att.closed = True
                    del self._live[key]
            if self.capture is not None:
                for key, att in gone:
                    self.capture.finish(key, cut=att.cut)

    def _pending(self) -> int:
        with self._lock:
            return sum(len(b) for att in self._live.values() for b in att.batches)

    def _failed(self, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"         # reported in stats; the service keeps serving memory
        if error != self.error:                        # the log once per distinct failure, not per window
            log.error("fabric timing failed:\n%s", traceback.format_exc())
        self.error = error
        self.failures += 1

    def _drain_loop(self) -> None:
        while not self._stop.is_set():
            try:
                most = self._drain()
            except Exception as exc:
                self._failed(exc)
                return
            if most < self.capacity // 4:      # at once again only for a ring filling up: no tiny batches
                self._stop.wait(DRAIN_INTERVAL)

    def _model_loop(self) -> None:
        last = time.monotonic()
        while True:
            stopping = self._stop.is_set()
            with self._lock:
                waiting, self._sync = self._sync, []
                detaching = any(a.detached for a in self._live.values())
            if (stopping or waiting or detaching or time.monotonic() - last >= WINDOW
                    or self._pending() >= WINDOW_RECORDS):
                try:
                    self._drain()                           # everything the rings hold by now
                    self._model()
                except Exception as exc:
                    self._failed(exc)
                last = time.monotonic()
            for done in waiting:
                done()
            if stopping:
                return
            self._wake.wait(DRAIN_INTERVAL)
            self._wake.clear()

    # ------------------------------------------------------------------ figures

    def stats(self) -> dict:
        """The telemetry document of `appliance stats --json`, with the rings' figures."""
        snap = self.telemetry.snapshot()
        with self._lock:
            rings = {h: dict(r) for h, r in self._rings.items()}
            attached = {a.host for a in self._live.values() if not a.detached}
            pending = sum(len(b) for att in self._live.values() for b in att.batches)
        for h in snap["hosts"]:
            h["ring"] = rings.get(h["host"])
            h["attached"] = h["host"] in attached
        fills = [r["largest_fill"] for r in rings.values()] or [0]
        snap["rings"] = {"capacity": self.capacity, "largest_fill": max(fills),
                         "largest_fill_fraction": max(fills) / self.capacity,
                         "dropped": sum(r["dropped"] for r in rings.values()),
                         "implausible": sum(r["implausible"] for r in rings.values()),
                         "cut": [{"host": h, "why": r["cut"]} for h, r in sorted(rings.items()) if r["cut"]],
                         "drain_interval_s": DRAIN_INTERVAL, "window_s": WINDOW}
        snap["pending"] = pending
        snap["error"], snap["failures"] = self.error, self.failures
        snap["capture"] = None if self.capture is None else {
            "folder": str(self.capture.folder), "error": self.capture.error, "lost": self.capture.lost}
        return snap
