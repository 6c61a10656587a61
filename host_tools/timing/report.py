"""What the fabrics would take for exactly the CXL accesses a guest command made.

The TCG plugin's trace (host_tools/timing/config.py) goes through the fabric models (device/): the
photonic appliance and the electrical switch pool, with local DRAM beside them. The emulator's
own cost per request is shown too, always labelled as emulator overhead: under TCG it is the
price of an I/O callback, not a property of any fabric.
"""

from __future__ import annotations

import numpy as np
from rich.table import Table

from pfcxl.device.topology import address_map
from pfcxl.device.fabric.model import DEFAULT_PARAMS, Params as FabricParams
from pfcxl.device.fabric import engine as fabric_engine
from pfcxl.device.fabric.replay import as_lines
from pfcxl.device.fabric.systems import LABELS, SYSTEMS, appliance_for, modelled_system, models
from pfcxl.device.topology import Topology
from pfcxl.device.trace.records import LINE

QUANTILES = list(range(0, 100)) + [99.5, 99.9, 100]
def model_trace(topo: Topology, records: np.ndarray, *, dependent: bool, seed: int = 1,
                what_if: FabricParams = DEFAULT_PARAMS) -> dict:
    """Per model: read/write latency percentiles (ns), requests, bytes and achieved GB/s."""
    app = appliance_for(topo)
    base = address_map.dax_placements(topo)[0].base if topo.regions else 0
    out: dict = {"requests": int(len(records)), "reads": int(np.count_nonzero(records["write"] == 0)),
                 "writes": int(np.count_nonzero(records["write"])), "bytes": int(records["size"].sum()),
                 "issue": "dependent" if dependent else "independent",
                 "modelled_system": modelled_system(topo)}
    if not len(records):
        return out
    lines = as_lines(records)
    out["bytes"] = int(len(lines)) * LINE
    if what_if.changed():
        out["what_if"] = what_if.changed()
    for name, model in models(topo, what_if).items():
        result = fabric_engine.run(model, lines, dependent=dependent, base_hpa=base,
                                   granularity=app.granularity, seed=seed)
        window = max(int(result.window_ps), 1)
        reads = result.latency_ns[~result.write]
        lat = reads if len(reads) else result.latency_ns     # the CDF plot is of read latency
        out[name] = {"read": result.percentiles("read"), "write": result.percentiles("write"),
                     "gbps": out["bytes"] / window * 1000,   # bytes per ps -> GB/s
                     # the whole distribution, compactly, for CDF plots: latency at 0..100 %
                     "quantiles_ns": [float(q) for q in np.percentile(lat, QUANTILES)]}
        if name == "pf":
            out[name]["idle_terms_ns"] = {"read": list(model.idle_terms_ns(False)),
                                          "write": list(model.idle_terms_ns(True))}
    return out


def emulator_cost(requests: int, seconds: float) -> dict:
    return {"seconds": seconds, "ns_per_request": seconds * 1e9 / requests if requests else None,
            "what": "the command's host wall-clock / its CXL requests (process start and console "
                    "included): QEMU TCG overhead, not a fabric figure"}


def table(report: dict, title: str) -> Table:
    """Rows: read, write; columns: the labelled systems."""
    t = Table(title=title, title_justify="left")
    t.add_column("")
    for key in ("emulator",) + SYSTEMS:
        t.add_column(LABELS[key], justify="right")
    emu = report.get("emulator", {}).get("ns_per_request")
    for op in ("read", "write"):
        count = report.get(f"{op}s", 0)
        if not count:
            continue
        cells = [f"{emu:.0f} ns wall / request" if emu else "-"]
        for key in SYSTEMS:
            p = report.get(key, {}).get(op, {})
            cells.append(f"p50 {p['p50']:.0f}  p99 {p['p99']:.0f}  p99.9 {p['p99.9']:.0f}  max {p['max']:.0f}"
                         if p.get("count") else "-")
        t.add_row(f"{op} ({count} requests)", *cells)
    bw = ["-"] + [f"{report[k]['gbps']:.2f} GB/s" if k in report else "-" for k in SYSTEMS]
    t.add_row("achieved bandwidth", *bw)
    captions = [f"modelled system: {report['modelled_system']}"] if report.get("modelled_system") else []
    if emu:
        captions.append(f"{LABELS['emulator']}: the whole command's host wall-clock over its CXL requests "
                        "(guest process start, console and non-CXL work included), not a per-load latency: "
                        "a guest tool's own ns per load (chase) times its loop alone, and is smaller")
    terms = report.get("pf", {}).get("idle_terms_ns")
    if terms:
        captions.append("PF idle decomposition T_req + T_mem + T_resp: read "
                        f"{' + '.join(map(str, terms['read']))} = {sum(terms['read'])} ns, write "
                        f"{' + '.join(map(str, terms['write']))} = {sum(terms['write'])} ns (paper)")
    t.caption = "\n".join(captions) or None
    return t
