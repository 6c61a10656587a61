"""Offline runs of the fabric models on a captured trace: read and check the .npy file, replay it
at one offered load (`pfcxl model replay`) or a series of loads (`pfcxl model curve`, the bench's
latency-bandwidth plot), and plot the curve. numpy, the models and matplotlib are imported by the
functions that use them, so importing this module stays light."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from pfcxl.device.fabric import constants as fc
from pfcxl.device import topology
from pfcxl.errors import TimingError
from pfcxl.text_files import open_regular

if TYPE_CHECKING:
    import numpy as np

REPORT_KEYS = {"pf": "pf", "pf_hbm": "pf_hbm", "electrical": "electrical", "dram": "local"}   # CLI -> report key


CURVE_COLUMNS = ("pf", "electrical", "dram")
# offered load per host in PF ports (`model curve`'s default, the bench's curve): past the host
# link (5 PF ports), so the PF appliance's knee and the electrical pool's both show
CURVE_LOADS = [0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0]



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

    from pfcxl.device.fabric.engine import trace_dtype
    fmt = np.lib.format
    try:
        with open_regular(path, TimingError, f"{path}: cannot read a trace") as f:   # not a FIFO or /dev/zero
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
    from pfcxl.device.topology import address_map
    from pfcxl.device.fabric import systems as fabric_systems
    return (address_map.dax_placements(topo)[0].base if topo.regions else 0,
            fabric_systems.appliance_for(topo).granularity)


def window(topo: topology.Topology) -> tuple[int, int]:
    """[base, end) HPAs a capture on `topo` can hold: its DAX region, else the appliance's pool from 0."""
    from pfcxl.device.topology import address_map
    from pfcxl.device.fabric import systems as fabric_systems
    if topo.regions:
        dax = address_map.dax_placements(topo)[0]
        return dax.base, dax.base + dax.size
    return 0, fabric_systems.appliance_for(topo).capacity


def checked(records: np.ndarray, topo: topology.Topology, source: Path) -> np.ndarray:
    """`records` (read from `source`) if a capture on `topo` can hold them
    (fabric_replay.check_captured), else one line."""
    from pfcxl.device.fabric import replay as fabric_replay
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

    from pfcxl.device.fabric import replay as fabric_replay
    from pfcxl.device.fabric import systems as fabric_systems
    key = REPORT_KEYS[system]
    model = fabric_systems.models(topo)[key]
    base, granularity = placement(topo)
    try:   # whole 64-byte lines, as the traced run models them (fabric_replay.as_lines)
        result = fabric_replay.replay(model, fabric_replay.as_lines(records), base_hpa=base, granularity=granularity,
                                      ns_per_insn=ns_per_insn, load=load, dilate=dilate)
    except ValueError as exc:                       # an address or host the system does not have
        raise TimingError(f"cannot replay on {model.name}: {exc}") from exc
    return {"system": fabric_systems.LABELS[key], "model": model.name, "load": load, "dilate": dilate,
            "offered_gbs_per_host": load * fc.PF_PORT_BANDWIDTH_MBS / 1000 if load else None,
            "modelled_system": fabric_systems.modelled_system(topo), "requests": int(len(records)),
            "hosts": int(len(np.unique(records["host"]))), "window_ns": result.window_ps / 1000,
            "read": result.percentiles("read"), "write": result.percentiles("write"),
            "ports": fabric_replay.port_rates(result)}


def curve_report(records: np.ndarray, topo: topology.Topology, loads: list[float], ns_per_insn: float = 1.0) -> dict:
    from pfcxl.device.fabric import replay as fabric_replay
    from pfcxl.device.fabric import systems as fabric_systems
    import numpy as np
    base, granularity = placement(topo)
    models = fabric_systems.models(topo)
    hosts = int(len(np.unique(records["host"])))
    out = {}
    for system in CURVE_COLUMNS:
        key = REPORT_KEYS[system]
        try:
            points = fabric_replay.curve(models[key], fabric_replay.as_lines(records), loads, base_hpa=base, granularity=granularity,
                                         ns_per_insn=ns_per_insn)
        except ValueError as exc:
            raise TimingError(f"cannot replay on {models[key].name}: {exc}") from exc
        out[system] = {"label": fabric_systems.LABELS[key], "points": points, "knee": fabric_replay.knee(points),
                       "hosts": hosts}
    return out


LOG_PAD = 1.12           # a log axis's limits lie this factor beyond its outer ticks


def log_limits(lo: float, hi: float) -> tuple[float, float, tuple[int, ...]]:
    """Limits and tick steps of a log axis over [lo, hi] (lo > 0): ticks at 1, 2 and 5 x 10^n,
    or at 10^n alone over a wide range; the outer ticks are the steps at or beyond each end of the
    data, so a tick lies at or beyond each end (a latency axis whose ticks stopped at 500 ns under
    900 ns of data, no more), and the limits lie LOG_PAD beyond them (no curve on the frame)."""
    import math
    for subs in ((1, 2, 5), (1,)):
        steps = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 2)
                 for m in subs]
        bottom, top = max(v for v in steps if v <= lo), min(v for v in steps if v >= hi)
        if top / bottom < 300:
            break
    return bottom / LOG_PAD, top * LOG_PAD, subs


def curve_axes(report: dict) -> dict:
    """What the curve's axes say and span: the x label names how many hosts the trace held, the
    latency axis runs from a 1-2-5 tick below the lowest p50 to one above the highest."""
    hosts = max((s.get("hosts", 0) for s in report.values()), default=0)
    who = ", one host" if hosts == 1 else f", all {hosts} hosts" if hosts else ""    # 0: a report without the count
    p50s = [p["p50_ns"] for s in report.values() for p in s["points"] if p["p50_ns"] > 0]
    return {"xlabel": f"achieved bandwidth{who} (GB/s, modelled)", "ylabel": "read latency p50 (ns, modelled)",
            "ylim": log_limits(min(p50s), max(p50s)) if p50s else None,     # (bottom, top, tick steps)
            "title": "latency against bandwidth, replayed trace (knees: open diamonds)"}


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
    axes = curve_axes(report)
    ax.set_xlabel(axes["xlabel"])
    ax.set_ylabel(axes["ylabel"])
    ax.set_yscale("log")
    subs = (1, 2, 5)
    if axes["ylim"]:
        *limits, subs = axes["ylim"]
        ax.set_ylim(*limits)
    ax.yaxis.set_major_locator(LogLocator(subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    ax.set_title(axes["title"])
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
