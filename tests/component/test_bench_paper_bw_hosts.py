"""bench_paper_bw --hosts N (host_tools/experiments/paper_bw_hosts.py) without booting: each guest's
command, and a synthetic appliance capture laid out as the guests' bandwidth rows lay theirs
(own module by --stripe, all-to-all by --rotate) cut into rows and replayed."""

import json
import subprocess
import sys

import numpy as np
import pytest

from pfcxl.device.topology import address_map
from pfcxl.device.fabric import constants as fc
from pfcxl.device import topology
from pfcxl.device.trace import capture as trace_capture
from pfcxl.device.trace.records import RECORD_FIELDS
from pfcxl.errors import PfcxlError
from pfcxl.host_tools.experiments import paper_bw_hosts as bh
from pfcxl.host_tools.fleet import multihost

TOPO = topology.load(topology.resolve("pf-appliance"))
APP = TOPO.appliance
BASE = address_map.dax_placements(TOPO)[0].base
HOSTS, LINES, SPAN = 16, 16384, 2 << 20
ROWS = [("seq", 64), ("seq", 1024), ("random", 64), ("random", 1024)]

pytestmark = pytest.mark.component


def test_each_guest_stripes_onto_its_own_module_then_rotates_across_all():
    cmd = multihost.expand(bh.command(APP, sizes="64,1024", nbytes="1M", span="2M"), 3, HOSTS)
    own, spread = cmd.split(" && ")
    assert f"--stripe {APP.granularity},{APP.modules},3" in own and "--mark-rows 1" in own
    assert f"--rotate $((3 * {APP.granularity}))" in spread and "--stripe" not in spread


def lines(host: int, layout: str, pattern: str) -> np.ndarray:
    """Pool offsets of one row as the guest tool issues them (bandwidth.c's --stripe / --rotate)."""
    o = np.arange(LINES, dtype=np.int64) * 64
    if pattern == "random":
        o = np.random.default_rng(host).permutation(o)
    if layout == "own_module":
        g, n = APP.granularity, APP.modules
        return (o // g * n + host) * g + o % g
    return (o + host * APP.granularity) % SPAN


def fake_capture(out):
    w = trace_capture.CaptureWriter(out / "capture", "pf")
    rows = {}
    for h in range(HOSTS):
        w.stream(h + 1, h, h)
        rows[h], phases = [], []
        for layout in ("own_module", "all_to_all"):
            for pattern, size in ROWS:
                r = np.zeros(LINES, np.dtype(RECORD_FIELDS))
                r["hpa"], r["size"], r["insn"] = BASE + lines(h, layout, pattern), 64, np.arange(LINES) * 97
                w.add(h + 1, r)
                rows[h].append({"pattern": pattern, "op": "read", "size": size, "layout": layout})
                phases.append({"event": "phase", "reads": LINES, "writes": 0})
        trace_capture.write_phases(out / "capture", h, phases)
    w.close()
    (out / bh.ROWS_FILE).write_text(json.dumps({"hosts": rows}))
    (out / bh.STATS_FILE).write_text(json.dumps({"records": HOSTS * 8 * LINES, "unmapped": 0, "error": None,
                                                 "rings": {"largest_fill": 999, "capacity": 1 << 19, "dropped": 0}}))


def test_rows_are_cut_by_phase_and_land_on_the_hosts_own_modules(tmp_path):
    fake_capture(tmp_path)
    got, rows = bh.load(tmp_path)
    by_row = bh.streams(got, rows)
    assert sorted(by_row) == sorted((p, "read", s) for p, s in ROWS)
    for row in by_row.values():
        own, spread = row["own_module"], row["all_to_all"]
        assert len(own) == len(spread) == HOSTS * LINES and set(own["host"]) == set(range(HOSTS))
        assert bh.on_own_module(own, TOPO) == 1.0
        assert bh.on_own_module(spread, TOPO) < 0.2          # every host crosses every module
        assert (own["insn"] == 0).all()                      # replay spreads them by bytes


def test_a_capture_whose_phases_do_not_match_its_rows_is_refused(tmp_path):
    fake_capture(tmp_path)
    rows = json.loads((tmp_path / bh.ROWS_FILE).read_text())
    rows["hosts"]["5"] = rows["hosts"]["5"][:-1]
    (tmp_path / bh.ROWS_FILE).write_text(json.dumps(rows))
    got, loaded = bh.load(tmp_path)
    with pytest.raises(PfcxlError, match="host 5: 8 captured phases for 7 rows"):
        bh.streams(got, loaded)
    with pytest.raises(PfcxlError, match="2 bandwidth outputs, expected|0 bandwidth outputs"):
        bh._rows("no output", 2)


def test_the_script_reports_the_real_hosts_capture(tmp_path):
    fake_capture(tmp_path)
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "pfcxl.host_tools.experiments.paper_bw", "--hosts", "16",
                           "--capture-dir", str(tmp_path), "--out", str(out), "--curve-loads", "0.5,0.7,1.0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "paper_bw.json").read_text())
    assert report["hosts"] == HOSTS and len(report["rows"]) == len(ROWS)
    for r in report["rows"]:
        assert r["on_own_module"] == 1.0
        port = r["own_module"]["pf"]["ports"]["port_up"]
        assert port["queues"] == HOSTS and port["gbs_min"] == pytest.approx(fc.PF_PORT_BANDWIDTH_MBS / 1000, rel=0.02)
        assert r["own_module"]["electrical"]["ports"]["switch_link_up"]["utilisation_min"] >= 0.97
        assert r["electrical_curve"]["knee"]["load"] == 0.7
    assert report["captured_records"] == HOSTS * 8 * LINES == report["appliance"]["records"]
    assert report["appliance"]["rings"] == {"largest_fill": 999, "capacity": 1 << 19, "dropped": 0}  # the stats file's
    # the printed own-module table holds the report's rows and figures: every host's lines of each row
    from pfcxl.host_tools.experiments import paper_bw as bench_paper_bw
    printed = list(zip(*(c._cells for c in bench_paper_bw.tables(report)[0].columns)))
    assert sorted((p, o, s) for p, o, s, *_ in printed) == sorted((p, "read", str(s)) for p, s in ROWS)
    for cells, r in zip(printed, report["rows"]):
        assert r["records"] == HOSTS * LINES and cells[3] == str(r["records"])
        assert float(cells[5]) == pytest.approx(r["own_module"]["pf"]["ports"]["port_up"]["gbs_min"], abs=0.005)
        assert cells[-2] == "0.7"                                   # the electrical knee's load
        assert f"{r['pattern']} {r['size']} B 1.000" in " ".join(done.stdout.split())   # records on own module
    assert f"largest ring fill 999 of {1 << 19}, dropped 0" in done.stdout
