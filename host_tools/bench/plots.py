"""The PNG plots of `pfcxl bench` results: `figures(results)` decides what each plot shows (its
title, panels, axes and series: what the tests check), `plots()` draws them.

Measured figures are guest wall-clock under TCG (emulator time, tens of microseconds a load);
modelled ones come from the fabric models (hundreds of nanoseconds). They never share an axis:
a plot with both gives each its own panel, titled with where its figures come from.
"""

from __future__ import annotations

from pathlib import Path

from pfcxl.host_tools.timing import model_runs
from pfcxl.host_tools.bench.report import DIRECT, LOCAL, MEASURED, MODEL_KEYS, MODEL_SYSTEMS, _idle_topology, _rows_caption, _runs
from pfcxl.host_tools.timing.report import LABELS, QUANTILES, models

MEASURED_SOURCE = "measured in emulator (guest wall-clock under TCG, not a fabric figure)"
PERCENTILES = ((0.5, "p50_ns"), (0.99, "p99_ns"), (0.999, "p999_ns"))


def _series(label: str, x, y, style: str = "line") -> dict:
    """style: line (a distribution's curve), joined (measured or modelled points, joined),
    points (separate markers, not joined), vline (one x at every y)."""
    return {"label": label, "x": [float(v) for v in x], "y": [float(v) for v in y], "style": style}


def _latency_cdf(results: dict) -> dict:
    runs = _runs(results)
    cxl = runs.get("idle_latency/cxl") or {}
    traced = [_series(f"{LABELS[key]} (traced chase)", q, [p / 100 for p in QUANTILES])
              for key in ("pf", "pf_hbm", "electrical", "local")
              if (q := cxl.get("modelled", {}).get(key, {}).get("quantiles_ns"))]
    if traced:
        modelled = {"title": "modelled: the traced chase replayed on each fabric", "series": traced}
    else:                           # no trace: the model's idle latency, one value per fabric
        topo = _idle_topology(results["environment"].get("topology", "pf-nic"))[0]
        modelled = {"title": "modelled idle latency (no trace: bench --timing trace gives distributions)",
                    "series": [_series(f"{LABELS[key]}: {m.idle_ns(False):.0f} ns", [m.idle_ns(False)], [0, 1], "vline")
                               for key, m in models(topo).items() if key in ("pf", "electrical")]}
    measured = [_series(f"{label}: p50, p99, p99.9", [d[k] for _, k in PERCENTILES], [q for q, _ in PERCENTILES],
                        "points")
                for name, label in (("idle_latency/cxl", MEASURED), ("idle_latency/local", LOCAL),
                                    ("idle_latency/direct", DIRECT))
                if (d := ((runs.get(name) or {}).get("data") or {}).get("read"))]
    panels = [{**modelled, "xlabel": "read latency (ns, modelled)", "ylabel": "fraction of loads at or below",
               "xlog": False, "ylim": (0, 1)}]
    if measured:
        panels.append({"title": MEASURED_SOURCE, "series": measured, "xlabel": "read latency (ns, emulator)",
                       "ylabel": "fraction of loads at or below", "xlog": True, "ylim": (0, 1)})
    return {"title": "pointer-chase read latency: " + ("modelled distributions" if traced else "modelled idle latency")
            + (" and the emulator's percentiles" if measured else ""), "panels": panels}


def _loaded_latency(results: dict) -> dict:
    runs = _runs(results)
    measured = [_series(label, [r["bandwidth_MBps"] for r in rows], [r["latency_ns"] for r in rows], "joined")
                for name, label in (("loaded_latency/cxl", MEASURED), ("loaded_latency/local", LOCAL),
                                    ("loaded_latency/direct", DIRECT))
                if (rows := ((runs.get(name) or {}).get("data") or {}).get("rows", []))]
    panels = [{"title": MEASURED_SOURCE, "series": measured, "xlabel": "traffic threads' bandwidth (MB/s, emulator)",
               "ylabel": "chase latency (ns, emulator)", "xlog": True}] if measured else []
    loaded = runs.get("loaded_latency/cxl") or {}
    rows = loaded.get("modelled", {}).get("rows", [])
    modelled = []
    for system in MODEL_SYSTEMS:
        pts = [(m["offered_gbs"], m[system]["latency_p50_ns"]) for m in rows
               if m.get(system, {}).get("latency_p50_ns") is not None and "offered_gbs" in m]
        if pts:
            pts.sort()
            modelled.append(_series(LABELS[MODEL_KEYS[system]], [p[0] for p in pts], [p[1] for p in pts], "joined"))
    if modelled:
        panels.append({"title": "modelled: each row's captured stream replayed at its nominal load",
                       "series": modelled, "xlabel": "offered traffic (GB/s, nominal)",
                       "ylabel": "chase read p50 (ns, modelled)", "xlog": True})
    why = "" if modelled or not loaded else f" ({_rows_caption(loaded, '')})"
    return {"title": "loaded latency: " + ("measured and modelled" if modelled else "measured only") + why,
            "panels": panels}


def _bandwidth(results: dict) -> dict:
    runs, series = _runs(results), []
    for name, label in (("bandwidth/cxl", MEASURED), ("bandwidth/local", LOCAL), ("bandwidth/direct", DIRECT)):
        res = ((runs.get(name) or {}).get("data") or {}).get("results", [])
        for key in sorted({(r["pattern"], r["op"]) for r in res if r["threads"] == 1}):
            pts = sorted((r["size"], r["MBps"]) for r in res if (r["pattern"], r["op"]) == key and r["threads"] == 1)
            series.append(_series(f"{label} {key[0]} {key[1]}", [p[0] for p in pts], [p[1] for p in pts], "joined"))
    return {"title": "bandwidth by transfer size, one thread", "panels": [
        {"title": MEASURED_SOURCE, "series": series, "xlabel": "transfer size (bytes)", "ylabel": "MB/s (emulator)",
         "xlog": True, "ylog": True}]}


def figures(results: dict) -> dict[str, dict]:
    """File name -> {title, panels: [{title, xlabel, ylabel, xlog, ylog, ylim, series}]}."""
    return {"latency_cdf.png": _latency_cdf(results), "loaded_latency.png": _loaded_latency(results),
            "bandwidth.png": _bandwidth(results)}


def _draw(fig_spec: dict, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    panels = [p for p in fig_spec["panels"] if p["series"]] or [{"title": "no data", "series": [], "xlabel": "",
                                                                  "ylabel": ""}]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for ax, panel in zip(axes[0], panels):
        for i, s in enumerate(panel["series"]):
            if s["style"] == "vline":
                ax.axvline(s["x"][0], label=s["label"], color=f"C{i}")
            else:
                ax.plot(s["x"], s["y"], {"points": "o", "joined": "o-"}.get(s["style"], "-"), label=s["label"],
                        markersize=4)
        for axis, log in ((ax.xaxis, panel.get("xlog")), (ax.yaxis, panel.get("ylog"))):
            if log:          # ticks at 1 (2, 5) x 10^n, written as plain numbers (not 6x10^2)
                (ax.set_xscale if axis is ax.xaxis else ax.set_yscale)("log")
                lo, hi = ax.get_xlim() if axis is ax.xaxis else ax.get_ylim()
                axis.set_major_locator(LogLocator(subs=(1, 2, 5) if hi / lo < 300 else (1,)))
                axis.set_minor_formatter(NullFormatter())
            axis.set_major_formatter(plain)
        if panel.get("ylim"):
            ax.set_ylim(*panel["ylim"])
        ax.set_title(panel["title"], fontsize=9)
        ax.set_xlabel(panel["xlabel"])
        ax.set_ylabel(panel["ylabel"])
        ax.grid(alpha=0.3)
        if panel["series"]:
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1, frameon=False)
    fig.suptitle(fig_spec["title"], fontsize=10)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plots(results: dict, out_dir: Path) -> list[Path]:
    written = [_draw(spec, out_dir / name) for name, spec in figures(results).items()]
    curve = (_runs(results).get("bandwidth/cxl") or {}).get("modelled", {}).get("curve")
    if curve:                 # `pfcxl model curve` of the bandwidth run's read rows
        model_runs.save_curve(curve, out_dir / "latency_bandwidth.png")
        written.append(out_dir / "latency_bandwidth.png")
    return written

