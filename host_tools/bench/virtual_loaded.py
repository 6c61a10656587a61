"""`pfcxl bench --clock virtual` on an appliance topology: a loaded-latency curve from real guests in
one timeline (host_tools/fleet/timed.py).

Host 0 runs a cold dependent chase of the shared region (dax0.0): its walk's latency, in its own
clock. Hosts 1..N-1 stream sequential reads of their private regions (dax1.0), paced by
`chase --gap-ticks` (a tick is a virtual ns): each gap is one point of the curve, from as fast as
one core streams (gap 0) to a trickle. The offered load of a point is what the traffic hosts
measured in their own clocks (64 B over their ns per line, summed). Beside each point, the
offline engine's replay of every host's traced requests of the round together: the model on the
very same streams. A point where a traffic host streamed for less time than the chase walked is
flagged: the chase's tail then ran on a quieter fabric.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.table import Table

from pfcxl.errors import PfcxlError
from pfcxl.guest.tool_output import tool_json
from pfcxl.host_tools.fleet import timed
from pfcxl.host_tools.vm.boot_options import BootOptions

GAPS = (0, 32, 64, 128, 512)          # ticks (virtual ns) per line of each traffic host
DEFAULT_HOSTS = 3                     # one chasing, two streaming: what 2 CPUs run in minutes
LINES = 3000
CHASE = f"chase --cold --lines {LINES} --span 64M --loads {LINES}"
TRAFFIC = "chase --dax /dev/dax1.0 --stream --no-mark --span 64M --loads {loads} --gap-ticks {gap}"
TRAFFIC_NS = 10_000_000               # how long a traffic host should stream: past a loaded chase's end
FASTEST_LINE_NS = 8                   # one core's stream at its fastest (48 misses in flight)
LABEL = "measured in guest (virtual time)"


@dataclass(frozen=True)
class LoadedCurve:
    out_dir: Path
    report: dict
    table: Table
    seconds: float


def traffic_command(gap: int) -> str:
    """A traffic host's stream at `gap` ticks a line, long enough to outlast the chase."""
    loads = TRAFFIC_NS // max(gap, FASTEST_LINE_NS)
    return TRAFFIC.format(loads=(loads + 7) // 8 * 8, gap=gap)


def _point(machines, path, options: BootOptions, gap: int | None) -> dict:
    """One round: the chase on host 0, and (gap not None) every other host's paced stream."""
    commands = [CHASE] + ([traffic_command(gap)] * (len(machines) - 1) if gap is not None else [])
    runs = timed.run_round(machines[:len(commands)], path, commands)
    rows = [tool_json(r.result.output.splitlines()[0], "chase", what=c) for r, c in zip(runs, commands)]
    chase, traffic = rows[0], rows[1:]
    model = timed.offline_latency_ns(machines[:len(commands)], runs, options.fabric, options.fabric_params,
                                     last=LINES)
    return dict(gap_ticks=gap, traffic_gbs=sum(64 / t["ns_per_load"] for t in traffic if t["ns_per_load"]),
                chase_p50_ns=chase["p50_ns_per_load"], chase_mean_ns=chase["ns_per_load"], model_mean_ns=model,
                traffic_outlasted_chase=all(t["ns"] >= chase["ns"] for t in traffic))


def curve_points(machines, path: Path, options: BootOptions, gaps: tuple[int, ...] = GAPS,
                 say: Callable[[str], None] = lambda m: None) -> list[dict]:
    """The curve's points on timed guests already booted in one timeline (`path`, its file),
    booted with `options` (their fabric and what-ifs are the model's): the chase alone, then one
    round per gap."""
    points = []
    say("host 0 alone")
    points.append(_point(machines, path, options, None))
    for gap in gaps:
        say(f"host 0 beside {len(machines) - 1} traffic hosts at {gap} ticks a line")
        points.append(_point(machines, path, options, gap))
    return points


def run(topology: str, options: BootOptions, hosts: int, quantum_ns: int, *, out_dir: Path,
        gaps: tuple[int, ...] = GAPS, say: Callable[[str], None] = lambda m: None) -> LoadedCurve:
    """The curve: `hosts` timed guests (one chasing, the rest streaming) on a temporary appliance;
    its report written to out_dir/results.json."""
    if hosts < 2:
        raise PfcxlError(f"--hosts {hosts}: a loaded-latency curve needs a chasing host and at least one "
                         "traffic host (2 or more)")
    if options.clock != "virtual":
        raise PfcxlError("the guests' loaded-latency curve is measured in virtual time: give --clock virtual")
    start = time.monotonic()
    options = dataclasses.replace(options, timing="trace")
    with timed.timed_fleet(hosts, options, quantum_ns, name="lat", say=say, topology=topology) as (machines, path):
        points = curve_points(machines, path, options, gaps, say)
    report = dict(kind="loaded latency from guests", label=LABEL, topology=topology, fabric=options.fabric,
                  fabric_params=list(options.fabric_params), hosts=hosts, quantum_ns=quantum_ns,
                  chase=CHASE, traffic=TRAFFIC, points=points)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(report, indent=1))
    return LoadedCurve(out_dir, report, table(report), time.monotonic() - start)


def table(report: dict) -> Table:
    what_if = f", what-if {', '.join(report['fabric_params'])}" if report["fabric_params"] else ""
    t = Table(title=f"Loaded latency from {report['hosts']} timed guests in one timeline ({report['fabric']} fabric"
                    f"{what_if}, quantum {report['quantum_ns']:,} ns): host 0's cold chase beside "
                    f"{report['hosts'] - 1} paced streams", title_justify="left")
    for col in ("traffic gap (ticks a line)", f"traffic GB/s ({LABEL})", f"chase p50 ns ({LABEL})",
                f"chase mean ns ({LABEL})", "offline model mean ns (same streams)", "guest / model", ""):
        t.add_column(col)
    for p in report["points"]:
        ratio = p["chase_mean_ns"] / p["model_mean_ns"] if p["model_mean_ns"] else None
        t.add_row("alone" if p["gap_ticks"] is None else str(p["gap_ticks"]), f"{p['traffic_gbs']:.2f}",
                  f"{p['chase_p50_ns']:.1f}", f"{p['chase_mean_ns']:.1f}", f"{p['model_mean_ns']:.1f}",
                  f"{ratio:.3f}" if ratio else "-",
                  "" if p["traffic_outlasted_chase"] else "[yellow]traffic ended first[/yellow]")
    return t
