"""The PNG plots of `pfcxl bench` results: `figures(results)` decides what each plot shows (its
title, panels, axes and series: what the tests check), `plots()` draws them.

Measured figures are guest wall-clock under TCG (emulator time, tens of microseconds a load);
modelled ones come from the fabric models (hundreds of nanoseconds). They never share an axis:
a plot with both gives each its own panel, titled with where its figures come from.
"""

from __future__ import annotations

from pathlib import Path

from pfcxl.host_tools.timing import model_runs
from pfcxl.host_tools.bench import model as bench_model
from pfcxl.host_tools.bench.report import (DIRECT, IDLE_MODELLED, LOCAL, MEASURED, MODEL_KEYS, MODEL_SYSTEMS, _idle_topology,
                                           _rows_caption, _runs, low_sample, measured_idle)
from pfcxl.host_tools.timing.report import LABELS, QUANTILES, models

MEASURED_SOURCE = "measured in emulator (guest wall-clock under TCG, not a fabric figure)"
PERCENTILES = (("p50", "p50_ns"), ("p99", "p99_ns"), ("p99.9", "p999_ns"))


def _series(label: str, x, y, style: str = "line", color: int | None = None, variant: int = 0) -> dict:
    """style: line (a distribution's curve), joined (measured or modelled points, joined),
    points (separate markers, not joined), open (hollow markers, not joined: a figure of few samples),
    vline (one x at every y), hline (one y at every x). color: the series' colour number (a group's);
    variant: its line dashes and marker within the group."""
    out = {"label": label, "x": [float(v) for v in x], "y": [float(v) for v in y], "style": style, "variant": variant}
    return out if color is None else {**out, "color": color}


def _latency_cdf(results: dict) -> dict:
    runs = _runs(results)
    cxl = runs.get("idle_latency/cxl") or {}
    # the systems of the idle table's modelled columns, each labelled with the table's p50
    traced = [_series(f"{LABELS[key]} (traced chase; p50 {m['read']['p50']:.0f} ns)", m["quantiles_ns"],
                      [p / 100 for p in QUANTILES])
              for key in IDLE_MODELLED
              if (m := cxl.get("modelled", {}).get(key, {})).get("quantiles_ns") and m.get("read", {}).get("count")]
    if traced:
        modelled = {"title": "modelled: the traced chase replayed on each fabric", "series": traced}
    else:                           # no trace: the model's idle latency, one value per fabric
        topo = _idle_topology(results["environment"].get("topology", "pf-nic"))[0]
        modelled = {"title": "modelled idle latency (no trace: bench --timing trace gives distributions)",
                    "series": [_series(f"{LABELS[key]}: {m.idle_ns(False):.0f} ns", [m.idle_ns(False)], [0, 1], "vline")
                               for key, m in models(topo).items() if key in ("pf", "electrical")]}
    # the guest reports three percentiles and the mean, not a distribution: they are drawn as
    # what they are (latency by statistic), the mean as a line, each labelled as in the table
    measured, batch = [], 64
    for i, (name, label) in enumerate((("idle_latency/cxl", MEASURED), ("idle_latency/local", LOCAL),
                                       ("idle_latency/direct", DIRECT))):
        data = (runs.get(name) or {}).get("data") or {}
        if not data.get("read"):
            continue
        batch = data.get("batch", batch)
        mean, p50 = measured_idle(data, "read")
        measured.append(_series(f"{label}: p50 {p50:.0f}, p99 {data['read']['p99_ns']:.0f}, p99.9 "
                                f"{data['read']['p999_ns']:.0f} ns", range(len(PERCENTILES)),
                                [data["read"][k] for _, k in PERCENTILES], "points", color=i))
        measured.append(_series(f"{label}: mean {mean:.0f} ns", [0, len(PERCENTILES) - 1], [mean, mean], "hline",
                                color=i))
    panels = [{**modelled, "xlabel": "read latency (ns, modelled)", "ylabel": "fraction of loads at or below",
               "xlog": False, "ylim": (0, 1)}]
    if measured:
        panels.append({"title": f"{MEASURED_SOURCE}:\nthe guest's percentiles of {batch}-load batch means and its "
                       "mean (it reports no distribution)", "series": measured,
                       "xlabel": f"statistic of the {batch}-load batch means (emulator)",
                       "ylabel": "read latency (ns, emulator)", "xticks": [k for k, _ in PERCENTILES], "ylog": True})
    return {"title": "pointer-chase read latency: " + ("modelled distributions" if traced else "modelled idle latency")
            + (" and the emulator's percentiles and mean" if measured else ""), "panels": panels}


def _loaded_latency(results: dict) -> dict:
    runs = _runs(results)
    measured = [_series(label, [r["bandwidth_MBps"] for r in rows], [r["latency_ns"] for r in rows], "joined")
                for name, label in (("loaded_latency/cxl", MEASURED), ("loaded_latency/local", LOCAL),
                                    ("loaded_latency/direct", DIRECT))
                if (rows := ((runs.get(name) or {}).get("data") or {}).get("rows", []))]
    panels = [{"title": MEASURED_SOURCE, "series": measured, "xlabel": "traffic threads' bandwidth (MB/s, emulator)",
               "ylabel": "chase latency, mean (ns, emulator)", "xlog": True}] if measured else []
    loaded = runs.get("loaded_latency/cxl") or {}
    rows = loaded.get("modelled", {}).get("rows", [])
    modelled = []
    for k, system in enumerate(MODEL_SYSTEMS):
        figs = sorted((m["offered_gbs"], m[system]) for m in rows
                      if m.get(system, {}).get("latency_p50_ns") is not None and "offered_gbs" in m)
        # a low-sample p50 is drawn apart, unjoined and labelled with its count: no line runs through it
        pts = [(g, f["latency_p50_ns"]) for g, f in figs if not low_sample(f)]
        if pts:
            modelled.append(_series(LABELS[MODEL_KEYS[system]], [p[0] for p in pts], [p[1] for p in pts], "joined",
                                    color=k))
        for g, f in figs:
            if low_sample(f):
                modelled.append(_series(f"{LABELS[MODEL_KEYS[system]]}: low-sample ({f['chase_loads']} chase loads)",
                                        [g], [f["latency_p50_ns"]], "open", color=k))
    if modelled:
        panels.append({"title": "modelled: each row's captured stream replayed at its nominal load",
                       "series": modelled, "xlabel": "offered traffic (GB/s, nominal)",
                       "ylabel": "chase read p50 (ns, modelled)", "xlog": True})
    why = "" if modelled or not loaded else f" ({_rows_caption(loaded, '')})"
    return {"title": "loaded latency: " + ("measured and modelled" if modelled else "measured only") + why,
            "panels": panels}


def _by_size(label: str, rows: list[tuple[dict, float]], color: int) -> list[dict]:
    """One series per (pattern, op) of one-thread rows: (row, figure) pairs by transfer size; one
    colour for the system, a dash and marker per (pattern, op)."""
    out: list[dict] = []
    for key in sorted({(r["pattern"], r["op"]) for r, _ in rows if r["threads"] == 1}):
        pts = sorted((r["size"], v) for r, v in rows if (r["pattern"], r["op"]) == key and r["threads"] == 1)
        out.append(_series(f"{label} {key[0]} {key[1]}", [p[0] for p in pts], [p[1] for p in pts], "joined",
                           color=color, variant=len(out)))
    return out


def _bandwidth(results: dict) -> dict:
    runs, series = _runs(results), []
    for k, (name, label) in enumerate((("bandwidth/cxl", MEASURED), ("bandwidth/local", LOCAL),
                                       ("bandwidth/direct", DIRECT))):
        res = ((runs.get(name) or {}).get("data") or {}).get("results", [])
        series += _by_size(label, [(r, r["MBps"]) for r in res], k)
    panels = [{"title": MEASURED_SOURCE, "series": series, "xlabel": "transfer size (bytes)", "ylabel": "MB/s (emulator)",
               "xlog": True, "ylog": True}]
    cxl = runs.get("bandwidth/cxl") or {}
    res, rows = ((cxl.get("data") or {}).get("results", []), cxl.get("modelled", {}).get("rows", []))
    modelled = [s for k, system in enumerate(MODEL_SYSTEMS)
                for s in _by_size(LABELS[MODEL_KEYS[system]], [(r, m[system]["gbs"]) for r, m in zip(res, rows)
                                                                if m.get(system, {}).get("gbs") is not None], k)]
    if modelled:
        panels.append({"title": f"modelled: each row's captured stream offered at the host's "
                       f"{bench_model.HOST_LINK_GBS:g} GB/s link", "series": modelled,
                       "xlabel": "transfer size (bytes)", "ylabel": "GB/s carried (modelled)", "xlog": True,
                       "ylim": (0, None)})
    return {"title": "bandwidth by transfer size, one thread: " + ("measured and modelled" if modelled else "measured only"),
            "panels": panels}


def figures(results: dict) -> dict[str, dict]:
    """File name -> {title, panels: [{title, xlabel, ylabel, xlog, ylog, ylim, series}]}."""
    return {"latency_cdf.png": _latency_cdf(results), "loaded_latency.png": _loaded_latency(results),
            "bandwidth.png": _bandwidth(results)}


def _draw(fig_spec: dict, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from pfcxl.host_tools.timing.model_runs import log_limits

    panels = [p for p in fig_spec["panels"] if p["series"]] or [{"title": "no data", "series": [], "xlabel": "",
                                                                  "ylabel": ""}]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for ax, panel in zip(axes[0], panels):
        for i, s in enumerate(panel["series"]):
            color = f"C{s.get('color', i)}"
            if s["style"] == "vline":
                ax.axvline(s["x"][0], label=s["label"], color=color)
            elif s["style"] == "hline":
                ax.axhline(s["y"][0], label=s["label"], color=color, linestyle="--")
            elif s["style"] == "open":
                ax.plot(s["x"], s["y"], "o", label=s["label"], markersize=8, color=color, markerfacecolor="none")
            else:
                v = s.get("variant", 0) % 4
                ax.plot(s["x"], s["y"], {"points": "o", "joined": "os^D"[v] + ("-", "--", ":", "-.")[v]}.get(s["style"], "-"),
                        label=s["label"], markersize=6 if s["style"] == "points" else 4, color=color)
        for axis, log in ((ax.xaxis, panel.get("xlog")), (ax.yaxis, panel.get("ylog"))):
            if log:          # ticks at 1 (2, 5) x 10^n, written as plain numbers (not 6x10^2)
                (ax.set_xscale if axis is ax.xaxis else ax.set_yscale)("log")
                values = [v for s in panel["series"] for v in (s["x"] if axis is ax.xaxis else s["y"]) if v > 0]
                lo, hi, subs = log_limits(min(values), max(values))
                (ax.set_xlim if axis is ax.xaxis else ax.set_ylim)(lo, hi)    # a tick at each end
                axis.set_major_locator(LogLocator(subs=subs))
                axis.set_minor_formatter(NullFormatter())
            axis.set_major_formatter(plain)
        if panel.get("xticks"):
            ax.set_xticks(range(len(panel["xticks"])), panel["xticks"])
            ax.set_xlim(-0.5, len(panel["xticks"]) - 0.5)
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

