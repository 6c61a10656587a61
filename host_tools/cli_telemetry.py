"""A timed appliance's fabric telemetry on the terminal: `pfcxl appliance top` (live, or --once /
--count N as text), `pfcxl appliance stats --json`, and the tables `pfcxl multihost --timing
trace` and `pfcxl run` (against a timed appliance) print after their command.

Every latency and utilisation here is modelled (device/fabric_telemetry.py), labelled with the
model it comes from. The one wall-clock figure, traced bytes per second in `top`, is the
emulator's rate (TCG), labelled so: it says how fast the guests run, not how fast a fabric is.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Group
from rich.table import Table

from pfcxl.device.units import human
from pfcxl.errors import PfcxlError

from . import appliance
from .ui import err, out


def _lat(entry: dict, system: str, op: str) -> str:
    p = entry["latency_ns"].get(system, {}).get(op, {})
    return f"{p['p50']} / {p['p99']}" if p.get("count") else "-"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _rate(now: dict, before: dict | None, seconds: float) -> str:
    if before is None or seconds <= 0:
        return "-"
    return f"{human(max(now['bytes'] - before['bytes'], 0) / seconds)}/s"


def headline(stats: dict) -> str:
    a, labels = stats["appliance"], stats["labels"]
    rings = stats["rings"]
    models = " and ".join(labels[m] for m in stats["models"])
    return (f"appliance '{a['topology']}' (pid {stats['pid']}): {models}, {stats['issue']} issue; "
            f"{stats['windows']} windows, {stats['records']:,} CXL requests modelled"
            + (f", {stats['unmapped']:,} outside the pool" if stats["unmapped"] else "")
            + f"; rings: largest fill {rings['largest_fill']:,} of {rings['capacity']:,} records "
            f"({_pct(rings['largest_fill_fraction'])}), {rings['dropped']} dropped"
            + (f"; [red]timing failed: {stats['error']}[/red]" if stats.get("error") else ""))


def tables(stats: dict, before: dict | None = None, seconds: float = 0.0) -> list[Table]:
    """Per host and per module: traffic, modelled p50 / p99 latency, HBM hit rate, utilisation."""
    main = stats["models"][0]
    label = stats["labels"][main]
    hbm = "pf_hbm" in stats["models"]
    prev = {(k, e[k]): e for k in ("host", "module") for e in (before or {}).get(f"{k}s", [])}
    out = []
    for kind in ("host", "module"):
        t = Table(title=f"per {kind} ({label}; latencies in ns, modelled)", title_justify="left")
        cols = [kind] + (["port"] if kind == "host" else []) + [
            "reads", "writes", "traffic", "traced/s (emulator wall clock)",
            "read p50 / p99", "write p50 / p99"]
        cols += ["PF+HBM3E read p50 / p99", "HBM3E hit rate"] if hbm else []
        cols += ["busiest link (modelled utilisation)"] + (["port util. up / down"] if kind == "host" and
                                                           main.startswith("pf") else [])
        cols += ["ring largest fill"] if kind == "host" else []
        for c in cols:
            t.add_column(c, justify="right")
        for e in stats[f"{kind}s"]:
            util = e["utilisation"].get(main) or {}
            busiest = util.get("busiest")
            row = [str(e[kind])] + ([str(e.get("port", "-"))] if kind == "host" else []) + [
                f"{e['reads']:,}", f"{e['writes']:,}", human(e["bytes"]), _rate(e, prev.get((kind, e[kind])), seconds),
                _lat(e, main, "read"), _lat(e, main, "write")]
            row += [_lat(e, "pf_hbm", "read"), _pct(e["hbm_hit_rate"])] if hbm else []
            row += [f"{busiest} {_pct(util[busiest])}" if busiest else "-"]
            if kind == "host" and main.startswith("pf"):
                row += [f"{_pct(util.get('port_up'))} / {_pct(util.get('port_down'))}"]
            if kind == "host":
                ring = e.get("ring") or {}
                row += [f"{ring.get('largest_fill', 0):,}" + ("" if e.get("attached") else " (detached)")]
            t.add_row(*row)
        out.append(t)
    return out


def render(stats: dict, before: dict | None = None, seconds: float = 0.0) -> Group:
    return Group(headline(stats), *tables(stats, before, seconds))


def fetch(run_dir: Path, sync: bool) -> dict:
    with appliance.Client(run_dir, timeout=300) as client:
        return client.call("stats", sync=sync)


def show(stats: dict, report: str | None = None) -> None:
    """After a command: the tables, on stderr like pfcxl run's timing report; JSON to `report`."""
    err.print(render(stats))
    if report:
        Path(report).write_text(json.dumps(stats, indent=1))


def host_figures(vm) -> dict | None:
    """A Machine on a timed appliance: the appliance's figures once its trace is modelled; None
    for any other Machine."""
    if vm.attachment is None or vm.attachment.ring_fd is None:
        return None
    return vm.appliance_stats(sync=True)


def cmd_stats(args, run_dir: Path) -> int:
    stats = fetch(run_dir, sync=True)
    if args.json:
        print(json.dumps(stats, indent=1))
    else:
        out.print(render(stats))
    return 0


def cmd_top(args, run_dir: Path) -> int:
    if args.count is not None and args.count < 1:
        raise PfcxlError(f"--count {args.count}: at least 1 snapshot")
    if args.once or args.count is not None:
        before, at = None, time.monotonic()
        for i in range(1 if args.once else args.count):
            if i:
                time.sleep(args.interval)
            stats, now = fetch(run_dir, sync=True), time.monotonic()
            out.print(render(stats, before, now - at))
            before, at = stats, now
        return 0
    from rich.live import Live
    stats, at = fetch(run_dir, sync=False), time.monotonic()
    with Live(render(stats), console=out, refresh_per_second=4, screen=False) as live:
        try:
            while True:
                time.sleep(args.interval)
                new, now = fetch(run_dir, sync=False), time.monotonic()
                live.update(render(new, stats, now - at))
                stats, at = new, now
        except KeyboardInterrupt:
            pass
    return 0


def add_parsers(asub, base, run_dir_of) -> None:
    """`appliance top` and `appliance stats` (base() adds --topology and --run-dir, run_dir_of(args)
    is the appliance's run directory)."""
    p = base(asub.add_parser("top", help="live view of a timed appliance's modelled fabric (refreshed every second)",
                             description="Per host and per module: CXL traffic, modelled p50/p99 latency, HBM3E "
                             "hit rate and link utilisation, from an appliance started with --timing."))
    p.add_argument("--once", action="store_true", help="print one text snapshot and exit")
    p.add_argument("--count", type=int, help="print N text snapshots, --interval apart, and exit")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    p.set_defaults(func=lambda args: cmd_top(args, _checked(args, run_dir_of)))
    p = base(asub.add_parser("stats", help="a timed appliance's fabric telemetry (as `top`, once)"))
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.set_defaults(func=lambda args: cmd_stats(args, run_dir_of(args)))


def _checked(args, run_dir_of) -> Path:
    if not args.interval > 0:
        raise PfcxlError(f"--interval {args.interval}: must be more than 0 seconds")
    return run_dir_of(args)
