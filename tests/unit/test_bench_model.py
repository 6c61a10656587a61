"""The bench's modelled columns (host_tools/bench/model.py) on synthetic captured streams: each row's
records are cut out by the plugin's phase counts and replayed at the row's nominal load; the figures
are checked against the models' own bandwidths and idle latencies."""

import numpy as np
import pytest

from pfcxl.device.topology import address_map
from pfcxl.device.fabric import constants as fc
from pfcxl.device import topology
from pfcxl.device.fabric.engine import trace_dtype
from pfcxl.errors import TimingError
from pfcxl.device.fabric import systems as fabric_systems
from pfcxl.host_tools.bench import model as bench_model
from pfcxl.host_tools.timing import config as timing

TOPO = topology.load(topology.resolve("pf-nic"))
BASE = address_map.dax_placements(TOPO)[0].base
MODELS = fabric_systems.models(TOPO)
IDLE_READ = {"pf": MODELS["pf"].idle_ns(False), "electrical": MODELS["electrical"].idle_ns(False),
             "dram": MODELS["local"].idle_ns(False)}
SPAN = 4 << 20

pytestmark = pytest.mark.unit


def seq_stream(n: int, *, size: int = 64, write: bool = False, start: int = 0) -> np.ndarray:
    """One guest streaming lines in order, stamped as a vCPU's instruction counter would."""
    tr = np.zeros(n, trace_dtype())
    tr["hpa"] = BASE + start + np.arange(n) * 64
    tr["size"], tr["write"], tr["insn"] = size, write, np.arange(n) * 137
    return tr


def loaded_stream(chase: int, traffic: int, seed: int = 1) -> np.ndarray:
    """A loaded-latency row as captured: chase loads in [0, SPAN), one traffic thread's lines
    after it, interleaved the way two vCPUs would."""
    rng = np.random.default_rng(seed)
    tr = np.concatenate([seq_stream(traffic, start=SPAN), np.zeros(chase, trace_dtype())])
    tr["hpa"][traffic:] = BASE + rng.integers(0, SPAN // 64, chase) * 64
    tr["size"][traffic:] = 8                    # the chase reads one word of each line
    return tr[rng.permutation(len(tr))]


def test_rows_are_cut_out_by_the_plugins_phase_counts():
    a, b = seq_stream(300), seq_stream(200, write=True)
    phases = [{"reads": 300, "writes": 0}, {"reads": 0, "writes": 200}]
    pieces = timing.split_rows(np.concatenate([a, b]), phases)
    assert [len(p) for p in pieces] == [300, 200]
    assert np.array_equal(pieces[1], b)
    with pytest.raises(TimingError, match="reported 500 requests in 2 phases but 499 records"):
        timing.split_rows(np.concatenate([a, b])[:-1], phases)
    assert timing.marks_rows("bandwidth --target /dev/dax0.0 --mark-rows 1")
    assert not timing.marks_rows("bandwidth --target /dev/dax0.0 --mark-rows 10")


def test_a_bandwidth_row_carries_what_each_system_carries_of_the_host_link():
    row = bench_model.bandwidth_row(TOPO, seq_stream(1 << 16))
    assert row["offered_gbs"] == fc.PF_HOST_BANDWIDTH_MBS / 1000
    # the PF appliance spreads a host's stream over its modules' ports: the host link is the limit
    assert row["pf"]["gbs"] == pytest.approx(fc.PF_HOST_BANDWIDTH_MBS / 1000, rel=0.03)
    # the electrical pool's switch link is the limit
    assert row["electrical"]["gbs"] == pytest.approx(fc.EL_SWITCH_BANDWIDTH_MBS / 1000, rel=0.03)
    assert row["dram"]["gbs"] == pytest.approx(fc.PF_HOST_BANDWIDTH_MBS / 1000, rel=0.03)
    assert row["electrical"]["p50_ns"] > 2 * IDLE_READ["electrical"]        # queued behind its switch link
    writes = bench_model.bandwidth_row(TOPO, seq_stream(1 << 16, write=True))
    assert writes["pf"]["op"] == "write" and writes["electrical"]["gbs"] < 0.55 * writes["pf"]["gbs"]


def test_the_nominal_traffic_load_of_a_loaded_latency_row():
    data = {"delay_unit": "ns", "threads": 2, "access_bytes": 64}
    port = fc.PF_PORT_BANDWIDTH_MBS / 1000
    assert bench_model.traffic_load(data, {"delay": 0}) == bench_model.HOST_LINK_LOAD
    assert bench_model.traffic_load(data, {"delay": 2000}) == pytest.approx(2 * 64 / 2000 / port)
    assert bench_model.traffic_load(data, {"delay": 1}) == bench_model.HOST_LINK_LOAD      # capped by the link
    assert bench_model.traffic_load({**data, "threads": 0}, {"delay": 0}) == 0
    assert bench_model.traffic_load({**data, "delay_unit": "cycles"}, {"delay": 0}) is None


def test_loaded_rows_chase_at_idle_under_light_traffic_and_queue_under_full_traffic():
    data = {"delay_unit": "ns", "threads": 1, "access_bytes": 64, "span": SPAN}
    records = loaded_stream(chase=20_000, traffic=20_000)
    light = bench_model.loaded_row(TOPO, data, {"delay": 20_000}, records)
    assert light["chase_requests"] == 20_000 and light["traffic_requests"] == 20_000
    for system, idle in IDLE_READ.items():
        # whole lines move, whatever the chase touched: the idle figures (283 ns for PF)
        assert light[system]["latency_p50_ns"] == pytest.approx(idle, abs=1)
        assert light[system]["traffic_gbs"] == pytest.approx(light["offered_gbs"], rel=0.01)
    full = bench_model.loaded_row(TOPO, data, {"delay": 0}, records)
    assert full["offered_gbs"] == fc.PF_HOST_BANDWIDTH_MBS / 1000
    # the switch link (64 GB/s) cannot carry the host link's 128: the chase queues behind it
    assert full["electrical"]["latency_p50_ns"] > 1.5 * IDLE_READ["electrical"]
    assert full["electrical"]["traffic_gbs"] == pytest.approx(fc.EL_SWITCH_BANDWIDTH_MBS / 1000, rel=0.05)
    # the PF appliance carries it on 16 ports: the chase stays near its idle latency
    assert full["pf"]["latency_p50_ns"] < IDLE_READ["pf"] + 40
    assert full["pf"]["chase_loads"] >= 1
    cycles = bench_model.loaded_row(TOPO, {**data, "delay_unit": "cycles"}, {"delay": 0}, records)
    assert "no nominal rate" in cycles["error"]


def test_a_marked_bandwidth_run_gets_rows_and_the_curve_with_each_knee():
    data = {"tool": "bandwidth", "results": [{"pattern": "seq", "op": "read"}, {"pattern": "seq", "op": "write"}]}
    pieces = [seq_stream(1 << 14), seq_stream(1 << 14, write=True)]
    modelled = bench_model.model_run(TOPO, "bandwidth", data, pieces)
    assert len(modelled["rows"]) == 2
    curve = modelled["curve"]
    assert set(curve) == {"pf", "electrical", "dram"}
    assert [p["load"] for p in curve["pf"]["points"]] == bench_model.CURVE_LOADS
    el_knee, pf_knee = curve["electrical"]["knee"], curve["pf"]["knee"]
    # the first load the pool does not carry: from its 64 GB/s switch link on, below the host link
    assert fc.EL_SWITCH_BANDWIDTH_MBS / 1000 <= el_knee["offered_gbs"] < fc.PF_HOST_BANDWIDTH_MBS / 1000
    assert pf_knee["offered_gbs"] > fc.PF_HOST_BANDWIDTH_MBS / 1000
    assert bench_model.model_run(TOPO, "bandwidth", data, pieces[:1]) == {
        "rows_error": "1 captured phases for 2 rows"}
