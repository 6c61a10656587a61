"""`pfcxl model replay`: a captured trace replayed on a fabric model at a chosen offered load
(device/fabric_replay.py). numpy and the fabric models are imported by the functions that use them:
the parser stays light (host_tools/cli.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pfcxl.device import fabric_constants as fc, topology
from pfcxl.errors import TimingError

from . import argtypes
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


def add_parsers(sub) -> None:
    model = sub.add_parser("model", help="the fabric models offline: replay a captured trace at a chosen load",
                           description="Run the fabric models of device/ on a trace captured by `pfcxl run "
                           "--timing trace --trace-out FILE`, without a guest: one offered load (replay) or "
                           "a latency-bandwidth curve (curve).")
    msub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    p = msub.add_parser("replay", help="replay a captured trace on one system at an offered load",
                        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", type=Path, help=".npy file of trace records")
    p.add_argument("--system", choices=tuple(SYSTEMS), default="pf",
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
    p.add_argument("--loads", type=loads_list, default=loads_list("0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.1"),
                   help="comma-separated offered loads in PF ports per host (default 0.1 to 1.1)")
    p.add_argument("--topology", "-t", default="pf-nic", help="the topology the trace was captured on")
    p.add_argument("--ns-per-insn", type=argtypes.positive, default=1.0, help="ns per instruction stamp (default 1)")
    p.add_argument("--json", action="store_true", help="print the points as one JSON document")
    p.set_defaults(func=cmd_curve)


MAX_LOADS = 100         # each load is one replay of the whole trace per system


def loads_list(text: str) -> list[float]:
    parts = text.split(",", MAX_LOADS)
    if len(parts) > MAX_LOADS:
        raise argparse.ArgumentTypeError(f"at most {MAX_LOADS} loads (each is one replay of the trace per system)")
    return [argtypes.positive(x) for x in parts]


def save_trace(path: Path, records: np.ndarray) -> None:
    """Write captured records as a .npy trace file (exactly at `path`)."""
    import numpy as np
    try:
        with open(path, "wb") as f:
            np.save(f, records, allow_pickle=False)
    except OSError as exc:
        raise TimingError(f"{path}: cannot write the trace: {exc.strerror}") from exc


def read_trace(path: Path) -> np.ndarray:
    """The records of a .npy trace file; one line for anything else. The header is checked (a
    1-D array of trace records, at least one, exactly as many as the file holds) before the
    records are read, so a header's claim never sizes an allocation."""
    import numpy as np

    from pfcxl.device.fabric_engine import trace_dtype
    fmt = np.lib.format
    try:
        with open(path, "rb") as f:
            version = fmt.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f"unsupported .npy version {version[0]}.{version[1]}")
            shape, _, dtype = (fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0)(f)
            if dtype != trace_dtype():
                raise TimingError(f"{path}: holds {dtype}, not trace records {trace_dtype().descr}")
            if len(shape) != 1 or not shape[0]:
                raise TimingError(f"{path}: an array of shape {shape}: a trace is a 1-D array of at least one record")
            room = os.fstat(f.fileno()).st_size - f.tell()
            if room != shape[0] * dtype.itemsize:
                raise TimingError(f"{path}: its header claims {shape[0]} records ({shape[0] * dtype.itemsize} "
                                  f"bytes), the file holds {room} bytes after it")
            return np.fromfile(f, dtype, count=shape[0])
    except (OSError, ValueError, EOFError) as exc:
        raise TimingError(f"{path}: cannot read a trace: {exc}") from exc


def placement(topo: topology.Topology) -> tuple[int, int]:
    """(base HPA, interleave granularity) the trace's addresses were captured with."""
    from pfcxl.device import address_map
    from pfcxl.device import fabric_systems
    return (address_map.dax_placements(topo)[0].base if topo.regions else 0,
            fabric_systems.appliance_for(topo).granularity)


def window(topo: topology.Topology) -> tuple[int, int]:
    """[base, end) HPAs a capture on `topo` can hold: its DAX region, else the appliance's pool from 0."""
    from pfcxl.device import address_map, fabric_systems
    if topo.regions:
        dax = address_map.dax_placements(topo)[0]
        return dax.base, dax.base + dax.size
    return 0, fabric_systems.appliance_for(topo).capacity


def checked(records: np.ndarray, topo: topology.Topology, source: Path) -> np.ndarray:
    """`records` (read from `source`) if a capture on `topo` can hold them
    (fabric_replay.check_captured), else one line."""
    from pfcxl.device import fabric_replay
    base, end = window(topo)
    try:
        fabric_replay.check_captured(records, base, end)
    except ValueError as exc:
        raise TimingError(f"{source}: not a trace captured on topology '{topo.name}': {exc}") from exc
    return records


def replay_report(records: np.ndarray, topo: topology.Topology, system: str, *, load: float | None,
                  dilate: float | None, ns_per_insn: float = 1.0) -> dict:
    """Everything the printed report shows, as one document."""
    import numpy as np

    from pfcxl.device import fabric_replay
    from pfcxl.device import fabric_systems
    key = SYSTEMS[system]
    model = fabric_systems.models(topo)[key]
    base, granularity = placement(topo)
    try:   # whole 64-byte lines, as the traced run models them (timing_report.as_lines)
        result = fabric_replay.replay(model, timing_report.as_lines(records), base_hpa=base, granularity=granularity,
                                      ns_per_insn=ns_per_insn, load=load, dilate=dilate)
    except ValueError as exc:                       # an address or host the system does not have
        raise TimingError(f"cannot replay on {model.name}: {exc}") from exc
    return {"system": fabric_systems.LABELS[key], "model": model.name, "load": load, "dilate": dilate,
            "offered_gbs_per_host": load * fc.PF_PORT_BANDWIDTH_MBS / 1000 if load else None,
            "modelled_system": fabric_systems.modelled_system(topo), "requests": int(len(records)),
            "hosts": int(len(np.unique(records["host"]))), "window_ns": result.window_ps / 1000,
            "read": result.percentiles("read"), "write": result.percentiles("write"),
            "ports": fabric_replay.port_rates(result)}


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


CURVE_SYSTEMS = ("pf", "electrical", "dram")


def curve_report(records: np.ndarray, topo: topology.Topology, loads: list[float], ns_per_insn: float = 1.0) -> dict:
    from pfcxl.device import fabric_replay
    from pfcxl.device import fabric_systems
    base, granularity = placement(topo)
    models = fabric_systems.models(topo)
    out = {}
    for system in CURVE_SYSTEMS:
        key = SYSTEMS[system]
        try:
            points = fabric_replay.curve(models[key], timing_report.as_lines(records), loads, base_hpa=base, granularity=granularity,
                                         ns_per_insn=ns_per_insn)
        except ValueError as exc:
            raise TimingError(f"cannot replay on {models[key].name}: {exc}") from exc
        out[system] = {"label": fabric_systems.LABELS[key], "points": points, "knee": fabric_replay.knee(points)}
    return out


def curve_figure(report: dict):
    """The latency-bandwidth figure: a curve per system, its knee marked, the legend below the
    axes (never over a curve), latency ticks as plain numbers."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, ax = plt.subplots(figsize=(7, 4.8))
    for i, system in enumerate(report.values()):
        pts, knee = system["points"], system["knee"]
        ax.plot([p["achieved_gbs"] for p in pts], [p["p50_ns"] for p in pts], marker="o", markersize=4,
                color=f"C{i}", label=system["label"] + (f" (knee at {knee['offered_gbs']:.0f} GB/s offered)"
                                                        if knee else " (no knee)"))
        if knee:
            ax.plot([knee["achieved_gbs"]], [knee["p50_ns"]], marker="D", markersize=9, color=f"C{i}",
                    markerfacecolor="none")
    ax.set_xlabel("achieved bandwidth, all hosts (GB/s, modelled)")
    ax.set_ylabel("read latency p50 (ns, modelled)")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    ax.set_title("latency against bandwidth, replayed trace (knees: open diamonds)")
    return fig


def save_curve(report: dict, path: Path) -> None:
    import matplotlib.pyplot as plt
    fig = curve_figure(report)
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    except OSError as exc:
        raise TimingError(f"{path}: cannot write the plot: {exc.strerror}") from exc
    finally:
        plt.close(fig)


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
