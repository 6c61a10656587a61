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
from rich.markup import escape
from rich.table import Table

from pfcxl.device import fabric_constants as fc
from pfcxl.device.units import amount
from pfcxl.errors import PfcxlError

from . import appliance
from .ui import err, out


def _lat(entry: dict, system: str, op: str) -> str:
    p = entry["latency_ns"].get(system, {}).get(op, {})
    return f"{p['p50']} / {p['p99']}" if p.get("count") else "-"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _rate(now: dict, before: dict | None, seconds: float) -> str:
    if before is None or seconds <= 0:
        return "-"
    return f"{amount(max(now['bytes'] - before['bytes'], 0) / seconds)}/s"


def headline(stats: dict) -> str:
    a, labels = stats["appliance"], stats["labels"]
    rings, capture = stats["rings"], stats.get("capture")
    models = " and ".join(labels[m] for m in stats["models"])
    return (f"appliance '{a['topology']}' (pid {stats['pid']}): {models}, {stats['issue']} issue; "
            f"{stats['windows']} windows, {stats['records']:,} CXL requests modelled"
            + (f", {stats['unmapped']:,} outside the pool" if stats["unmapped"] else "")
            + f"; rings: largest fill {rings['largest_fill']:,} of {rings['capacity']:,} records "
            f"({_pct(rings['largest_fill_fraction'])}), {rings['dropped']} dropped"
            + (f", {rings['implausible']:,} implausible records refused" if rings.get("implausible") else "")
            + "".join(f"; [red]host {c['host']}'s ring detached: {escape(c['why'])}[/red]" for c in rings.get("cut", []))
            + (f"; [red]capture incomplete: {escape(capture['error'])}[/red]" if capture and capture.get("error") else "")
            + (f"; [red]timing failed: {stats['error']}[/red]" if stats.get("error") else ""))


def tables(stats: dict, before: dict | None = None, seconds: float = 0.0) -> list[Table]:
    """Per host and per module: traffic, modelled p50 / p99 latency, HBM hit rate, utilisation."""
    main = stats["models"][0]
    hbm, pf = "pf_hbm" in stats["models"], main.startswith("pf")
    prev = {(k, e[k]): e for k in ("host", "module") for e in (before or {}).get(f"{k}s", [])}
    caption = (f"latency p50 / p99 (ns) and utilisation: {stats['labels'][main]}"
               + (f"; +HBM: {stats['labels']['pf_hbm']}" if hbm else "")
               + (f"; the paper's loaded PF range: reads {fc.PF_PAPER_LOADED_READ_NS[0]}-"
                  f"{fc.PF_PAPER_LOADED_READ_NS[1]} ns, writes {fc.PF_PAPER_LOADED_WRITE_NS[0]}-"
                  f"{fc.PF_PAPER_LOADED_WRITE_NS[1]} ns" if pf else "")
               + "; traffic: CXL requests traced, 64 B each"
               + (f"; {stats['scope']}" if stats.get("scope") else "")
               + ("; /s: per second of the emulator's wall clock (TCG), not a fabric rate" if before else ""))
    out = []
    for kind in ("host", "module"):
        t = Table(title=f"per {kind} (modelled)", title_justify="left", caption=caption if kind == "module" else None,
                  caption_justify="left")
        cols = [kind] + (["port"] if kind == "host" else []) + ["reads", "writes", "traffic"]
        cols += ["traced/s"] if before else []
        cols += ["read", "write"] + (["+HBM read", "HBM hit"] if hbm else []) + ["busiest link"]
        cols += (["port up/down"] if pf else []) + ["ring fill"] if kind == "host" else []
        for c in cols:
            t.add_column(c, justify="right")
        for e in stats[f"{kind}s"]:
            util = e["utilisation"].get(main) or {}
            busiest = util.get("busiest")
            row = [str(e[kind])] + ([str(e.get("port", "-"))] if kind == "host" else []) + [
                f"{e['reads']:,}", f"{e['writes']:,}", amount(e["bytes"])]
            row += [_rate(e, prev.get((kind, e[kind])), seconds)] if before else []
            row += [_lat(e, main, "read"), _lat(e, main, "write")]
            row += [_lat(e, "pf_hbm", "read"), _pct(e["hbm_hit_rate"])] if hbm else []
            row += [f"{busiest} {_pct(util[busiest])}" if busiest else "-"]
            if kind == "host":
                row += [f"{_pct(util.get('port_up'))} / {_pct(util.get('port_down'))}"] if pf else []
                ring = e.get("ring") or {}
                gone = " (cut)" if ring.get("cut") else "" if e.get("attached") else " (gone)"
                row += [f"{ring.get('largest_fill', 0):,}{gone}"]
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
    return for_host(vm.appliance_stats(sync=True), vm.attachment.host)


def for_host(stats: dict, host: int) -> dict:
    """The figures one host's command reports: its own row of the host table (the appliance also
    keeps the rows of hosts that came and went), and the modules, which carry everyone's traffic."""
    return {**stats, "hosts": [h for h in stats["hosts"] if h["host"] == host],
            "scope": f"host {host} only; the modules carry every host's traffic since the appliance started"}


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
    p = base(asub.add_parser("stats", help="a timed appliance's fabric telemetry (as `top`, once)",
                             description="Print the modelled fabric telemetry of an appliance started with "
                             "--timing once, after it has modelled every record its hosts wrote so far: per "
                             "host and per module traffic, modelled latency, HBM3E hit rate, utilisation."))
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.set_defaults(func=lambda args: cmd_stats(args, run_dir_of(args)))


def _checked(args, run_dir_of) -> Path:
    if not args.interval > 0:
        raise PfcxlError(f"--interval {args.interval}: must be more than 0 seconds")
    return run_dir_of(args)
