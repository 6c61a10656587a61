"""`pfcxl model replay`: a captured trace replayed on a fabric model at a chosen offered load
(device/fabric_replay.py)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from rich.table import Table

from pfcxl.device import address_map, fabric_constants as fc, fabric_replay, topology
from pfcxl.device.fabric_engine import trace_dtype
from pfcxl.errors import TimingError

from . import timing_report
from .ui import out

SYSTEMS = {"pf": "pf", "pf_hbm": "pf_hbm", "electrical": "electrical", "dram": "local"}   # CLI -> report key

DESCRIPTION = f"""\
Replay a captured access trace (one guest or many; a .npy file of trace records, as `pfcxl run
--timing trace --trace-out FILE` writes) on one fabric model. Every host's stream keeps its
addresses, sizes, reads and writes and order; only its issue times change: --load L offers L x the
PF port bandwidth ({fc.PF_PORT_BANDWIDTH_MBS / 1000:g} GB/s) per host, on every system alike (1.0 fills one
PF port), and --dilate X multiplies the captured issue times by X. Prints the modelled read and
write latencies and every port's (queue's) achieved bandwidth and utilisation, labelled with the
system modelled.

Example: pfcxl model replay trace.npy --system electrical --load 0.8"""


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number above 0")
    return value


def add_parsers(sub) -> None:
    model = sub.add_parser("model", help="the fabric models offline: replay a captured trace at a chosen load")
    msub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    p = msub.add_parser("replay", help="replay a captured trace on one system at an offered load",
                        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", type=Path, help=".npy file of trace records")
    p.add_argument("--system", choices=tuple(SYSTEMS), default="pf",
                   help="pf (the PF appliance's DDR5 path, default), pf_hbm (with its HBM3E cache), "
                   "electrical (the switched pool), dram (local DDR5)")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--load", type=_positive, help="offered load per host, in PF ports (1.0 = 25.6 GB/s)")
    how.add_argument("--dilate", type=_positive, help="multiply the captured issue times by this factor")
    p.add_argument("--topology", "-t", default="pf-nic",
                   help="the topology the trace was captured on: its DAX base and appliance (default pf-nic)")
    p.add_argument("--ns-per-insn", type=_positive, default=1.0,
                   help="ns per instruction stamp of the captured trace (default 1)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON document")
    p.set_defaults(func=cmd_replay)


def save_trace(path: Path, records: np.ndarray) -> None:
    """Write captured records as a .npy trace file (exactly at `path`)."""
    try:
        with open(path, "wb") as f:
            np.save(f, records, allow_pickle=False)
    except OSError as exc:
        raise TimingError(f"{path}: cannot write the trace: {exc.strerror}") from None


def read_trace(path: Path) -> np.ndarray:
    """The records of a .npy trace file; one line for anything else."""
    try:
        records = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise TimingError(f"{path}: cannot read a trace: {exc}") from None
    if records.dtype != trace_dtype():
        raise TimingError(f"{path}: holds {records.dtype}, not trace records {trace_dtype().descr}")
    return records


def replay_report(records: np.ndarray, topo: topology.Topology, system: str, *, load: float | None,
                  dilate: float | None, ns_per_insn: float = 1.0) -> dict:
    """Everything the printed report shows, as one document."""
    app = timing_report.appliance_for(topo)
    key = SYSTEMS[system]
    model = timing_report.models(topo)[key]
    base = address_map.dax_placements(topo)[0].base if topo.regions else 0
    try:
        result = fabric_replay.replay(model, records, base_hpa=base, granularity=app.granularity,
                                      ns_per_insn=ns_per_insn, load=load, dilate=dilate)
    except ValueError as exc:                       # an address or host the system does not have
        raise TimingError(f"cannot replay on {model.name}: {exc}") from None
    return {"system": timing_report.LABELS[key], "model": model.name, "load": load, "dilate": dilate,
            "offered_gbs_per_host": load * fc.PF_PORT_BANDWIDTH_MBS / 1000 if load else None,
            "modelled_system": timing_report.modelled_system(topo), "requests": int(len(records)),
            "hosts": int(len(np.unique(records["host"]))), "window_ns": result.window_ps / 1000,
            "read": result.percentiles("read"), "write": result.percentiles("write"),
            "ports": fabric_replay.port_rates(result)}


def table(report: dict) -> Table:
    t = Table(title=f"{report['system']}: {report['requests']} requests from {report['hosts']} hosts, "
              + (f"offered {report['offered_gbs_per_host']:.2f} GB/s per host (load {report['load']:g})"
                 if report["load"] else f"issue times x {report['dilate']:g}"), title_justify="left")
    for col in ("", "queues", "achieved GB/s (min / mean / max)", "utilisation (min / mean / max)"):
        t.add_column(col, justify="right" if col else "left")
    for name, st in report["ports"].items():
        if st["queues"]:
            g, u = np.array(st["gbs"]), np.array(st["utilisation"])
            t.add_row(f"{name} ({st['bandwidth_gbs']:g} GB/s each)", str(len(g)),
                      f"{g.min():.2f} / {g.mean():.2f} / {g.max():.2f}", f"{u.min():.3f} / {u.mean():.3f} / {u.max():.3f}")
    for op in ("read", "write"):
        p = report[op]
        if p.get("count"):
            t.add_row(f"{op} latency ns ({p['count']})", "",
                      f"p50 {p['p50']:.0f}  p99 {p['p99']:.0f}  max {p['max']:.0f}", "")
    t.caption = f"modelled system: {report['modelled_system']}"
    return t


def cmd_replay(args) -> int:
    topo = topology.load(topology.resolve(args.topology))
    report = replay_report(read_trace(args.trace), topo, args.system, load=args.load, dilate=args.dilate,
                           ns_per_insn=args.ns_per_insn)
    if args.json:
        sys.stdout.write(json.dumps(report, indent=1) + "\n")
    else:
        out.print(table(report))
    return 0
