"""The appliance's fabric telemetry (device/fabric/telemetry.py) on synthetic streams: every
figure it keeps is checked against the engine's own results for the merged stream the test
builds by the documented rules (each stream from its first record at model time 0, one ns per
instruction, addresses through the host's ranges, the port as the model's host)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pfcxl.device.fabric import constants as fc
from pfcxl.device.fabric import engine as fe
from pfcxl.device.fabric import model as fm
from pfcxl.device import topology
from pfcxl.device.appliance.timing import host_ranges
from pfcxl.device.fabric.telemetry import CAP_NS, COARSE_NS, FINE_NS, Telemetry, _bins, percentiles
from pfcxl.device.trace.records import LINE

TOPO = topology.load(topology.resolve("pf-appliance"))
APP = TOPO.appliance
BASE = 1 << 40                          # where the synthetic hosts see the pool
RANGES = [(BASE, APP.shared, 0)]

pytestmark = pytest.mark.unit


def stream(n: int, *, first_insn: int = 0, gap: float = 10, stride: int = LINE, start: int = 0,
           writes: bool = False, seed: int = 0) -> np.ndarray:
    r = np.zeros(n, fe.trace_dtype())
    r["insn"] = first_insn + np.floor(np.arange(n) * gap).astype(np.uint64)
    r["hpa"] = BASE + start + np.arange(n, dtype=np.uint64) * stride
    r["size"] = 8
    r["write"] = (np.random.default_rng(seed).random(n) < 0.5) if writes else 0
    return r


def merged(streams: dict[int, tuple[int, np.ndarray]]) -> np.ndarray:
    """The merge the telemetry documents, built here: port as host, pool offsets, ps stamps."""
    parts = []
    for port, recs in streams.values():
        out = recs.copy()
        out["insn"] = (recs["insn"] - recs["insn"].min()) * int(fc.NS_PER_INSTRUCTION * 1000)
        out["hpa"] = recs["hpa"] - BASE
        out["size"] = LINE
        out["host"] = port
        parts.append(out)
    m = np.concatenate(parts)
    return m[np.argsort(m["insn"], kind="stable")]


def engine(model, m, *, dependent: bool, seed: int = 1):
    return fe.run(model, m, ns_per_insn=0.001, dependent=dependent, granularity=APP.granularity, seed=seed)


def telemetry(system: str, streams: dict[int, tuple[int, np.ndarray]], issue: str = "independent",
              windows: int = 1) -> Telemetry:
    t = Telemetry(TOPO, system, issue=issue)
    for key, (port, _) in streams.items():
        t.add_stream(key, host=10 + key, port=port, ranges=RANGES)
    for w in range(windows):
        t.model({k: np.array_split(recs, windows)[w] for k, (_, recs) in streams.items()})
    return t


def host_entry(snap: dict, host: int) -> dict:
    return next(h for h in snap["hosts"] if h["host"] == host)


def test_per_host_and_module_figures_are_the_models_own_for_the_merged_stream():
    streams = {1: (0, stream(20_000, gap=3, writes=True, seed=1)),
               2: (5, stream(20_000, first_insn=10**9, gap=2, stride=3 * LINE, writes=True, seed=2))}
    t = telemetry("pf", streams)
    snap = t.snapshot()
    m = merged(streams)
    ref = {name: engine(model, m, dependent=False) for name, model in t.models.items()}
    module = (m["hpa"] // APP.granularity) % APP.modules
    for key, (port, recs) in streams.items():
        e = host_entry(snap, 10 + key)
        sel = m["host"] == port
        assert e["port"] == port
        assert (e["reads"], e["writes"], e["bytes"]) == (int(np.count_nonzero(sel & (m["write"] == 0))),
                                                       int(np.count_nonzero(sel & (m["write"] == 1))),
                                                       int(np.count_nonzero(sel)) * LINE)
        for name, r in ref.items():
            for op, want in (("read", False), ("write", True)):
                lat = r.latency_ps[sel & (r.write == want)] // 1000
                got = e["latency_ns"][name][op]
                assert got["count"] == len(lat)
                # 1-ns histogram bins: the nearest-rank percentile of the engine's own latencies
                assert got["p50"] == int(np.percentile(lat, 50, method="inverted_cdf"))
                assert got["p99"] == int(np.percentile(lat, 99, method="inverted_cdf"))
                assert got["max"] == int(lat.max())
        reads = sel & (ref["pf_hbm"].write == 0)
        assert e["hbm_hit_rate"] == pytest.approx(ref["pf_hbm"].hit[reads].mean())
        # the port's utilisation: its busiest optical path, busy time over the model's window
        busy = ref["pf"].stages["port_up"].busy_ps[port * APP.modules:(port + 1) * APP.modules].max()
        assert e["utilisation"]["pf"]["port_up"] == pytest.approx(busy / ref["pf"].window_ps)
    for e in snap["modules"]:
        sel = module == e["module"]
        assert e["reads"] + e["writes"] == int(np.count_nonzero(sel))
        lat = ref["pf"].latency_ps[sel & ~ref["pf"].write] // 1000
        assert e["latency_ns"]["pf"]["read"]["p50"] == int(np.percentile(lat, 50, method="inverted_cdf"))
    assert snap["records"] == len(m) and snap["windows"] == 1 and snap["unmapped"] == 0
    assert snap["labels"]["pf"].startswith("modelled PF")


def test_hosts_meet_in_one_model_an_electrical_switch_link_is_shared():
    """Two hosts behind one switch (ports 0 and 1), each offering 60% of its link: alone each
    waits little; merged, the shared link is over-full and both wait. The streams start 10^9
    instructions apart, and still meet: each stream starts at model time 0."""
    per_access_ps = LINE * 1_000_000 // fc.EL_SWITCH_BANDWIDTH_MBS
    gap = per_access_ps / 0.6 / 1000                    # instructions (ns) between a host's accesses
    a, b = stream(5000, gap=gap), stream(5000, first_insn=10**9, gap=gap, start=1 << 20)
    alone = telemetry("electrical", {1: (0, a)}).snapshot()
    both = telemetry("electrical", {1: (0, a), 2: (1, b)}).snapshot()
    p50 = lambda s, h: host_entry(s, h)["latency_ns"]["electrical"]["read"]["p50"]
    assert p50(both, 11) > p50(alone, 11) + 100
    ref = engine(fm.electrical_pool(APP.ports, APP.modules), merged({1: (0, a), 2: (1, b)}), dependent=False)
    assert p50(both, 12) == int(np.percentile(ref.latency_ps[ref.write == 0][
        merged({1: (0, a), 2: (1, b)})["host"] == 1] // 1000, 50, method="inverted_cdf"))
    util = lambda s: s["stages"]["electrical"]["switch_link_up"]["max_utilisation"]
    st = ref.stages["switch_link_up"]
    assert util(both) == pytest.approx(st.busy_ps.max() / ref.window_ps)
    assert util(both) > 1.6 * util(alone)              # the second host's bytes crossed the same link


def test_dependent_issue_carries_each_vcpu_across_windows():
    """A lone pointer chase split over three windows is timed as in one: the latency each vCPU
    waited for in earlier windows moves its later accesses."""
    recs = stream(9000, gap=7, stride=4096 + LINE)
    one = telemetry("pf", {1: (2, recs)}, issue="dependent")
    three = telemetry("pf", {1: (2, recs)}, issue="dependent", windows=3)
    ref = engine(one.models["pf"], merged({1: (2, recs)}), dependent=True)
    assert three.snapshot()["windows"] == 3
    # the issue schedule spans the same model time: the chase waited for every access
    span = int(ref.issue_ps[-1] + ref.latency_ps[-1] - ref.issue_ps[0])
    assert sum(three.model_ps.values()) / 2 == pytest.approx(span, rel=1e-3)
    assert one.streams[1].carry["pf"][0] == three.streams[1].carry["pf"][0]


def test_records_outside_the_hosts_ranges_are_counted_not_modelled():
    recs = stream(100)
    recs["hpa"][:10] = BASE - 4096                      # below the pool
    recs["hpa"][10:20] = BASE + APP.shared              # past it
    snap = telemetry("pf", {1: (0, recs)}).snapshot()
    assert snap["unmapped"] == 20 and snap["records"] == 80


def test_the_host_ranges_cover_its_dax_devices_and_direct_nvdimms():
    from pfcxl.device.topology import address_map
    offsets = {"shared": 0, "private/3": APP.shared + 3 * APP.private}
    ranges = host_ranges(TOPO, offsets, slot=3)
    dax = address_map.dax_placements(TOPO)
    direct = address_map.direct_placements(TOPO)
    assert (dax[0].base, APP.shared, 0) in ranges and (dax[1].base, APP.private, offsets["private/3"]) in ranges
    assert (direct[0].base, APP.shared, 0) in ranges and (direct[1].base, APP.private, offsets["private/3"]) in ranges
    assert host_ranges(TOPO, offsets, slot=None) == [r for r in ranges if r[2] == 0]


def test_percentiles_of_a_histogram():
    h = np.zeros(400, np.int64)
    h[283], h[300], h[399] = 98, 1, 1
    assert percentiles(h) == {"count": 100, "p50": 283, "p99": 300, "max": 399}
    assert percentiles(None) == {"count": 0}


def test_latencies_past_the_fine_bins_are_binned_coarsely_and_the_maximum_kept():
    """A saturated model's latencies keep the histograms small: nearest-rank percentiles within
    one coarse bin past FINE_NS, everything past CAP_NS in the last bin, the exact maximum."""
    lat = np.r_[np.full(50, 300), np.arange(49) * 20_000 + 10_000, 3_000_000]
    h = np.bincount(_bins(lat))
    assert len(h) == FINE_NS + (CAP_NS - FINE_NS) // COARSE_NS + 1
    p = percentiles(h, int(lat.max()))
    exact = np.percentile(lat, [50, 99], method="inverted_cdf")
    assert p["p50"] == exact[0] == 300
    assert exact[1] == 970_000 and p["p99"] <= exact[1] < p["p99"] + COARSE_NS
    assert p["max"] == 3_000_000


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="not one of pf, electrical"):
        Telemetry(TOPO, "dram")
    with pytest.raises(ValueError, match="issue 'later'"):
        Telemetry(TOPO, "pf", issue="later")


def test_the_plugin_finds_the_appliances_ring_after_the_memory_descriptors():
    from pfcxl.host_tools.timing import config as timing
    from pfcxl.host_tools.vm import host as vm
    served = [d for d in TOPO.devices if d.appliance]
    n = vm.ring_fd_number(TOPO)
    assert n == vm.FIRST_MEMORY_FD + len(served)           # the memory descriptors are FIRST_MEMORY_FD .. n - 1
    args = timing.plugin_args(Path("/p.so"), TOPO, Path("/run"), timing.TimingConfig("trace"), "host0",
                              ring=f"/proc/self/fd/{n}")
    assert f"ring=/proc/self/fd/{n}" in args[1].split(",") and "mode=trace" in args[1].split(",")
