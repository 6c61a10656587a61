"""The appliance's fabric telemetry: every attached host's trace records, merged on one time base
and run through the fabric models window by window, kept as running per-host, per-module and
per-link figures (docs/appliance-timing.md).

    t = Telemetry(topo, "pf", issue="dependent")
    t.add_stream(key=1, host=0, port=0, ranges=[(hpa_base, size, pool_offset), ...])
    t.model({1: records_of_host0, 2: records_of_host1})     # one window
    t.snapshot()                                            # the JSON document of `appliance stats`

Time base. A host's records carry its vCPU's instruction count. Each stream's clock is its own
count from its first traced record, at fabric_constants.NS_PER_INSTRUCTION: every stream starts
at model time 0, as the hosts of `pfcxl multihost` start their command together. With dependent
issue (the default, as `pfcxl run --timing trace`) each vCPU also carries the modelled latency of
its earlier accesses from window to window, so its clock runs as a core that waits for its loads.

Windows. A window is whatever the drainer took from the rings since the last one: the streams'
records in it are merged, sorted by model time and solved together by the engine
(fabric_engine.run, the compiled kernel), so hosts contend in the same queues. Queues start empty
in every window (a window is tens of thousands of accesses or more, so the border hardly counts).

Addresses. A record's host physical address is turned into a pool offset through the host's
ranges (its CXL DAX device and its direct-path NVDIMM, each backed by one pool partition); the
module is then the pool's own interleave (pool.where). Records outside every range are counted
as unmapped and not modelled.
"""

from __future__ import annotations

import threading

import numpy as np

from pfcxl.device.fabric import constants as fc
from pfcxl.device.fabric import engine as fabric_engine
from pfcxl.device.topology.address_map import interleave
from pfcxl.device.fabric.model import PS_PER_NS, FabricModel
from pfcxl.device.fabric import systems as fabric_systems
from pfcxl.device.fabric.modes import ISSUES, APPLIANCE_FABRICS
from pfcxl.device.fabric.replay import PS_PER_STAMP
from pfcxl.device.topology import Topology
from pfcxl.device.trace.records import LINE

QUANTILES = (50, 99)
# Latency histograms: 1-ns bins up to FINE_NS, then COARSE_NS bins up to CAP_NS (beyond it, the
# last bin; the true maximum is kept on its own), so a saturated model cannot grow them unbounded.
FINE_NS, COARSE_NS, CAP_NS = 8192, 64, 1 << 20


def _bins(lat_ns: np.ndarray) -> np.ndarray:
    return np.where(lat_ns < FINE_NS, lat_ns, FINE_NS + (np.minimum(lat_ns, CAP_NS) - FINE_NS) // COARSE_NS)


def _ns(bin_index: int) -> int:
    """The lower edge (ns) of a histogram bin."""
    return bin_index if bin_index < FINE_NS else FINE_NS + (bin_index - FINE_NS) * COARSE_NS


def _models(topo: Topology) -> dict[str, FabricModel]:
    return fabric_systems.models(topo)


def labels() -> dict[str, str]:
    return {k: fabric_systems.LABELS[k] for k in ("pf", "pf_hbm", "electrical", "local")}


class _Stream:
    """One attachment's records: its host, its port (the model's host) and its address ranges."""

    def __init__(self, host: int, port: int, ranges) -> None:
        self.host, self.port = host, port
        r = np.array(sorted(ranges), dtype=np.int64).reshape(-1, 3)
        self.bases, self.sizes, self.offsets = r[:, 0], r[:, 1], r[:, 2]
        self.first_insn: int | None = None
        self.carry: dict[str, dict[int, int]] = {}      # system -> vcpu -> ps carried (dependent)

    def pool_offsets(self, hpa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(pool offset, inside a range?) of every address."""
        hpa = hpa.astype(np.int64)
        idx = np.searchsorted(self.bases, hpa, side="right") - 1
        ok = idx >= 0
        safe = np.where(ok, idx, 0)
        ok &= hpa < self.bases[safe] + self.sizes[safe]
        return hpa - self.bases[safe] + self.offsets[safe], ok


def _grow_add(store: dict, key, counts: np.ndarray) -> None:
    have = store.get(key)
    if have is None or len(have) < len(counts):
        grown = np.zeros(max(len(counts), 0 if have is None else len(have)), np.int64)
        if have is not None:
            grown[:len(have)] = have
        store[key] = have = grown
    have[:len(counts)] += counts


def percentiles(hist: np.ndarray | None, most: int | None = None) -> dict:
    """count, p50, p99 (nearest rank, ns: exact below FINE_NS, a bin's lower edge above) and max
    (`most`, else the highest bin's edge) of a latency histogram."""
    if hist is None or not hist.sum():
        return {"count": 0}
    cum = np.cumsum(hist)
    total = int(cum[-1])
    out = {"count": total}
    for q in QUANTILES:
        rank = max(1, int(np.ceil(q / 100 * total)))
        out[f"p{q}"] = _ns(int(np.searchsorted(cum, rank)))
    out["max"] = int(most) if most is not None else _ns(int(np.flatnonzero(hist)[-1]))
    return out


class Telemetry:
    """Running figures of every stream modelled so far; thread-safe: model() in one thread,
    snapshot() in another."""

    def __init__(self, topo: Topology, system: str, *, issue: str = "dependent",
                 ns_per_insn: float = fc.NS_PER_INSTRUCTION) -> None:
        if topo.appliance is None:
            raise ValueError(f"topology '{topo.name}' has no [appliance] section")
        if system not in APPLIANCE_FABRICS:
            raise ValueError(f"appliance timing '{system}' is not one of {', '.join(APPLIANCE_FABRICS)}")
        if issue not in ISSUES:
            raise ValueError(f"issue '{issue}' is not one of {', '.join(ISSUES)}")
        self.app, self.system, self.issue, self.ns_per_insn = topo.appliance, system, issue, ns_per_insn
        every = _models(topo)
        self.models = {name: every[name] for name in APPLIANCE_FABRICS[system]}
        self.streams: dict[int, _Stream] = {}
        self.lock = threading.Lock()
        self.windows = self.records = self.unmapped = 0
        self.model_ps = {name: 0 for name in self.models}
        self.hist: dict[tuple, np.ndarray] = {}          # (system, "host"|"module", id, op) -> counts (_bins)
        self.most: dict[tuple, int] = {}                 # the same keys -> largest latency (ns)
        self.traffic: dict[tuple, np.ndarray] = {}       # ("host"|"module", id) -> reads, writes, bytes, hits
        self.stages = {name: {st.name: (np.zeros(m.queues(st), np.int64), np.zeros(m.queues(st), np.int64))
                              for st in m.stages} for name, m in self.models.items()}
        self.ports: dict[int, int] = {}                  # host -> its port (the latest attachment's)

    def add_stream(self, key: int, host: int, port: int, ranges) -> None:
        with self.lock:
            self.streams[key] = _Stream(host, port, ranges)
            self.ports[host] = port

    # ------------------------------------------------------------------ one window

    def _merge(self, batches: dict[int, np.ndarray]):
        """The window's records of every stream on the common time base (ps stamps in `insn`,
        pool offsets in `hpa`, the port in `host`), in model-time order; plus each record's
        host id and stream key."""
        parts, hosts, keys = [], [], []
        for key, recs in batches.items():
            s = self.streams[key]
            if not len(recs):
                continue
            off, ok = s.pool_offsets(recs["hpa"])
            self.unmapped += int(np.count_nonzero(~ok))
            recs, off = recs[ok], off[ok]
            if not len(recs):
                continue
            if s.first_insn is None:
                s.first_insn = int(recs["insn"].min())
            out = recs.copy()
            rel = np.maximum(recs["insn"].astype(np.int64) - s.first_insn, 0)
            out["insn"] = np.rint(rel * (self.ns_per_insn * PS_PER_NS)).astype(np.uint64)
            out["hpa"] = off.astype(np.uint64)
            out["size"] = LINE            # a CPU moves whole lines over CXL, whatever it touched
            out["host"] = s.port
            parts.append(out)
            hosts.append(np.full(len(out), s.host, np.int64))
            keys.append(np.full(len(out), key, np.int64))
        if not parts:
            return None
        merged, host_ids, stream_keys = np.concatenate(parts), np.concatenate(hosts), np.concatenate(keys)
        order = np.argsort(merged["insn"], kind="stable")
        return merged[order], host_ids[order], stream_keys[order]

    def _vcpus(self, merged, key) -> tuple[np.ndarray, np.ndarray]:
        """Every (stream, vCPU) of the window once, and each record's index into them."""
        return np.unique(key * 256 + merged["vcpu"], return_inverse=True)

    def _carried(self, name: str, merged, vcpus) -> np.ndarray:
        """Dependent issue: each vCPU's stamps moved by the latency it waited for in earlier windows."""
        stamps = merged["insn"].astype(np.int64)
        if self.issue == "dependent":
            ids, which = vcpus
            carry = np.array([self.streams[int(v) // 256].carry.get(name, {}).get(int(v) % 256, 0) for v in ids],
                             np.int64)
            stamps += carry[which]
        return stamps

    def _carry_forward(self, name: str, merged, vcpus, result) -> None:
        if self.issue != "dependent":
            return
        ids, which = vcpus
        # the records are in model-time order, so a vCPU's last record is its last access
        last = len(which) - 1 - np.unique(which[::-1], return_index=True)[1]
        complete = result.issue_ps[last] + result.latency_ps[last]
        orig = merged["insn"][last].astype(np.int64)    # before any carry: the stream's own clock
        for v, done, stamp in zip(ids, complete, orig):
            self.streams[int(v) // 256].carry.setdefault(name, {})[int(v) % 256] = int(done - stamp)

    def model(self, batches: dict[int, np.ndarray]) -> int:
        """Model one window: `batches` maps stream keys to their new records. Records modelled."""
        got = self._merge(batches)
        if got is None:
            return 0
        merged, host, key = got
        module = interleave(merged["hpa"].astype(np.int64), self.app.granularity, self.app.modules)[0]
        write = merged["write"] != 0
        results = {}
        vcpus = self._vcpus(merged, key)
        for name, m in self.models.items():
            timed = merged.copy()
            timed["insn"] = self._carried(name, merged, vcpus).astype(np.uint64)
            results[name] = fabric_engine.run(m, timed, ns_per_insn=PS_PER_STAMP, dependent=self.issue == "dependent",
                                              base_hpa=0, granularity=self.app.granularity, seed=self.windows + 1)
            self._carry_forward(name, merged, vcpus, results[name])
        with self.lock:
            self.windows += 1
            self.records += len(merged)
            hit = results["pf_hbm"].hit if "pf_hbm" in results else np.zeros(len(merged), bool)
            for kind, ids in (("host", host), ("module", module)):
                self._count(kind, ids, write, hit)
            for name, r in results.items():
                self.model_ps[name] += int(r.window_ps)
                for st, stats in r.stages.items():
                    self.stages[name][st][0][:] += stats.bytes
                    self.stages[name][st][1][:] += stats.busy_ps
                lat = r.latency_ps // PS_PER_NS
                for kind, ids in (("host", host), ("module", module)):
                    self._histograms(name, kind, ids, write, lat)
        return len(merged)

    def _count(self, kind: str, ids: np.ndarray, write: np.ndarray, hit: np.ndarray) -> None:
        n = int(ids.max()) + 1
        reads = np.bincount(ids, ~write, n)
        table = np.stack([reads, np.bincount(ids, write, n), np.bincount(ids, None, n) * LINE,
                          np.bincount(ids, hit & ~write, n)], axis=1).astype(np.int64)
        for i in np.flatnonzero(table[:, 2]):
            _grow_add(self.traffic, (kind, int(i)), table[i])

    def _histograms(self, name: str, kind: str, ids: np.ndarray, write: np.ndarray, lat: np.ndarray) -> None:
        """One 2-D bincount: (id, read/write) x latency bin."""
        group = ids.astype(np.int64) * 2 + write
        bins = _bins(lat)
        width, groups = int(bins.max()) + 1, int(group.max()) + 1
        counts = np.bincount(group * width + bins, minlength=groups * width).reshape(groups, width)
        most = np.full(groups, -1, np.int64)
        np.maximum.at(most, group, lat)
        for gid in np.flatnonzero(most >= 0):
            key = (name, kind, int(gid) // 2, "write" if gid % 2 else "read")
            _grow_add(self.hist, key, counts[gid])
            self.most[key] = max(self.most.get(key, 0), int(most[gid]))

    # ------------------------------------------------------------------ figures

    def _utilisation(self, name: str, kind: str, ident: int) -> dict:
        """Per stage, the busiest queue this host (through its port) or module crosses in model
        `name`, and which stage is the busiest of all."""
        m, span = self.models[name], max(self.model_ps[name], 1)
        out: dict = {}
        port = self.ports.get(ident)
        for st in m.stages:
            busy = self.stages[name][st.name][1]
            if kind == "host" and port is not None and st.key != "module":
                queues = {"host": [port], "group": [port // m.hosts_per_group],
                          "path": [port * m.modules + j for j in range(m.modules)]}[st.key]
            elif kind == "module" and st.key == "module":
                queues = [ident]
            else:
                continue
            q = max(queues, key=lambda i: busy[i])
            out[st.name] = float(busy[q]) / span
        if out:
            out["busiest"] = max(out, key=lambda stage: out[stage])
        return out

    def _entry(self, kind: str, ident: int) -> dict:
        reads, writes, nbytes, hits = (int(x) for x in self.traffic.get((kind, ident), np.zeros(4, np.int64)))
        e = {kind: ident, "reads": reads, "writes": writes, "bytes": nbytes,
             "latency_ns": {name: {op: percentiles(self.hist.get((name, kind, ident, op)),
                                                   self.most.get((name, kind, ident, op)))
                                       for op in ("read", "write")} for name in self.models},
             "utilisation": {name: self._utilisation(name, kind, ident) for name in self.models},
             "hbm_hit_rate": (hits / reads if reads else None) if "pf_hbm" in self.models else None}
        if kind == "host":
            e["port"] = self.ports.get(ident)
        return e

    def snapshot(self) -> dict:
        with self.lock:
            hosts = sorted({i for k, i in self.traffic if k == "host"} | set(self.ports))
            modules = sorted(i for k, i in self.traffic if k == "module")
            stages = {}
            for name, m in self.models.items():
                span = max(self.model_ps[name], 1)
                stages[name] = {st.name: {"key": st.key, "bandwidth_gbs": st.bandwidth_mbs / 1000,
                                          "bytes": int(self.stages[name][st.name][0].sum()),
                                          "max_utilisation": float(self.stages[name][st.name][1].max()) / span}
                                for st in m.stages}
            return {"system": self.system, "issue": self.issue, "models": list(self.models),
                    "labels": {k: v for k, v in labels().items() if k in self.models},
                    "time_base": {"ns_per_instruction": self.ns_per_insn,
                                  "streams": "each stream from its first traced record at model time 0"},
                    "windows": self.windows, "records": self.records, "unmapped": self.unmapped,
                    "model_ns": {name: ps / PS_PER_NS for name, ps in self.model_ps.items()},
                    "hosts": [self._entry("host", h) for h in hosts],
                    "modules": [self._entry("module", m) for m in modules],
                    "stages": stages}
