"""What the bench plots show (bench_plots.figures) and how they read: a modelled series exists
exactly when the results hold modelled figures, every title says what its plot holds, measured
percentiles are not drawn as a curve, emulator and model never share an axis; `model curve`'s
legend covers no curve and its ticks are plain numbers. Tables give their units."""

from __future__ import annotations

import copy

import pytest
from rich.console import Console

from pfcxl.device.fabric import model as fabric_model
from pfcxl.host_tools.bench import plots as bench_plots
from pfcxl.host_tools.bench import report as bench_report
from pfcxl.host_tools.timing import model_runs
from pfcxl.host_tools.timing import report as timing_report

from .test_bench_report import sample

SYSTEMS = ("pf", "electrical", "dram")

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
            {"offered_gbs": g, **{s: {"latency_p50_ns": 300.0 + 100 * k + g, "chase_loads": 7} for k, s in enumerate(SYSTEMS)}}
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
        assert labels(modelled) == [f"{timing_report.LABELS[k]} (traced chase)" for k in ("pf", "electrical")]
        assert all(s["style"] == "line" and len(s["x"]) == len(timing_report.QUANTILES) for s in modelled["series"])
    else:           # no trace: no distribution is claimed, the idle model is marked
        assert "distribution" not in cdf["title"] and "idle" in cdf["title"] and "no trace" in modelled["title"]
        assert [s["x"][0] for s in modelled["series"]] == [fabric_model.idle_ns("pf", False),
                                                           fabric_model.idle_ns("electrical", False)]
        assert all(s["style"] == "vline" for s in modelled["series"])
    measured = cdf["panels"][1]     # three percentiles are points on a 0..1 axis, not a curve
    assert measured["ylim"] == (0, 1) and all(s["style"] == "points" and s["y"] == [0.5, 0.99, 0.999]
                                              for s in measured["series"])
    loaded = figs["loaded_latency.png"]
    titles = [p["title"] for p in loaded["panels"]]
    assert any(t.startswith("measured") for t in titles) and loaded["panels"][0]["xlog"]
    if rows:
        (panel,) = [p for p in loaded["panels"] if p["title"].startswith("modelled")]
        assert labels(panel) == [timing_report.LABELS[model_runs.SYSTEMS[s]] for s in SYSTEMS]
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
    report = {s: {"label": timing_report.LABELS[model_runs.SYSTEMS[s]], "points": points,
                  "knee": knee if s != "dram" else None} for s in SYSTEMS}
    fig = model_runs.curve_figure(report)
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        report[s]["label"] + (" (knee at 13 GB/s offered)" if s != "dram" else " (no knee)") for s in SYSTEMS]
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
