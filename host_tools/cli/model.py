"""`pfcxl model replay`: a captured trace replayed on a fabric model at a chosen offered load
(device/fabric/replay.py). numpy and the fabric models are imported by the functions that use them:
the parser stays light (host_tools/cli/main.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pfcxl.device.fabric import constants as fc
from pfcxl.device import topology

from pfcxl.host_tools import argtypes
from pfcxl.host_tools.timing.model_runs import CURVE_LOADS, REPORT_KEYS, checked, curve_report, read_trace, replay_report, save_curve
from pfcxl.host_tools.ui import out

DESCRIPTION = f"""\
Replay a captured access trace (one guest or many; a .npy file of trace records, as `pfcxl run
--timing trace --trace-out FILE` writes) on one fabric model. Every host's stream keeps its
addresses, sizes, reads and writes and order; only its issue times change: --load L offers L x the
PF port bandwidth ({fc.PF_PORT_BANDWIDTH_MBS / 1000:g} GB/s) per host, on every system alike (1.0 fills one
PF port), and --dilate X multiplies the captured issue times by X. Prints the modelled read and
write latencies and every port's (queue's) achieved bandwidth and utilisation, labelled with the
system modelled.

Example: pfcxl model replay trace.npy --system electrical --load 0.8"""


def add_parsers(sub) -> None:
    model = sub.add_parser("model", help="the fabric models offline: replay a captured trace at a chosen load",
                           description="Run the fabric models of device/ on a trace captured by `pfcxl run "
                           "--timing trace --trace-out FILE`, without a guest: one offered load (replay) or "
                           "a latency-bandwidth curve (curve).")
    msub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    p = msub.add_parser("replay", help="replay a captured trace on one system at an offered load",
                        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", type=Path, help=".npy file of trace records")
    p.add_argument("--system", choices=tuple(REPORT_KEYS), default="pf",
                   help="pf (the PF appliance's DDR5 path, default), pf_hbm (with its HBM3E cache), "
                   "electrical (the switched pool), dram (local DDR5)")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--load", type=argtypes.positive, help="offered load per host, in PF ports (1.0 = 25.6 GB/s)")
    how.add_argument("--dilate", type=argtypes.positive, help="multiply the captured issue times by this factor")
    p.add_argument("--topology", "-t", default="pf-nic",
                   help="the topology the trace was captured on: its DAX base and appliance (default pf-nic)")
    p.add_argument("--ns-per-insn", type=argtypes.positive, default=1.0,
                   help="ns per instruction stamp of the captured trace (default 1)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON document")
    p.set_defaults(func=cmd_replay)

    p = msub.add_parser("curve", help="latency against bandwidth per system (MLC/Mess style), saved as PNG",
                        description="Replay TRACE at each offered load (as `model replay --load`) on the PF "
                        "appliance, the electrical pool and local DRAM; print offered and achieved GB/s and read "
                        "latency p50/p99 per load, the knee of each system (the first load it no longer carries: "
                        "achieved below 95% of offered), and save the curves as a PNG.")
    p.add_argument("trace", type=Path, help=".npy file of trace records")
    p.add_argument("--out", type=Path, default=Path("latency-bandwidth.png"), help="PNG to write")
    p.add_argument("--loads", type=argtypes.loads_list, default=list(CURVE_LOADS),
                   help="comma-separated offered loads in PF ports per host (default "
                   f"{','.join(f'{x:g}' for x in CURVE_LOADS)}: past the {fc.PF_HOST_BANDWIDTH_MBS / 1000:g} GB/s "
                   "host link, so each system's knee shows)")
    p.add_argument("--topology", "-t", default="pf-nic", help="the topology the trace was captured on")
    p.add_argument("--ns-per-insn", type=argtypes.positive, default=1.0, help="ns per instruction stamp (default 1)")
    p.add_argument("--json", action="store_true", help="print the points as one JSON document")
    p.set_defaults(func=cmd_curve)


def table(report: dict):
    import numpy as np
    from rich.table import Table

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
    report = replay_report(checked(read_trace(args.trace), topo, args.trace), topo, args.system, load=args.load, dilate=args.dilate,
                           ns_per_insn=args.ns_per_insn)
    if args.json:
        sys.stdout.write(json.dumps(report, indent=1) + "\n")
    else:
        out.print(table(report))
    return 0


def cmd_curve(args) -> int:
    from rich.table import Table
    topo = topology.load(topology.resolve(args.topology))
    report = curve_report(checked(read_trace(args.trace), topo, args.trace), topo, args.loads, args.ns_per_insn)
    save_curve(report, args.out)
    if args.json:
        sys.stdout.write(json.dumps(report, indent=1) + "\n")
        return 0
    for system in report.values():
        t = Table(title=system["label"], title_justify="left")
        for col in ("load", "offered GB/s", "achieved GB/s", "p50 ns", "p99 ns"):
            t.add_column(col, justify="right")
        for p in system["points"]:
            t.add_row(f"{p['load']:g}", f"{p['offered_gbs']:.1f}", f"{p['achieved_gbs']:.1f}",
                      f"{p['p50_ns']:.0f}", f"{p['p99_ns']:.0f}")
        k = system["knee"]
        t.caption = (f"knee: from load {k['load']:g} ({k['offered_gbs']:.1f} GB/s offered) it carries "
                     f"{k['achieved_gbs']:.1f} GB/s" if k else "no knee: it carried every load")
        out.print(t)
    out.print(f"curve saved to {args.out}")
    return 0
