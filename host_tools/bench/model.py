"""The modelled columns of `pfcxl bench`: the stream each benchmark row actually issued, replayed on
the PF appliance, the electrical switch pool and local DRAM at the row's nominal load.

Capture. The bench always loads the TCG plugin in trace mode. The shipped suites run the CXL
loaded_latency and bandwidth benchmarks with `--mark-rows 1`: each row is one plugin phase, and
the phase's request count (the plugin's log) cuts the run's captured records into the records
each row issued (timing.split_rows). Nothing is synthesised from the benchmark's known pattern.

Replay. A row's records keep their addresses, reads and writes and their captured order; each
moves a whole 64-byte line, as in the bench's traced idle figures (timing_report.as_lines: a CPU
moves lines, whatever part of one the program touched); only their issue times change. They are spread evenly by bytes at the nominal rate (the
per-vCPU instruction stamps of a multi-threaded guest are not one clock, and a benchmark row
is a constant-rate stream by construction). Nominal rates, our definition:

* a bandwidth row moves data as fast as it can: it is offered at the host link's full rate
  (fabric_constants.PF_HOST_BANDWIDTH_MBS, PCIe Gen6, the same link on every system), and the
  modelled figure is the bandwidth each system carries of it;
* a loaded-latency row with delay D ns: every traffic thread issues one line per D ns, so the
  traffic offers threads x access_bytes / D, at most the host link's rate (D = 0: as fast as it
  can). Its chase records (addresses in [0, span)) form one dependent chain beside the traffic,
  each load issuing when the previous one completes; the row's modelled latency is that of the
  chase loads issued while the traffic ran. Delays in TSC cycles have no nominal rate here.

The latency-against-bandwidth curve (`pfcxl model curve`) replays the bandwidth run's read rows
(all its rows if it has none) at CURVE_LOADS: reads alone, so each system's knee is that of one
direction of its links (the models' links are full duplex).
"""

from __future__ import annotations

import numpy as np

from pfcxl.device.fabric import constants as fc
from pfcxl.device.fabric import engine as fabric_engine
from pfcxl.device.fabric import replay as fabric_replay
from pfcxl.device.topology import Topology

from pfcxl.device.fabric import systems as fabric_systems

from pfcxl.host_tools.timing import model_runs
from pfcxl.host_tools.timing import report as timing_report

BENCH_COLUMNS = model_runs.CURVE_COLUMNS                     # pf, electrical, dram: the columns
HOST_LINK_LOAD = fc.PF_HOST_BANDWIDTH_MBS / fc.PF_PORT_BANDWIDTH_MBS   # in PF ports (replay's load unit)
HOST_LINK_GBS = fc.PF_HOST_BANDWIDTH_MBS / 1000
CURVE_LOADS = model_runs.CURVE_LOADS                 # offered load per host in PF ports, past the host link
def _models(topo: Topology) -> dict:
    models = fabric_systems.models(topo)
    return {s: models[model_runs.REPORT_KEYS[s]] for s in BENCH_COLUMNS}


def even(records: np.ndarray) -> np.ndarray:
    """The records with one common stamp: replay spreads them evenly by bytes, in order."""
    out = records.copy()
    out["insn"] = 0
    return out


def bench_stream(records: np.ndarray) -> np.ndarray:
    """A row's records as the bench models them: whole 64-byte lines, as the bench's traced idle
    figures (timing_report.as_lines), with one common stamp (even)."""
    return even(timing_report.as_lines(records))


def _achieved_gbs(nbytes: int, result: fabric_engine.EngineResult) -> float:
    return nbytes / max(result.window_ps, 1) * 1000                 # bytes per ps -> GB/s


def bandwidth_row(topo: Topology, records: np.ndarray) -> dict:
    """One bandwidth row's stream at the host link's full rate, on every system."""
    base, granularity = model_runs.placement(topo)
    records = bench_stream(records)
    nbytes = int(records["size"].sum())
    out: dict[str, object] = {"requests": int(len(records)), "bytes": nbytes, "load": HOST_LINK_LOAD,
           "offered_gbs": HOST_LINK_GBS}
    for system, model in _models(topo).items():
        r = fabric_replay.replay(model, records, base_hpa=base, granularity=granularity,
                                 load=HOST_LINK_LOAD)
        op = "read" if np.count_nonzero(~r.write) else "write"
        p = r.percentiles(op)
        out[system] = {"gbs": _achieved_gbs(nbytes, r), "op": op, "p50_ns": p["p50"], "p99_ns": p["p99"]}
    return out


def traffic_load(data: dict, row: dict) -> float | None:
    """The loaded-latency row's offered traffic in PF ports (None: delays in cycles)."""
    if data.get("delay_unit") != "ns":
        return None
    if not data["threads"]:
        return 0.0
    if not row["delay"]:
        return HOST_LINK_LOAD
    mbs = data["threads"] * data["access_bytes"] / row["delay"] * 1000      # bytes per ns -> MB/s
    return min(mbs, fc.PF_HOST_BANDWIDTH_MBS) / fc.PF_PORT_BANDWIDTH_MBS


def loaded_row(topo: Topology, data: dict, row: dict, records: np.ndarray) -> dict:
    """One loaded-latency row: its traffic at the nominal rate, its chase dependent beside it."""
    load = traffic_load(data, row)
    if load is None:
        return {"error": f"delays in {data.get('delay_unit')}: no nominal rate (use --delay-ns)"}
    base, granularity = model_runs.placement(topo)
    records = bench_stream(records)
    chase_mask = (records["hpa"] - np.uint64(base)) < np.uint64(data["span"])
    traffic, chase = records[~chase_mask], records[chase_mask]
    if load and len(traffic):
        traffic = fabric_replay.respace(traffic, load=load)
    else:
        traffic = traffic[:0]
    trace = np.concatenate([traffic, chase])
    # each traffic access alone in its chain (issues at its stamp); the chase is one chain
    chains = np.r_[np.arange(len(traffic)), np.full(len(chase), len(traffic))]
    traffic_bytes = int(np.maximum(traffic["size"], 1).sum())
    out: dict[str, object] = {"requests": int(len(records)), "traffic_requests": int(len(traffic)), "chase_requests": int(len(chase)),
           "load": load, "offered_gbs": load * fc.PF_PORT_BANDWIDTH_MBS / 1000}
    for system, model in _models(topo).items():
        r = fabric_engine.run(model, trace, ns_per_insn=fabric_replay.PS_PER_STAMP, dependent=True,
                              base_hpa=base, granularity=granularity, seed=1, chains=chains)
        lat = r.latency_ps[len(traffic):]
        if len(traffic):
            # the chase loads issued while the traffic ran
            lat = lat[r.issue_ps[len(traffic):] <= r.issue_ps[:len(traffic)].max()]
            done = (r.issue_ps[:len(traffic)] + r.latency_ps[:len(traffic)]).max()
            gbs = traffic_bytes / max(int(done - r.issue_ps[:len(traffic)].min()), 1) * 1000
        else:
            gbs = 0.0
        q = np.percentile(lat, [50, 99]) / 1000 if len(lat) else [None, None]
        out[system] = {"latency_p50_ns": q[0] if q[0] is None else float(q[0]),
                       "latency_p99_ns": q[1] if q[1] is None else float(q[1]),
                       "chase_loads": int(len(lat)), "traffic_gbs": gbs}
    return out


def model_run(topo: Topology, tool: str, data: dict, pieces: list[np.ndarray]) -> dict:
    """The `modelled` figures of one marked run: per row, and the curve of a bandwidth run."""
    rows = data.get("results") if tool == "bandwidth" else data.get("rows")
    if rows is None or len(rows) != len(pieces):
        return {"rows_error": f"{len(pieces)} captured phases for {len(rows or [])} rows"}
    if tool == "bandwidth":
        out: dict[str, object] = {"rows": [bandwidth_row(topo, p) for p in pieces]}
        reads = [p for row, p in zip(rows, pieces) if row.get("op") == "read"] or pieces
        whole = bench_stream(np.concatenate(reads))
        if len(whole):
            out["curve"] = model_runs.curve_report(whole, topo, CURVE_LOADS)
        return out
    return {"rows": [loaded_row(topo, data, row, p) for row, p in zip(rows, pieces)]}
