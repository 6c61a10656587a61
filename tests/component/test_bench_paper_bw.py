"""The paper's bandwidth experiment (host_tools/experiments/paper_bw.py) on a synthetic capture: one guest's
row stream copied to 16 hosts, on their own modules or all-to-all; PF ports hold 25.6 GB/s at load
1.0 while the electrical pool's switch links fill and its knee shows."""

import json
import subprocess
import sys

import numpy as np
import pytest

from pfcxl.device.topology import address_map
from pfcxl.device.fabric import constants as fc
from pfcxl.device.fabric import engine as fabric_engine
from pfcxl.device import topology
from pfcxl.device.fabric.engine import trace_dtype
from pfcxl.device.fabric import systems as fabric_systems
from pfcxl.host_tools.experiments import paper_bw as bench_paper_bw
from pfcxl.host_tools.timing import model_runs

TOPO = topology.load(topology.resolve("pf-nic"))
BASE = address_map.dax_placements(TOPO)[0].base
APP = fabric_systems.appliance_for(TOPO)
PORT_GBS = fc.PF_PORT_BANDWIDTH_MBS / 1000

pytestmark = pytest.mark.component


def row(n: int, *, size: int = 64, linear: bool = True, write: bool = False) -> np.ndarray:
    """A guest's captured row of `size`-byte transfers as the plugin records them: one record per
    line touched (a 1 KB transfer is 16 line records), stamped by its vCPU's instructions."""
    tr = np.zeros(n, trace_dtype())
    per = max(size // 64, 1)
    slots = np.arange(n // per) if linear else np.random.default_rng(3).integers(0, (8 << 20) // (64 * per), n // per)
    lines = (slots[:, None] * per + np.arange(per)).ravel()
    tr["hpa"] = BASE + lines * 64 + (0 if size >= 64 else np.arange(n) % (64 // size) * size)
    tr["size"], tr["write"], tr["insn"] = min(size, 64), write, np.arange(n) * 211
    return tr


def modules(tr: np.ndarray) -> np.ndarray:
    return fabric_engine.locate(tr["hpa"], BASE, APP.granularity, APP.modules)[0]


def test_each_host_gets_the_stream_on_its_own_module_or_across_all():
    captured = row(4096, linear=False)
    own = bench_paper_bw.hosts(captured, TOPO, all_to_all=False)
    assert len(own) == 16 * len(captured) and set(np.unique(own["host"])) == set(range(16))
    for h in range(16):
        mine = own[own["host"] == h]
        assert set(modules(mine)) == {h}
        assert np.array_equal(mine["size"], captured["size"]) and np.array_equal(mine["write"], captured["write"])
    spread = bench_paper_bw.hosts(row(4096), TOPO, all_to_all=True)
    assert all(len(set(modules(spread[spread["host"] == h]))) == 16 for h in range(16))


@pytest.mark.parametrize("size,linear", [(32, False), (64, True), (1024, False)])
def test_pf_ports_hold_their_rate_and_the_electrical_pool_hits_its_switch_links(size, linear):
    report = bench_paper_bw.replay_row(row(16384 if size >= 64 else 32768, size=size,
                                           linear=linear), TOPO, 1.0, 5.0, [0.3, 0.5, 0.6, 0.7, 0.8, 1.0])
    port = report["own_module"]["pf"]["ports"]["port_up"]
    assert port["queues"] == 16
    assert port["gbs_min"] == pytest.approx(PORT_GBS, rel=0.02) and port["utilisation_min"] >= 0.98
    switch = report["own_module"]["electrical"]["ports"]["switch_link_up"]
    assert switch["utilisation_min"] >= 0.97                      # 4 hosts x 25.6 GB/s into 64 GB/s
    per_host = fc.EL_SWITCH_BANDWIDTH_MBS / 1000 / fc.EL_HOSTS_PER_SWITCH
    assert report["own_module"]["electrical"]["per_host_gbs_max"] == pytest.approx(per_host, rel=0.03)
    knee = report["electrical_curve"]["knee"]
    assert knee["load"] == 0.7                                    # the first load past 64 / 4 / 25.6 = 0.625
    # all-to-all at the host link's rate: the full mesh carries it, the switch links do not
    full = report["all_to_all_full"]
    assert full["pf"]["per_host_gbs_min"] > 0.9 * fc.PF_HOST_BANDWIDTH_MBS / 1000
    assert full["electrical"]["per_host_gbs_max"] == pytest.approx(per_host, rel=0.03)


def test_the_script_replays_a_saved_capture_and_writes_its_report(tmp_path):
    capture = np.concatenate([row(2048), row(2048, write=True)])
    model_runs.save_trace(tmp_path / "capture.npy", capture)
    (tmp_path / "capture.json").write_text(json.dumps({"rows": [
        {"pattern": "seq", "op": "read", "size": 64, "records": 2048},
        {"pattern": "seq", "op": "write", "size": 64, "records": 2048}]}))
    done = subprocess.run([sys.executable, "-m", "pfcxl.host_tools.experiments.paper_bw", "--capture-dir", str(tmp_path),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "paper_bw.json").read_text())
    assert [r["op"] for r in report["rows"]] == ["read", "write"]
    assert "own module (host i -> module i)" in done.stdout and "all-to-all" in done.stdout
    done = subprocess.run([sys.executable, "-m", "pfcxl.host_tools.experiments.paper_bw", "--load", "-1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--load" in done.stderr and "Traceback" not in done.stderr
    (tmp_path / "capture.json").write_text(json.dumps({"rows": [{"records": 5}]}))
    done = subprocess.run([sys.executable, "-m", "pfcxl.host_tools.experiments.paper_bw", "--capture-dir", str(tmp_path),
                           "--out", str(tmp_path / "bad")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "capture.json lists 5 records, capture.npy holds 4096" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "bad").exists()   # nothing half-written
