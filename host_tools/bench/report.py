"""Tables, plots and comparisons of `pfcxl bench` results (results/<timestamp>/results.json).

Every table carries the same labelled columns: measured in emulator (guest wall-clock under
TCG: emulator overhead, not fabric latency), modelled PF appliance, modelled electrical switch
pool, and local DRAM (measured in the same emulator, for scale). A run on the direct path
(`--data-path direct|both`) adds a column measured on the direct device, the same bytes as
guest RAM.
"""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from pfcxl.errors import PfcxlError

from pfcxl.host_tools.bench import model as bench_model
from pfcxl.host_tools.bench import results as bench_results
from pfcxl.host_tools.timing import model_runs
from pfcxl.host_tools.timing.report import LABELS, modelled_system, models

MEASURED = "measured in emulator (CXL)"
LOCAL = "local DRAM (measured in emulator)"
DIRECT = "direct device (measured in emulator)"
PF, EL = LABELS["pf"], LABELS["electrical"]
MODEL_SYSTEMS = bench_model.BENCH_COLUMNS                   # the modelled columns: pf, electrical, dram
MODEL_KEYS = model_runs.REPORT_KEYS                        # -> timing_report's keys and LABELS
IDLE_MODELLED = ("pf", "electrical")                   # the idle table's modelled columns (and latency_cdf.png's)
# A loaded row's modelled chase p50 rests on the chase loads issued while the captured traffic ran:
# at full rate that traffic replays in microseconds, so a row may have only a few (3-30 seen, and
# the p50 of two identical runs 1,716 against 2,557 ns). Below this many the cell says low-sample.
MIN_CHASE_LOADS = 200
IDLE_CAPTION = ("measured: mean = the measured laps' time / loads; p50 = the median of the guest's {batch}-load "
                "batch means (idle_latency --batch). modelled: the p50 of the traced chase replayed")
LOADED_CAPTION = ("modelled columns: each row's captured stream replayed: its traffic at the nominal rate "
                  f"(threads x 64 B per delay, delay 0 = the host's {bench_model.HOST_LINK_GBS:g} GB/s link), its chase dependent "
                  "beside it; chase read p50 while the traffic ran")
BANDWIDTH_CAPTION = (f"modelled columns: each row's captured stream replayed offering the host's {bench_model.HOST_LINK_GBS:g} GB/s link "
                     "(the benchmark streams as fast as it can): the bandwidth each system carries")


def load(path: str | Path) -> dict:
    """A bench results.json (or its folder), checked for what the tables and comparisons read."""
    return bench_results.check(bench_results.load(path), str(path), systems=MODEL_SYSTEMS, traced=("pf", "electrical"))


def _runs(results: dict) -> dict[str, dict]:
    return {r["name"]: r for r in results["results"]}


def _modelled(run: dict | None, key: str, op: str) -> str:
    if run and run.get("modelled", {}).get(key, {}).get(op, {}).get("count"):
        return f"p50 {run['modelled'][key][op]['p50']:.0f} ns (traced)"
    return "-"


def measured_idle(d: dict, op: str) -> tuple[float, float]:
    """A measured idle run's (mean, p50) ns for `op`: what the table and latency_cdf.png show."""
    per = "ns_per_load" if op == "read" else "ns_per_store"
    return d[op][per], d[op]["p50_ns"]


def _idle_topology(topo_name: str):
    """The topology the idle model is taken from, and a note when it is not the one that ran."""
    from pfcxl.device import topology
    try:
        return topology.load(topology.resolve(topo_name)), ""
    except PfcxlError:
        return (topology.load(topology.resolve("pf-appliance")),
                f"; topology '{topo_name}' of these results is not at hand, so the idle model is pf-appliance's")


def _idle(topo_name: str, key: str, op: str) -> str:
    """The model's idle latency when no trace was taken (the figures the paper quotes)."""
    model = models(_idle_topology(topo_name)[0])[key]
    return f"{model.idle_ns(op == 'write'):.0f} ns (idle model)"


def _modelled_caption(run: dict | None, topo_name: str) -> str:
    if run and run.get("modelled", {}).get("modelled_system"):
        return f"modelled system: {run['modelled']['modelled_system']}"
    topo, note = _idle_topology(topo_name)
    return f"modelled system: {modelled_system(topo)}{note}"


def low_sample(fig: dict) -> bool:
    """Whether a modelled loaded row's chase p50 rests on fewer than MIN_CHASE_LOADS loads."""
    return fig.get("latency_p50_ns") is not None and fig.get("chase_loads", 0) < MIN_CHASE_LOADS


def _chase(fig: dict) -> str:
    """A modelled chase p50 and how many chase loads it is of (few under full traffic: the
    captured traffic replays in microseconds), marked low-sample below MIN_CHASE_LOADS."""
    if fig.get("latency_p50_ns") is None:
        return "-"
    return f"{fig['latency_p50_ns']:.0f} ({'low-sample: ' if low_sample(fig) else ''}{fig['chase_loads']} loads)"


def _rows_caption(run: dict, what: str) -> str | None:
    if not run:
        return None
    m = run.get("modelled", {})
    if m.get("rows_error"):
        return f"no modelled columns: {m['rows_error']}"
    if not m.get("rows"):
        return ("no modelled columns: the CXL run's rows were not captured one by one "
                "(the suite's command lacks --mark-rows 1)")
    return what


def _delay(run: dict) -> str:
    """The loaded-latency delay column, in the unit the run gives (bench_schema.md: TSC cycles or ns)."""
    unit = (run.get("data") or {}).get("delay_unit")
    return f"delay ({'TSC cycles' if unit == 'cycles' else unit})" if unit else "delay"


def _loaded_modelled(run: dict) -> Table:
    """The CXL loaded-latency rows, each row's captured stream replayed at its nominal load."""
    t = Table(title="loaded latency, modelled (each row's captured stream replayed at its nominal load)",
              title_justify="left")
    for col in (_delay(run), "offered GB/s (nominal)", *(f"{LABELS[MODEL_KEYS[s]]}: chase p50 ns" for s in MODEL_SYSTEMS)):
        t.add_column(col, justify="right")
    modelled = run.get("modelled", {}).get("rows", [])
    for i, row in enumerate(run["data"]["rows"]):
        m = modelled[i] if i < len(modelled) else {}
        t.add_row(str(row["delay"]), f"{m['offered_gbs']:.3g}" if "offered_gbs" in m else m.get("error", "-"),
                  *(_chase(m.get(s, {})) for s in MODEL_SYSTEMS))
    caption = _rows_caption(run, LOADED_CAPTION) or ""
    if any(low_sample(m.get(s, {})) for m in modelled for s in MODEL_SYSTEMS):
        caption += (f"; low-sample: fewer than {MIN_CHASE_LOADS} chase loads ran beside the traffic, so that "
                      "p50 varies from run to run (loaded_latency.png draws it apart, unjoined)")
    t.caption = caption
    return t


def _bandwidth_modelled(run: dict) -> Table:
    """The CXL bandwidth rows, each row's captured stream offered at the host link's rate."""
    t = Table(title="bandwidth by transfer size, modelled (each row's captured stream replayed)", title_justify="left")
    for col in ("pattern", "op", "size", "threads", *(f"{LABELS[MODEL_KEYS[s]]} GB/s" for s in MODEL_SYSTEMS)):
        t.add_column(col, justify="right")
    modelled = run.get("modelled", {}).get("rows", [])
    for i, r in enumerate(run["data"]["results"]):
        m = modelled[i] if i < len(modelled) else {}
        t.add_row(r["pattern"], r["op"], str(r["size"]), str(r["threads"]),
                  *(f"{m[s]['gbs']:.1f}" if s in m else "-" for s in MODEL_SYSTEMS))
    t.caption = _rows_caption(run, BANDWIDTH_CAPTION)
    return t


def _curve_table(curve: dict) -> Table:
    t = Table(title="modelled latency against bandwidth (the bandwidth run's captured read rows, replayed; "
              "latency_bandwidth.png)", title_justify="left")
    for col in ("system", "read p50 ns at the lowest load", "most carried GB/s", "knee: offered GB/s",
                "knee: carried GB/s", "knee: read p50 ns"):
        t.add_column(col, justify="right" if col != "system" else "left")
    for system in curve.values():
        pts, k = system["points"], system["knee"]
        t.add_row(system["label"], f"{pts[0]['p50_ns']:.0f}", f"{max(p['achieved_gbs'] for p in pts):.1f}",
                  *((f"{k['offered_gbs']:.1f}", f"{k['achieved_gbs']:.1f}", f"{k['p50_ns']:.0f}") if k
                    else ("none: carried every load", "-", "-")))
    t.caption = (f"offered load per host up to past its {bench_model.HOST_LINK_GBS:g} GB/s link; the knee is the first load a system "
                 "no longer carries (achieved below 95% of offered)")
    return t


def tables(results: dict) -> list[Table]:
    runs, env = _runs(results), results["environment"]
    out = []
    direct_runs = any(name.endswith("/direct") for name in runs)
    t = Table(title="idle latency (pointer chase, 64 B lines)", title_justify="left")
    for col in ("", MEASURED, *(LABELS[k] for k in IDLE_MODELLED), LOCAL) + ((DIRECT,) if direct_runs else ()):
        t.add_column(col, justify="right")
    cxl, local = runs.get("idle_latency/cxl"), runs.get("idle_latency/local")
    for op in ("read", "write"):
        def measured(run):
            d = (run or {}).get("data") or {}
            if not d.get(op):
                return (run or {}).get("error") or "-"
            mean, p50 = measured_idle(d, op)
            return f"mean {mean:.0f} / p50 {p50:.0f} ns"
        t.add_row(op, measured(cxl),
                  *(_modelled(cxl, key, op) if cxl and cxl.get("modelled") else _idle(env["topology"], key, op)
                    for key in IDLE_MODELLED),
                  measured(local), *((measured(runs.get("idle_latency/direct")),) if direct_runs else ()))
    batch = ((cxl or local or {}).get("data") or {}).get("batch", 64)
    t.caption = IDLE_CAPTION.format(batch=batch) + "; " + _modelled_caption(cxl, env["topology"])
    out.append(t)
    t = Table(title="loaded latency (one chasing thread + traffic threads)", title_justify="left")
    loaded = runs.get("loaded_latency/cxl") or {}
    for col in (_delay(loaded), f"{MEASURED}: MB/s", "mean ns", f"{LOCAL}: MB/s", "mean ns"):
        t.add_column(col, justify="right")
    cxl_rows = (loaded.get("data") or {}).get("rows", [])
    local_rows = ((runs.get("loaded_latency/local") or {}).get("data") or {}).get("rows", [])
    for i, row in enumerate(cxl_rows):
        lrow = local_rows[i] if i < len(local_rows) else {}
        t.add_row(str(row["delay"]), f"{row['bandwidth_MBps']:.1f}", f"{row['latency_ns']:.0f}",
                  f"{lrow.get('bandwidth_MBps', 0):.1f}" if lrow else "-", f"{lrow.get('latency_ns', 0):.0f}" if lrow else "-")
    t.caption = "mean ns: the chase's time / its loads while the traffic threads ran"
    out.append(t)
    if cxl_rows:
        out.append(_loaded_modelled(loaded))
    t = Table(title="bandwidth by transfer size", title_justify="left")
    systems = ("cxl", "local") + (("direct",) if direct_runs else ())
    for col in ("pattern", "op", "size", "threads", f"{MEASURED} MB/s", f"{LOCAL} MB/s") + (
            (f"{DIRECT} MB/s",) if direct_runs else ()):
        t.add_column(col, justify="right")
    by_system = {system: {(r["pattern"], r["op"], r["size"], r["threads"]): r
                          for r in ((runs.get(f"bandwidth/{system}") or {}).get("data") or {}).get("results", [])}
                 for system in systems}
    # rows in the order the first path that ran lists them (a direct-only run has no CXL rows)
    keys = next((list(rows) for rows in (by_system["cxl"], by_system.get("direct", {})) if rows), [])
    for key in keys:
        t.add_row(*(str(k) for k in key), *(f"{by_system[s][key]['MBps']:.1f}" if key in by_system[s] else "-"
                                            for s in systems))
    out.append(t)
    bw = runs.get("bandwidth/cxl") or {}
    if (bw.get("data") or {}).get("results"):
        out.append(_bandwidth_modelled(bw))
    curve = bw.get("modelled", {}).get("curve")
    if curve:
        out.append(_curve_table(curve))
    failed = [r for r in results["results"] if r["status"] != "ok"]
    if failed:
        t = Table(title="benchmarks that did not complete", title_justify="left")
        t.add_column("benchmark")
        t.add_column("error")
        for r in failed:
            t.add_row(r["name"], r.get("error") or r["status"])
        out.append(t)
    return out


def _row_label(data: dict, i: int) -> str:
    """What the i-th measured row is: pattern, op, size and threads, or the traffic delay."""
    if data.get("results"):
        r = data["results"][i]
        return f"{r['pattern']} {r['op']} {r['size']}B x{r['threads']}"
    return f"delay {data['rows'][i]['delay']}"


def _metrics(results: dict) -> dict[str, float]:
    """The headline numbers of a results file, for comparisons."""
    out = {}
    for name, run in _runs(results).items():
        d = run.get("data") or {}
        for op, per in (("read", "ns_per_load"), ("write", "ns_per_store")):
            if isinstance(d.get(op), dict):
                out[f"{name} {op} ns"] = d[op][per]
        for r in d.get("results", []):
            out[f"{name} {r['pattern']} {r['op']} {r['size']}B x{r['threads']} MB/s"] = r["MBps"]
        for r in d.get("rows", []):
            out[f"{name} delay {r['delay']} latency ns"] = r["latency_ns"]
        for i, m in enumerate((run.get("modelled") or {}).get("rows", [])):
            row = _row_label(d, i)
            for system in MODEL_SYSTEMS:
                fig = m.get(system) or {}
                if fig.get("gbs") is not None:
                    out[f"{name} {row} {LABELS[MODEL_KEYS[system]]} GB/s"] = fig["gbs"]
                if fig.get("latency_p50_ns") is not None:
                    out[f"{name} {row} {LABELS[MODEL_KEYS[system]]} chase p50 ns"] = fig["latency_p50_ns"]
        for key in ("pf", "electrical"):
            for op in ("read", "write"):
                p = ((run.get("modelled") or {}).get(key) or {}).get(op) or {}
                if p.get("count"):
                    out[f"{name} {LABELS[key]} {op} p50 ns"] = p["p50"]
    return out


def compare(a: dict, b: dict) -> Table:
    """B against A, metric by metric; a metric only one file has is listed with '-' on the other side."""
    ma, mb = _metrics(a), _metrics(b)
    t = Table(title=f"A: {a['environment'].get('topology')} ({a['environment'].get('timing_mode')})  vs  "
                    f"B: {b['environment'].get('topology')} ({b['environment'].get('timing_mode')})",
              title_justify="left")
    for col in ("metric", "A", "B", "B / A"):
        t.add_column(col, justify="right" if col != "metric" else "left")
    for key in [k for k in ma if k in mb]:
        ratio = f"{mb[key] / ma[key]:.2f}" if ma[key] else "-"
        t.add_row(key, f"{ma[key]:.1f}", f"{mb[key]:.1f}", ratio)
    only_a, only_b = [k for k in ma if k not in mb], [k for k in mb if k not in ma]
    for key in only_a:
        t.add_row(key, f"{ma[key]:.1f}", "-", "-")
    for key in only_b:
        t.add_row(key, "-", f"{mb[key]:.1f}", "-")
    if only_a or only_b:
        t.caption = (f"only in A: {len(only_a)} metrics, only in B: {len(only_b)} (listed last, '-' where a "
                     "file has none)")
    return t
