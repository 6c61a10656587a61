"""What the bench plots show (bench_plots.figures) and how they read: a modelled series exists
exactly when the results hold modelled figures, every title says what its plot holds, measured
percentiles are not drawn as a curve, emulator and model never share an axis; `model curve`'s
legend covers no curve and its ticks are plain numbers. Tables give their units."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from rich.console import Console

from pfcxl.device.fabric import engine as fe
from pfcxl.device.fabric import model as fabric_model
from pfcxl.device import topology
from pfcxl.host_tools.bench import model as bench_model
from pfcxl.host_tools.bench import plots as bench_plots
from pfcxl.host_tools.bench import report as bench_report
from pfcxl.host_tools.timing import model_runs
from pfcxl.host_tools.timing import report as timing_report
from pfcxl.host_tools.cli import main as cli_main

from .test_bench_report import _row, sample
from .test_bench_report import render as render_all

COLUMNS = ("pf", "electrical", "dram")

pytestmark = pytest.mark.unit


def with_trace_and_rows(traced: bool, rows: bool) -> dict:
    results = copy.deepcopy(sample(modelled=traced))
    runs = {r["name"]: r for r in results["results"]}
    if traced:
        for key, lo in (("pf", 283.0), ("electrical", 833.0)):
            runs["idle_latency/cxl"]["modelled"][key]["quantiles_ns"] = [lo + i for i in range(103)]
    runs["loaded_latency/cxl"]["data"]["delay_unit"] = "ns"
    if rows:
        runs["loaded_latency/cxl"]["modelled"] = {"rows": [
            {"offered_gbs": g, **{s: {"latency_p50_ns": 300.0 + 100 * k + g, "chase_loads": 500} for k, s in enumerate(COLUMNS)}}
            for g in (128.0, 0.032)]}
    return results


def labels(panel: dict) -> list[str]:
    return [s["label"] for s in panel["series"]]


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("rows", [False, True])
def test_modelled_series_exist_exactly_when_the_results_hold_them_and_titles_say_so(traced, rows):
    figs = bench_plots.figures(with_trace_and_rows(traced, rows))
    for name, fig in figs.items():
        for panel in fig["panels"]:
            modelled_panel = panel["title"].startswith("modelled")
            assert modelled_panel != panel["title"].startswith("measured"), (name, panel["title"])
            # a panel is the model's or the emulator's: its axes say which, and its series agree
            axes = panel["xlabel"] + " " + panel["ylabel"]
            assert ("modelled" in axes) == modelled_panel != ("emulator" in axes), (name, axes)
            assert all(("measured" in label or "local DRAM (measured" in label) != modelled_panel
                       for label in labels(panel)), (name, labels(panel))
    cdf = figs["latency_cdf.png"]
    modelled = cdf["panels"][0]
    if traced:      # the traced distributions, titled as such
        assert "modelled distributions" in cdf["title"]
        assert labels(modelled) == [f"{timing_report.LABELS[k]} (traced chase; p50 {p} ns)"
                                    for k, p in (("pf", 283), ("electrical", 833))]
        assert all(s["style"] == "line" and len(s["x"]) == len(timing_report.QUANTILES) for s in modelled["series"])
    else:           # no trace: no distribution is claimed, the idle model is marked
        assert "distribution" not in cdf["title"] and "idle" in cdf["title"] and "no trace" in modelled["title"]
        assert [s["x"][0] for s in modelled["series"]] == [fabric_model.idle_ns("pf", False),
                                                           fabric_model.idle_ns("electrical", False)]
        assert all(s["style"] == "vline" for s in modelled["series"])
    # three percentiles are points by statistic, not a curve on a fraction axis; the mean a line
    measured = cdf["panels"][1]
    assert measured["xticks"] == ["p50", "p99", "p99.9"] and "ylim" not in measured
    assert [s["style"] for s in measured["series"]] == ["points", "hline"] * 2
    assert all(s["y"] == [690.0, 900.0, 1200.0] for s in measured["series"][0::2])
    assert all(s["y"] == [700.0, 700.0] for s in measured["series"][1::2])
    loaded = figs["loaded_latency.png"]
    titles = [p["title"] for p in loaded["panels"]]
    assert any(t.startswith("measured") for t in titles) and loaded["panels"][0]["xlog"]
    if rows:
        (panel,) = [p for p in loaded["panels"] if p["title"].startswith("modelled")]
        assert labels(panel) == [timing_report.LABELS[model_runs.REPORT_KEYS[s]] for s in COLUMNS]
        assert all(s["x"] == [0.032, 128.0] for s in panel["series"])
        assert "measured and modelled" in loaded["title"]
    else:
        assert not any(t.startswith("modelled") for t in titles)
        assert "measured only" in loaded["title"] and "no modelled columns" in loaded["title"]


def test_the_plots_are_drawn_as_pngs(tmp_path):
    written = bench_plots.plots(with_trace_and_rows(True, True), tmp_path)
    assert sorted(p.name for p in written) == ["bandwidth.png", "latency_cdf.png", "loaded_latency.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)


def test_model_curve_legend_covers_no_curve_and_its_ticks_are_plain_numbers():
    knee = {"load": 0.5, "offered_gbs": 12.8, "achieved_gbs": 12.0, "p50_ns": 5000.0}
    points = [{"load": x / 10, "offered_gbs": x * 2.56, "achieved_gbs": x * 2.5, "p50_ns": 300.0 * (1 + x * x)}
              for x in range(1, 12)]
    report = {s: {"label": timing_report.LABELS[model_runs.REPORT_KEYS[s]], "points": points,
                  "knee": knee if s != "dram" else None} for s in COLUMNS}
    fig = model_runs.curve_figure(report)
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        report[s]["label"] + (" (knee at 13 GB/s offered)" if s != "dram" else " (no knee)") for s in COLUMNS]
    box, axes_box = legend.get_window_extent(), ax.get_window_extent()
    assert box.y1 <= axes_box.y0           # below the axes: over no curve
    ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert ticks and all(t.replace(".", "").isdigit() for t in ticks), ticks
    import matplotlib.pyplot as plt
    plt.close(fig)


def render(table) -> str:
    console = Console(width=400, record=True)
    console.print(table)
    return console.export_text()


def test_tables_give_the_delay_unit_and_say_what_the_emulator_column_measures():
    text = "".join(render(t) for t in bench_report.tables(with_trace_and_rows(True, True)))
    assert "delay (ns)" in text and "│ delay " not in text
    report = {"requests": 3, "reads": 2, "writes": 1, "emulator": {"ns_per_request": 30412.0}}
    text = " ".join(render(timing_report.table(report, "t")).split())
    assert "30412 ns wall / request" in text
    assert "the whole command's host wall-clock over its CXL requests" in text and "not a per-load latency" in text


def test_the_idle_table_and_latency_cdf_name_the_same_statistics_and_systems():
    results = with_trace_and_rows(True, True)
    cxl = next(r for r in results["results"] if r["name"] == "idle_latency/cxl")
    # the results also hold PF + HBM3E and local-model quantiles: no table shows them, no plot either
    for key in ("pf_hbm", "local"):
        cxl["modelled"][key] = {"read": {"count": 9, "p50": 222.0}, "quantiles_ns": [222.0] * 103}
    table = bench_report.tables(results)[0]
    text = render(table)
    headers = [c.header for c in table.columns]
    assert headers[2:4] == [timing_report.LABELS[k] for k in bench_report.IDLE_MODELLED]
    assert "mean 700 / p50 690 ns" in text and "p50 283 ns (traced)" in text
    assert "mean = the measured laps' time / loads" in " ".join(text.split())
    cdf = bench_plots.figures(results)["latency_cdf.png"]
    modelled, measured = cdf["panels"]
    assert labels(modelled) == [f"{timing_report.LABELS[k]} (traced chase; p50 {p} ns)"
                                for k, p in (("pf", 283), ("electrical", 833))]
    assert not any("HBM3E" in label for label in labels(modelled))
    # the plot's measured p50 and mean are the table's figures, labelled as such
    assert labels(measured)[:2] == [f"{bench_report.MEASURED}: p50 690, p99 900, p99.9 1200 ns",
                                    f"{bench_report.MEASURED}: mean 700 ns"]
    assert measured["series"][0]["y"][0] == 690.0 and measured["series"][1]["y"] == [700.0, 700.0]
    assert "no distribution" in measured["title"] and "fraction" not in measured["ylabel"]


def _loaded(counts: list[int]) -> dict:
    results = with_trace_and_rows(True, True)
    loaded = next(r for r in results["results"] if r["name"] == "loaded_latency/cxl")
    loaded["data"]["rows"].append({"delay": 20000, "bandwidth_MBps": 0.5, "latency_ns": 1100.0})
    loaded["modelled"] = {"rows": [
        {"offered_gbs": g, **{s: {"latency_p50_ns": 300.0 + 100 * k + g, "chase_loads": n} for k, s in enumerate(COLUMNS)}}
        for g, n in zip((128.0, 0.032, 0.0032), counts)]}
    return results


def test_a_low_sample_loaded_cell_is_marked_with_its_count_and_drawn_apart_unjoined():
    low = bench_report.MIN_CHASE_LOADS - 1
    results = _loaded([3, low + 1, 65536])
    text = render_all(bench_report.tables(results))
    assert _row(text, "0", last=True)[-3:] == ["428 (low-sample: 3 loads)", "528 (low-sample: 3 loads)",
                                               "628 (low-sample: 3 loads)"]
    assert _row(text, "2000", last=True)[-3] == f"300 ({low + 1} loads)"       # enough: not marked
    assert f"low-sample: fewer than {bench_report.MIN_CHASE_LOADS} chase loads" in " ".join(text.split())
    (panel,) = [p for p in bench_plots.figures(results)["loaded_latency.png"]["panels"]
                if p["title"].startswith("modelled")]
    for k, s in enumerate(COLUMNS):
        label = timing_report.LABELS[model_runs.REPORT_KEYS[s]]
        (line,) = [x for x in panel["series"] if x["label"] == label]
        (apart,) = [x for x in panel["series"] if x["label"] == f"{label}: low-sample (3 chase loads)"]
        assert line["style"] == "joined" and line["x"] == [0.0032, 0.032]     # no line through the 3-load point
        assert apart["style"] == "open" and (apart["x"], apart["y"]) == ([128.0], [428.0 + 100 * k])
        assert line["color"] == apart["color"] == k
    # with enough loads everywhere, nothing is marked and one joined line per system remains
    results = _loaded([low + 1] * 3)
    assert "low-sample" not in render_all(bench_report.tables(results))
    (panel,) = [p for p in bench_plots.figures(results)["loaded_latency.png"]["panels"]
                if p["title"].startswith("modelled")]
    assert [x["style"] for x in panel["series"]] == ["joined"] * 3


def test_bandwidth_png_plots_the_modelled_bandwidth_of_every_row():
    results = with_trace_and_rows(True, True)
    bw = next(r for r in results["results"] if r["name"] == "bandwidth/cxl")
    bw["modelled"] = {"rows": [{"load": 5.0, "offered_gbs": 128.0,
                                **{s: {"gbs": 120.0 - 30 * k + i} for k, s in enumerate(COLUMNS)}} for i in range(3)]}
    fig = bench_plots.figures(results)["bandwidth.png"]
    assert "measured and modelled" in fig["title"]
    (panel,) = [p for p in fig["panels"] if p["title"].startswith("modelled")]
    assert "128 GB/s" in panel["title"] and panel["ylabel"] == "GB/s carried (modelled)"
    assert labels(panel) == [f"{timing_report.LABELS[model_runs.REPORT_KEYS[s]]} seq read" for s in COLUMNS]
    for k, s in enumerate(panel["series"]):          # sizes 32, 64, 1024: the rows' own figures
        assert s["x"] == [32.0, 64.0, 1024.0] and s["y"] == [120.0 - 30 * k + i for i in range(3)]
    # without modelled rows the plot says it is measured only
    bw["modelled"] = {}
    fig = bench_plots.figures(results)["bandwidth.png"]
    assert "measured only" in fig["title"] and len(fig["panels"]) == 1


@pytest.mark.parametrize("lo, hi, ticks", [(283.0, 833.0, [200.0, 1000.0]), (100.0, 44000.0, [100.0, 100000.0]),
                                           (6.0, 9.5, [5.0, 10.0])])
def test_log_axes_have_a_tick_at_or_beyond_each_end_of_the_data(lo, hi, ticks):
    bottom, top, subs = model_runs.log_limits(lo, hi)
    assert bottom < lo and top > hi
    assert [bottom * model_runs.LOG_PAD, top / model_runs.LOG_PAD] == pytest.approx(ticks)
    assert subs == ((1, 2, 5) if ticks[1] / ticks[0] < 300 else (1,))


def _curve(hosts: int, p50s: list[float]) -> dict:
    points = [{"load": i, "offered_gbs": i * 25.6, "achieved_gbs": i * 25.0, "p50_ns": p} for i, p in enumerate(p50s, 1)]
    return {s: {"label": timing_report.LABELS[model_runs.REPORT_KEYS[s]], "points": points, "knee": None, "hosts": hosts}
            for s in COLUMNS}


def test_the_curve_names_its_hosts_and_its_latency_axis_spans_the_data():
    one = model_runs.curve_axes(_curve(1, [283.0, 290.0, 833.0]))
    assert one["xlabel"] == "achieved bandwidth, one host (GB/s, modelled)"
    assert one["ylim"][1] / model_runs.LOG_PAD == pytest.approx(1000.0)       # above the 833 ns point
    assert model_runs.curve_axes(_curve(16, [283.0]))["xlabel"] == "achieved bandwidth, all 16 hosts (GB/s, modelled)"
    assert model_runs.curve_axes({s: {k: v for k, v in c.items() if k != "hosts"}
                                  for s, c in _curve(1, [283.0]).items()})["xlabel"] == "achieved bandwidth (GB/s, modelled)"


def test_curve_report_counts_the_traces_hosts():
    topo = topology.load(topology.resolve("pf-nic"))
    base, _ = model_runs.window(topo)
    tr = np.zeros(2000, fe.trace_dtype())
    tr["hpa"] = base + (np.arange(2000) % 512) * 64
    tr["size"] = 64
    tr["insn"] = np.arange(2000) * 10
    report = model_runs.curve_report(tr, topo, [0.5])
    assert {s["hosts"] for s in report.values()} == {1}


def test_model_curve_loads_go_past_the_host_link_so_the_knees_show():
    args = cli_main.parser().parse_args(["model", "curve", "trace.npy"])
    assert args.loads == model_runs.CURVE_LOADS == bench_model.CURVE_LOADS
    assert max(args.loads) > bench_model.HOST_LINK_LOAD          # past 5 PF ports: the PF knee is inside
    assert min(args.loads) < 1.0
