"""What appliance-side timing costs, in one run: a timed appliance is started, N hosts run a
command on it (`pfcxl multihost --timing trace`), and the appliance's CPU time (utime + stime of
its process, /proc/PID/stat) is set against the guests' (their QEMU processes), twice: over the
whole run (boots included; the guests' from getrusage(RUSAGE_CHILDREN) once they are reaped), and
over the command alone (from multihost saying it starts the command to all hosts having finished
it, QEMU processes read live; the appliance's until it has modelled everything). It also prints
each host's modelled read p50, the largest ring fill and drops, and `appliance top --once` as text.

    python -m pfcxl.host_tools.experiments.appliance_timing -n 16 -- chase --dax /dev/dax0.0 --loads 20000
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from pfcxl.device import topology
from pfcxl.process import cpu_seconds, proc_stat

from pfcxl.appliance import Appliance

from pfcxl.host_tools.fleet import multihost
from pfcxl.host_tools.timing import telemetry_view

DEFAULT_COMMAND = "chase --dax /dev/dax0.0 --loads 20000"


def qemu_seconds() -> float:
    """utime + stime of this process's live QEMU children."""
    total = 0.0
    for entry in os.listdir("/proc"):
        stat = proc_stat(int(entry)) if entry.isdigit() else None
        if stat is not None and stat.comm.startswith("qemu-system") and stat.ppid == os.getpid():
            total += stat.cpu_seconds
    return total


def children_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(hosts: int, command: str, fabric: str = "pf", topo_name: str = "pf-appliance") -> dict:
    path = topology.resolve(topo_name)
    topo = topology.load(path)
    # a temporary service (dies with this process, removes its directory), used by multihost as a running one
    with Appliance(path, run_dir=tempfile.mkdtemp(prefix="pfcxl-bench-timing-"), fabric=fabric, scan_interval=3600,
                   temporary=True) as service:
        pid, run_dir = service.pid, service.directory
        assert pid is not None                          # started by `with`
        app0, kids0, wall0 = cpu_seconds(pid), children_seconds(), time.monotonic()
        figures: dict = {}
        marks: dict[str, tuple[float, float]] = {}     # multihost's step -> (appliance, guests) CPU s

        def say(message: str) -> None:
            print(f"  {message}", file=sys.stderr, flush=True)
            for step in ("running the command", "modelling what is left"):
                if step in message:
                    marks[step] = (cpu_seconds(pid), qemu_seconds())
        results = multihost.run(topo, path, hosts, command, appliance_dir=run_dir, fabric=fabric,
                                telemetry=figures.update, say=say)
        app1, kids1, wall = cpu_seconds(pid), children_seconds(), time.monotonic() - wall0
        (app_a, guests_a), (_, guests_b) = marks["running the command"], marks["modelling what is left"]
    failed = [r.host for r in results if r.error or r.status]
    text = io.StringIO()
    Console(file=text, width=160, color_system=None).print(telemetry_view.render(figures))
    main = figures["models"][0]
    return {"hosts": hosts, "command": command, "failed": failed, "wall_s": wall,
            "appliance_cpu_s": app1 - app0, "guests_cpu_s": kids1 - kids0,
            "appliance_over_guests": (app1 - app0) / max(kids1 - kids0, 1e-9),
            "command_appliance_cpu_s": app1 - app_a, "command_guests_cpu_s": guests_b - guests_a,
            "command_appliance_over_guests": (app1 - app_a) / max(guests_b - guests_a, 1e-9),
            "records": figures["records"], "windows": figures["windows"],
            "read_p50_ns": {h["host"]: h["latency_ns"][main]["read"].get("p50") for h in figures["hosts"]},
            "rings": figures["rings"], "top": text.getvalue()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pfcxl.host_tools.experiments.appliance_timing", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--hosts", type=int, default=4)
    ap.add_argument("--fabric", choices=("pf", "electrical"), default="pf")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("command", nargs=argparse.REMAINDER, help=f"-- the command per host (default: {DEFAULT_COMMAND})")
    args = ap.parse_args(argv)
    command = " ".join(args.command[1:] if args.command[:1] == ["--"] else args.command) or DEFAULT_COMMAND
    r = run(args.hosts, command, args.fabric)
    print(r["top"])
    print(f"{r['hosts']} hosts ran `{command}`; failed: {r['failed'] or 'none'}; wall {r['wall_s']:.1f}s "
          "(boots included)")
    print(f"CPU, whole run: appliance {r['appliance_cpu_s']:.2f}s, guests (QEMU) {r['guests_cpu_s']:.1f}s: "
          f"the appliance used {100 * r['appliance_over_guests']:.2f}% of the guests' CPU time")
    print(f"CPU, the command: appliance {r['command_appliance_cpu_s']:.2f}s (its modelling included), guests "
          f"{r['command_guests_cpu_s']:.2f}s: {100 * r['command_appliance_over_guests']:.1f}%")
    print(f"modelled {r['records']:,} requests in {r['windows']} windows; largest ring fill "
          f"{r['rings']['largest_fill']:,} of {r['rings']['capacity']:,} ({100 * r['rings']['largest_fill_fraction']:.1f}%), "
          f"dropped {r['rings']['dropped']}")
    print("modelled read p50 per host (ns): " + ", ".join(f"{h}: {p}" for h, p in sorted(r["read_p50_ns"].items())))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    return 1 if r["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
