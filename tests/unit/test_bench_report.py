"""bench reports from results files: labelled tables, PNG plots, comparisons, suite files."""

import json

import pytest
from rich.console import Console

from pfcxl.errors import PfcxlError
from pfcxl.host_tools.bench import suite as bench
from pfcxl.host_tools.bench import plots as bench_plots
from pfcxl.host_tools.bench import report as bench_report

PNG = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.unit


def sample(scale: float = 1.0, modelled: bool = True) -> dict:
    chase = {"tool": "idle_latency", "lines": 1024, "visited_lines_per_lap": 1024,
             "read": {"loads": 1024, "ns_per_load": 700.0 * scale, "p50_ns": 690.0, "p99_ns": 900.0, "p999_ns": 1200.0},
             "write": {"stores": 1024, "ns_per_store": 800.0 * scale, "p50_ns": 790.0, "p99_ns": 990.0, "p999_ns": 1300.0}}
    model = {"pf": {"read": {"count": 2048, "p50": 283.0}, "write": {"count": 1024, "p50": 224.0}, "gbps": 0.2,
                    "quantiles_ns": [283.0] * 103},
             "electrical": {"read": {"count": 2048, "p50": 833.0}, "write": {"count": 1024, "p50": 774.0},
                            "gbps": 0.1, "quantiles_ns": [833.0] * 103}} if modelled else {}
    bw = {"tool": "bandwidth", "results": [
        {"pattern": "seq", "op": "read", "size": s, "threads": 1, "MBps": 20.0 * scale * s / 64,
         "bytes_moved": 1 << 20, "bytes_requested": 1 << 20} for s in (32, 64, 1024)]}
    loaded = {"tool": "loaded_latency", "rows": [{"delay": d, "bandwidth_MBps": 10.0 / (1 + d), "latency_ns": 1200.0}
                                                 for d in (0, 2000)]}
    runs = [("idle_latency/cxl", chase, model), ("idle_latency/local", chase, {}),
            ("bandwidth/cxl", bw, {"pf": {"gbps": 0.8}, "electrical": {"gbps": 0.8}} if modelled else {}),
            ("bandwidth/local", bw, {}), ("loaded_latency/cxl", loaded, {}), ("loaded_latency/local", loaded, {})]
    results = [{"name": n, "system": n.split("/")[1], "command": "x", "status": "ok", "seconds": 1.0, "data": d,
                "error": None, "modelled": m} for n, d, m in runs]
    results.append({"name": "hanger", "system": "local", "command": "sleep 600", "status": "error", "seconds": 15.0,
                    "data": None, "error": "benchmark hanger: command did not finish within 15s", "modelled": {}})
    return {"environment": {"topology": "pf-nic", "timing_mode": "trace" if modelled else "none"}, "results": results}


def render(tables) -> str:
    console = Console(width=400, record=True)
    for t in tables:
        console.print(t)
    return console.export_text()


def test_tables_carry_the_labelled_columns_and_the_failures():
    text = render(bench_report.tables(sample()))
    for label in ("measured in emulator", "modelled PF appliance", "modelled electrical switch pool", "local DRAM"):
        assert label in text
    # each cell is the results' figure for its row and column, its statistic named: measured CXL
    # mean and p50, traced PF and electrical p50s, measured local; a measured mean follows the data
    assert _row(text, "read") == ["read", "mean 700 / p50 690 ns", "p50 283 ns (traced)", "p50 833 ns (traced)",
                                  "mean 700 / p50 690 ns"]
    assert _row(text, "write") == ["write", "mean 800 / p50 790 ns", "p50 224 ns (traced)", "p50 774 ns (traced)",
                                   "mean 800 / p50 790 ns"]
    assert _row(render(bench_report.tables(sample(3.0))), "read")[1] == "mean 2100 / p50 690 ns"
    assert _row(text, "seq", "read", "1024")[4:] == ["320.0", "320.0"]     # 20 MB/s x 1024 / 64, CXL and local
    assert _row(text, "hanger") == ["hanger", "benchmark hanger: command did not finish within 15s"]


def _with_direct(results: dict, scale: float) -> dict:
    """`results` plus a direct-path copy of each CXL run, its figures times `scale`."""
    out = json.loads(json.dumps(results))
    for run in [r for r in out["results"] if r["name"].endswith("/cxl")]:
        copy = json.loads(json.dumps(run), parse_float=lambda x: float(x) * scale)
        copy.update(name=run["name"].replace("/cxl", "/direct"), system="direct", modelled={})
        out["results"].append(copy)
    return out


def _row(text: str, *first: str, last: bool = False) -> list[str]:
    """The cells of the (first, or last) table row whose first cells are `first` (one word each)."""
    rows = ([c.strip() for c in line.strip().strip("│").split("│")] for line in text.splitlines())
    found = [r for r in rows if r[:len(first)] == list(first)]
    return found[-1 if last else 0]


def test_a_direct_run_gets_its_own_column():
    plain = render(bench_report.tables(sample()))
    assert bench_report.DIRECT not in plain
    text = render(bench_report.tables(_with_direct(sample(), 0.5)))
    assert text.count(bench_report.DIRECT) == 2             # idle latency and bandwidth tables
    assert _row(text, "read")[-1] == "mean 350 / p50 345 ns"   # 700 and 690 ns x 0.5 on the direct device
    assert _row(text, "seq", "read", "1024")[4:7] == ["320.0", "320.0", "160.0"]   # CXL, local, direct MB/s


def test_direct_only_results_list_the_direct_rows():
    results = _with_direct(sample(), 2.0)
    results["results"] = [r for r in results["results"] if not r["name"].endswith("/cxl")]
    assert _row(render(bench_report.tables(results)), "seq", "read", "64")[4:7] == ["-", "20.0", "40.0"]


def test_suite_on_data_paths_and_the_devices_each_path_uses():
    from pfcxl.device.topology import data_path
    from pfcxl.device import topology
    pf_nic = topology.load(topology.resolve("pf-nic"))
    suite = bench.load_suite("quick")
    assert bench.on_data_paths(suite, pf_nic) == suite
    both = [s.name for s in bench.on_data_paths(suite, data_path.with_data_path(pf_nic, "both"))]
    assert both[:3] == ["idle_latency/cxl", "idle_latency/direct", "idle_latency/local"]
    direct = bench.on_data_paths(suite, data_path.with_data_path(pf_nic, "direct"))
    assert {s.system for s in direct} == {"direct", "local"}
    assert [s.command for s in direct if s.system == "direct"] == [s.command for s in suite if s.system == "cxl"]
    ready = {"dax": [{"path": "/dev/dax0.0", "kind": "cxl"}, {"path": "/dev/dax1.0", "kind": "direct"},
                     {"path": "/dev/dax2.0", "kind": "direct"}]}
    assert bench.devices(ready) == {"cxl": "/dev/dax0.0", "direct": "/dev/dax1.0"}
    assert bench.devices({"regions": []}) == {"cxl": "/dev/dax0.0"}


def test_without_a_trace_the_idle_model_is_shown_and_said_so():
    from pfcxl.device.fabric import model as fabric_model
    text = render(bench_report.tables(sample(modelled=False)))
    for op, write in (("read", False), ("write", True)):       # the fabric model's idle latencies
        assert _row(text, op)[2:4] == [f"{fabric_model.idle_ns('pf', write)} ns (idle model)",
                                       f"{fabric_model.idle_ns('electrical', write)} ns (idle model)"]
    assert "(traced)" not in text


def test_plots_are_png_files_with_something_drawn(tmp_path):
    from matplotlib import image as mpimg
    written = bench_plots.plots(sample(), tmp_path)
    assert {p.name for p in written} == {"latency_cdf.png", "loaded_latency.png", "bandwidth.png"}
    for path in written:
        assert path.read_bytes()[:8] == PNG
        pixels = mpimg.imread(path)                              # decodes: a whole image, not a header
        assert pixels.shape[0] > 100 and pixels.shape[1] > 100
        assert len({tuple(p) for p in pixels.reshape(-1, pixels.shape[2])[::97]}) > 3   # not a blank page


def test_compare_reports_ratios(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for path, scale in ((a, 1.0), (b, 2.0)):
        path.mkdir()
        (path / "results.json").write_text(json.dumps(sample(scale)))
    table = bench_report.compare(bench_report.load(a), bench_report.load(b))
    rows = {m: (x, y, r) for m, x, y, r in zip(*(c._cells for c in table.columns))}
    # measured latencies and bandwidths were scaled by 2 in B; the modelled p50s and loaded rows were not
    assert rows["idle_latency/cxl read ns"] == ("700.0", "1400.0", "2.00")
    assert rows["bandwidth/cxl seq read 1024B x1 MB/s"] == ("320.0", "640.0", "2.00")
    assert rows["loaded_latency/cxl delay 2000 latency ns"] == ("1200.0", "1200.0", "1.00")
    assert all(r == f"{float(y) / float(x):.2f}" for x, y, r in rows.values())
    from pfcxl.host_tools.cli.main import main
    capsys.readouterr()
    assert main(["bench", "compare", str(a), str(b)]) == 0
    assert "B / A" in capsys.readouterr().out
    with pytest.raises(PfcxlError, match="missing: no such file"):
        bench_report.load(tmp_path / "missing")


def test_suite_files_are_checked(tmp_path):
    assert [s.name for s in bench.load_suite("quick")][:2] == ["idle_latency/cxl", "idle_latency/local"]
    bad = tmp_path / "suite.json"
    bad.write_text('[{"name": "x"}]')
    with pytest.raises(PfcxlError, match="suite file"):
        bench.load_suite(str(bad))
    dup = tmp_path / "dup.json"
    dup.write_text(json.dumps([{"name": "x", "command": "true", "system": "local"}] * 2))
    with pytest.raises(PfcxlError, match="unique"):
        bench.load_suite(str(dup))
    with pytest.raises(PfcxlError, match="no suite 'nope'"):
        bench.load_suite("nope")


def test_modelled_rows_print_the_figures_results_json_holds():
    results = sample()
    runs = {r["name"]: r for r in results["results"]}
    systems = ("pf", "electrical", "dram")
    runs["bandwidth/cxl"]["modelled"] = {"rows": [
        {"load": 5.0, "offered_gbs": 128.0, **{s: {"gbs": 100.0 + 10 * i + k + 0.25} for k, s in enumerate(systems)}}
        for i in range(3)]}
    runs["loaded_latency/cxl"]["modelled"] = {"rows": [
        {"offered_gbs": g, **{s: {"latency_p50_ns": 300.0 + 100 * k + d, "chase_loads": 7 + d} for k, s in enumerate(systems)}}
        for g, d in ((128.0, 0), (0.032, 1))]}
    text = render(bench_report.tables(json.loads(json.dumps(results))))
    assert _row(text, "seq", "read", "64", last=True)[-3:] == ["110.2", "111.2", "112.2"]   # PF, electrical, DRAM GB/s
    assert _row(text, "2000", last=True)[-4:] == ["0.032", "301 (low-sample: 8 loads)", "401 (low-sample: 8 loads)",
                                                  "501 (low-sample: 8 loads)"]
    assert "modelled PF appliance (DDR5 path): chase p50 ns" in text
    # a run whose rows were not captured one by one says so instead
    runs["bandwidth/cxl"]["modelled"] = {}
    assert "lacks --mark-rows 1" in render(bench_report.tables(results))
