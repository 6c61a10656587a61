"""A timed appliance's fabric telemetry on the terminal: `pfcxl appliance top` (live, or --once /
--count N as text), `pfcxl appliance stats --json`, and the tables `pfcxl multihost --timing
trace` and `pfcxl run` (against a timed appliance) print after their command.

Every latency and utilisation here is modelled (device/fabric/telemetry.py), labelled with the
model it comes from. The one wall-clock figure, traced bytes per second in `top`, is the
emulator's rate (TCG), labelled so: it says how fast the guests run, not how fast a fabric is.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pfcxl.errors import PfcxlError
from pfcxl.host_tools import timeouts
from pfcxl.host_tools.ui import err, out


def render(*args):
    """The figures' tables (host_tools/timing/telemetry_view.py, with rich.table), imported when shown."""
    from pfcxl.host_tools.timing.telemetry_view import render as tables
    return tables(*args)


def fetch(service, sync: bool) -> dict:
    """The stats of `service`, a pfcxl.Appliance (with `sync`: once all its hosts wrote is modelled)."""
    return service.call("stats", sync=sync, timeout=timeouts.STATS_SYNC_S)


def show(stats: dict, report: str | None = None) -> None:
    """After a command: the tables, on stderr like pfcxl run's timing report; JSON to `report`."""
    err.print(render(stats))
    if report:
        Path(report).write_text(json.dumps(stats, indent=1))


def cmd_stats(args, service) -> int:
    stats = fetch(service, sync=True)
    if args.json:
        print(json.dumps(stats, indent=1))
    else:
        out.print(render(stats))
    return 0


def cmd_top(args, service) -> int:
    if args.count is not None and args.count < 1:
        raise PfcxlError(f"--count {args.count}: at least 1 snapshot")
    if args.once or args.count is not None:
        before, at = None, time.monotonic()
        for i in range(1 if args.once else args.count):
            if i:
                time.sleep(args.interval)
            stats, now = fetch(service, sync=True), time.monotonic()
            out.print(render(stats, before, now - at))
            before, at = stats, now
        return 0
    from rich.live import Live
    stats, at = fetch(service, sync=False), time.monotonic()
    with Live(render(stats), console=out, refresh_per_second=4, screen=False) as live:
        try:
            while True:
                time.sleep(args.interval)
                new, now = fetch(service, sync=False), time.monotonic()
                live.update(render(new, stats, now - at))
                stats, at = new, now
        except KeyboardInterrupt:
            pass
    return 0


def add_parsers(asub, base, service_of) -> None:
    """`appliance top` and `appliance stats` (base() adds --topology and --run-dir, service_of(args)
    is the pfcxl.Appliance they name)."""
    p = base(asub.add_parser("top", help="live view of a timed appliance's modelled fabric and timeline (refreshed every second)",
                             description="Per host and per module: CXL traffic, modelled p50/p99 latency, HBM3E "
                             "hit rate and link utilisation, from an appliance started with --fabric; and, from "
                             "one started with --clock virtual, its timeline: the virtual time reached, the "
                             "quantum, and per timed host its state, lag, barrier waits and contention charge."))
    p.add_argument("--once", action="store_true", help="print one text snapshot and exit")
    p.add_argument("--count", type=int, help="print N text snapshots, --interval apart, and exit")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    p.set_defaults(func=lambda args: cmd_top(args, _checked(args, service_of)))
    p = base(asub.add_parser("stats", help="a timed appliance's fabric telemetry (as `top`, once)",
                             description="Print the modelled fabric telemetry of an appliance started with "
                             "--timing once, after it has modelled every record its hosts wrote so far: per "
                             "host and per module traffic, modelled latency, HBM3E hit rate, utilisation; and the timeline "
                             "of one started with --clock virtual."))
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.set_defaults(func=lambda args: cmd_stats(args, service_of(args)))


def _checked(args, service_of):
    if not args.interval > 0:
        raise PfcxlError(f"--interval {args.interval}: must be more than 0 seconds")
    return service_of(args)
