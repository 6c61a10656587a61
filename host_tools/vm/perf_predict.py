"""Predict /sys/bus/cxl/devices/regionN/access0/* from our firmware tables.

Follows Linux 6.12's documented algorithm (docs/notes/linux-6.12-cxl-access-coordinates.md):
per endpoint, latency = device DSLBIS + switch SSLBIS on the path + one link term per PCIe
downstream port (root port, switch downstream ports) + the generic port's HMAT latency; region
latency is the worst endpoint. Bandwidth is capped per endpoint by its link and the switch port,
summed per switch and capped by the switch's upstream link, summed per host bridge and capped by
the generic port, then summed over host bridges.

The link term is documented (and meant) in nanoseconds: 68-byte flit at 32 GT/s = 17 ns. Linux
6.12 adds it in picoseconds (17000) to nanosecond values; `Prediction.as_linux_6_12()` gives what
that kernel actually prints, so the discrepancy is pinned by a test, not folded into the model.
Later kernels (Debian's 6.12.117 and 7.3.4) print 2 ns per link term instead
(docs/notes/kernel-matrix.md): the flit over the whole x16 link's bandwidth, rounded up.
`Prediction.for_kernel(release)` applies the rule of the kernel that booted and names it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from pfcxl.device.fabric import constants as fabric_constants
from pfcxl.device.topology import Region, Topology
from pfcxl.device.topology.model import region_name
from pfcxl.firmware_tables import cdat
from pfcxl.device.facts.qemu import DEFAULT_DEVICE_CDAT, DEFAULT_SWITCH_CDAT
from pfcxl.device.facts.qemu import FLIT_BYTES, LINK_GTS, LINK_WIDTH
from pfcxl.device.facts.cxl_spec import pcie_lane_mbs
from pfcxl.firmware_tables.generate import TableSet, tables_for

# QEMU 10.0.2 links (docs/notes, section 4.1): every CXL link trains at 32 GT/s x16, no flit mode.
LANE_MBS = pcie_lane_mbs(LINK_GTS)                               # 4000 MB/s per lane
LINK_LATENCY_PS = FLIT_BYTES * 1_000_000 // LANE_MBS            # 17000 ps per downstream-port hop
LINK_RAW_MBS = LANE_MBS * LINK_WIDTH                            # 64000: endpoint / switch upstream cap
LINK_AVAILABLE_MBS = LINK_GTS * 1000 * 128 // 130 * LINK_WIDTH // 8   # 63014: 128b/130b encoding, integer math as Linux does
LINK_WHOLE_NS = math.ceil(FLIT_BYTES * 1_000_000 // LINK_RAW_MBS / 1000)   # 1062 ps over x16 -> 2 ns (7.3.4)

# How the kernel adds the PCIe link term, by release: 6.12.95 (bookworm-backports) and 6.12.107
# (trixie) add picoseconds; 6.12.117 (trixie) and 7.3.4 (trixie-backports) the new rule. The change
# reached 6.12 between 6.12.108 and 6.12.117 (not booted); every release after 6.12.107 gets it.
LAST_LINK_PS_RELEASE = (6, 12, 107)
RULE_LINK_PS = "up to 6.12.107: link term added in picoseconds (17000 per hop at 32 GT/s x16)"
RULE_LINK_WHOLE_NS = "after 6.12.107: link term in ns over the whole link, rounded up (2 per hop at 32 GT/s x16)"



@dataclass(frozen=True)
class Prediction:
    region: str
    read_latency: int          # ns, link terms in ns as documented
    write_latency: int
    read_bandwidth: int        # MB/s
    write_bandwidth: int
    link_hops: int             # link terms on the worst path

    def as_linux_6_12(self) -> "Prediction":
        """What Linux 6.12 prints: each link term is added in picoseconds, not nanoseconds."""
        extra = self.link_hops * (LINK_LATENCY_PS - math.ceil(LINK_LATENCY_PS / 1000))
        return Prediction(self.region, self.read_latency + extra, self.write_latency + extra,
                          self.read_bandwidth, self.write_bandwidth, self.link_hops)

    def as_linux_whole_link(self) -> "Prediction":
        """What Debian's 6.12.117 and 7.3.4 print: each link term is 2 ns, not the documented 17."""
        extra = self.link_hops * (LINK_WHOLE_NS - math.ceil(LINK_LATENCY_PS / 1000))
        return Prediction(self.region, self.read_latency + extra, self.write_latency + extra,
                          self.read_bandwidth, self.write_bandwidth, self.link_hops)

    def for_kernel(self, release: str) -> tuple["Prediction", str]:
        """(what the kernel of `release`, e.g. 6.12.95+deb12-amd64, prints; the rule applied)."""
        if kernel_version(release) <= LAST_LINK_PS_RELEASE:
            return self.as_linux_6_12(), RULE_LINK_PS
        return self.as_linux_whole_link(), RULE_LINK_WHOLE_NS

    def as_sysfs(self) -> dict[str, int]:
        return {"read_latency": self.read_latency, "write_latency": self.write_latency,
                "read_bandwidth": self.read_bandwidth, "write_bandwidth": self.write_bandwidth}


def kernel_version(release: str) -> tuple[int, ...]:
    """The numbers a kernel release starts with: '6.12.117+deb13-amd64' -> (6, 12, 117), '7.0-rc2' -> (7, 0)."""
    return tuple(int(n) for n in re.match(r"\d+(?:\.\d+)*", release).group(0).split("."))


def _ns(ps: float) -> int:
    return math.ceil(ps / 1000)


def _device_timing(tables: TableSet, device_id: str) -> fabric_constants.PathTiming:
    data = tables.device_cdat.get(device_id)
    if data is None:
        return DEFAULT_DEVICE_CDAT
    v = cdat.values_of(cdat.decode_table(data))
    return fabric_constants.PathTiming(math.ceil(v["read latency"]), math.ceil(v["write latency"]),
                                       int(v["read bandwidth"]), int(v["write bandwidth"]))


def _switch_timing(tables: TableSet, switch_id: str) -> fabric_constants.PathTiming:
    data = tables.switch_cdat.get(switch_id)
    if data is None:
        return DEFAULT_SWITCH_CDAT
    by_type = {}
    for s in cdat.decode_table(data).of("SSLBIS"):
        value = s["entries"][0]["value"] * s["base_unit"]
        by_type[s["data_type"]] = value
    return fabric_constants.PathTiming(_ns(by_type[1]), _ns(by_type[2]), by_type[4], by_type[5])


def predict(topo: Topology, tables: TableSet | None = None) -> list[Prediction]:
    """One prediction per region; empty when the topology has no timing (no generic port: Linux
    then has no performance data and shows no access0 attributes)."""
    if topo.timing is None:
        return []
    tables = tables or tables_for(topo)
    host = fabric_constants.PROFILES[topo.timing][2]
    return [_predict_region(topo, tables, host, r) for r in topo.regions]


def _predict_region(topo: Topology, tables: TableSet, host: fabric_constants.PathTiming,
                    region: Region) -> Prediction:
    switch_of_port = {p.id: sw for sw in topo.switches for p in sw.downstream}
    worst = {"read": 0, "write": 0}
    hops_at_worst = 0
    # bandwidth buckets: host bridge -> switch id (or device id when direct) -> [read, write]
    buckets: dict[str, dict[str, list[int]]] = {}
    for dev_id in region.devices:
        dev = topo.device(dev_id)
        device = _device_timing(tables, dev_id)
        switch = switch_of_port.get(dev.port)
        sw_timing = _switch_timing(tables, switch.id) if switch else None
        hops = 2 if switch else 1                      # root port, plus the switch downstream port
        link_ns = hops * _ns(LINK_LATENCY_PS)
        for rw in ("read", "write"):
            lat = (getattr(device, f"{rw}_latency_ns") + link_ns + getattr(host, f"{rw}_latency_ns")
                   + (getattr(sw_timing, f"{rw}_latency_ns") if sw_timing else 0))
            if lat > worst[rw]:
                worst[rw] = lat
                hops_at_worst = hops
        ep = [min(LINK_RAW_MBS, device.read_bandwidth_mbs), min(LINK_RAW_MBS, device.write_bandwidth_mbs)]
        if sw_timing:
            ep = [min(ep[0], sw_timing.read_bandwidth_mbs), min(ep[1], sw_timing.write_bandwidth_mbs)]
        key = switch.id if switch else dev_id
        hb = topo.host_bridge_of(dev_id)
        slot = buckets.setdefault(hb, {}).setdefault(key, [0, 0])
        slot[0] += ep[0]
        slot[1] += ep[1]
    read_bw = write_bw = 0
    for hb, per in buckets.items():
        hb_read = hb_write = 0
        for key, (r, w) in per.items():
            if key in {sw.id for sw in topo.switches}:        # a switch's upstream link caps its devices
                r, w = min(r, LINK_RAW_MBS), min(w, LINK_RAW_MBS)
            hb_read += r
            hb_write += w
        read_bw += min(hb_read, host.read_bandwidth_mbs)
        write_bw += min(hb_write, host.write_bandwidth_mbs)
    name = region_name(topo.regions.index(region))
    return Prediction(name, worst["read"], worst["write"], read_bw, write_bw, hops_at_worst)
