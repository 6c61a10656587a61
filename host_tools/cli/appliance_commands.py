"""`pfcxl appliance start|stop|status|where|top|stats` and `pfcxl multihost` (which imports the boot
modules when it runs: the parser stays light, see host_tools/cli/main.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from rich.markup import escape

from pfcxl.device.topology import data_path
from pfcxl.device import topology
from pfcxl.device.topology.units import human
from pfcxl.errors import PfcxlError

from pfcxl.device.appliance import timeline
from pfcxl.device.fabric.modes import ISSUES, APPLIANCE_FABRICS
from pfcxl.host_tools.timing import CLOCKS

from pfcxl.host_tools.vm import boot_options
from pfcxl.host_tools.cli import telemetry as cli_telemetry
from pfcxl.host_tools import argtypes, timeouts
from pfcxl.host_tools.ui import err, out, write_output

DEFAULT_APPLIANCE = "pf-appliance"


def _topology(args) -> tuple[topology.Topology, Path]:
    path = topology.resolve(args.topology or DEFAULT_APPLIANCE)
    return topology.load(path), path


def _dir(args, topo: topology.Topology) -> Path:
    from pfcxl.host_tools import appliance_client as appliance
    return Path(args.run_dir) if args.run_dir else appliance.default_dir(topo)


def _service(args, **options):
    """The pfcxl.Appliance these options name (its run directory: --run-dir or the default)."""
    from pfcxl.appliance import Appliance
    topo, path = _topology(args)
    return Appliance(path, run_dir=_dir(args, topo), **options)


def cmd_start(args) -> int:
    if args.quantum is not None and args.clock != "virtual":
        raise PfcxlError("--quantum is the timeline's, for timed hosts: give --clock virtual too")
    quantum = (args.quantum or timeline.DEFAULT_QUANTUM_NS) if args.clock == "virtual" else None
    service = _service(args, foreground=args.foreground, scan_interval=args.scan_interval,
                       idle_timeout=args.idle_timeout, fabric=args.fabric, issue=args.issue, capture=args.capture,
                       quantum_ns=quantum)
    from pfcxl.host_tools import appliance_client as appliance
    pid = service.serve()
    topo, run_dir = service.topology, service.directory
    a = topo.appliance
    assert a is not None                    # appliance.start() refuses a topology without one
    out.print(f"appliance '{topo.name}' running (pid {pid}): {a.modules} modules x {human(a.module_capacity)}, "
              f"{a.ports} ports, shared {human(a.shared)}, private {human(a.private)} per host, {a.backing}"
              + (f"; timing every host's traffic on the {args.fabric} model ({args.issue} issue)"
                 if args.fabric else "")
              + (f"; keeping every host's drained records in {args.capture}" if args.capture else "")
              + (f"; its timed hosts (--clock virtual) share one timeline in quanta of {quantum:,} ns"
                 if quantum else ""))
    out.print(f"socket {run_dir / appliance.SOCKET}, log {run_dir / appliance.LOG}", highlight=False)
    return 0


def cmd_stop(args) -> int:
    out.print(_service(args).stop())
    return 0


def cmd_status(args) -> int:
    status = _service(args).status()
    if args.json:
        print(json.dumps(status, indent=1))
        return 0
    from rich.table import Table
    a = status["appliance"]
    out.print(f"appliance '{a['topology']}' (pid {status['pid']}, {a['backing']}, incarnation {status['incarnation']}, "
              f"pool {status['pool_id']}): {a['modules']} modules, "
              f"{a['ports']} ports, granularity {human(a['granularity'])}")
    m = Table(title="memory modules", title_justify="left")
    for col in ("module", "capacity", "HBM cache", "bytes mapped", "bytes changed"):
        m.add_column(col, justify="right")
    for mod in status["modules"]:
        m.add_row(str(mod["module"]), human(mod["capacity"]), human(mod["hbm_cache"]),
                  f"{mod['bytes_mapped']:,}", f"{mod['bytes_changed']:,}")
    out.print(m)
    p = Table(title="ports", title_justify="left")
    for col in ("port", "host", "private slot", "bytes mapped", "attached for"):
        p.add_column(col, justify="right")
    hosts = {h["host"]: h for h in status["hosts"]}
    for port in status["ports"]:
        h = hosts.get(port["host"]) if port["host"] is not None else None
        p.add_row(str(port["port"]), "-" if h is None else str(h["host"]),
                  "-" if h is None or h["private_slot"] is None else str(h["private_slot"]),
                  "-" if h is None else f"{h['bytes_mapped']:,}",
                  "-" if port["since"] is None else f"{time.time() - port['since']:.0f}s")
    out.print(p)
    for h in status.get("previous_incarnations", []):
        memory = "the same pool memory" if h["same_memory"] else "memory this appliance does not own (lost to it)"
        err.print(f"[yellow]host {h['host']} (pid {h['pid']}, port {h['port']}) is still attached to incarnation "
                  f"{h['incarnation']} of this appliance, and maps {memory}[/yellow]")
    scan = status["scan"]
    out.print(f"[dim]bytes changed: granules whose contents changed between scans, every {scan['interval']}s "
              f"(last scan took {scan['seconds']}s)[/dim]")
    return 0


def cmd_where(args) -> int:
    try:
        offset = int(args.offset, 0)
    except ValueError as exc:
        raise PfcxlError(f"offset '{args.offset}' is not a number (decimal or 0x hex)") from exc
    w = _service(args).where(offset)
    out.print(f"pool offset {w['offset']:#x}: module {w['module']} at module offset {w['module_offset']:#x}; "
              f"region {w['region']} at {w['region_offset']:#x}")
    return 0


def cmd_multihost(args) -> int:
    from pfcxl.host_tools.fleet import multihost           # the Machine and QEMU modules, for this command alone
    if not args.command:
        raise PfcxlError("pfcxl multihost: give a command after --, e.g. pfcxl multihost -n 4 -- cxl list")
    topo, path = _topology(args)
    topo = data_path.with_data_path(topo, args.data_path)
    from pfcxl.host_tools.vm.console import check_syntax
    check_syntax(multihost.expand(args.command, 0, args.hosts))    # before N boots (of the busybox image)
    start = time.monotonic()

    def host_done(r: multihost.HostResult) -> None:
        state = "[red]failed[/red]" if r.error or r.status else "[green]ok[/green]"
        err.print(f"  host {r.host:2} (port {r.port:2}): {state} ready in {r.ready_seconds:.1f}s"
                  + (f", exit {r.status}" if r.status is not None else ""))

    options = boot_options.from_args(args)
    if args.clock == "virtual":
        if args.timing:
            raise PfcxlError("--clock virtual times each host in its own virtual clock; the appliance's "
                             "--timing models all hosts together in emulator time, and one timeline for "
                             "both is not there yet: drop one of them")
        options = dataclasses.replace(options, fabric=args.fabric)
    figures: dict = {}
    if args.quantum is not None and args.clock != "virtual":
        raise PfcxlError("--quantum is the timeline's, for timed hosts: give --clock virtual too")
    results = multihost.run(topo, path, args.hosts, args.command, quantum_ns=args.quantum,
                            appliance_dir=Path(args.appliance_dir) if args.appliance_dir else None,
                            ready_timeout=args.timeout, command_timeout=args.command_timeout,
                            parallel_boots=args.parallel_boots, say=lambda m: err.print(f"[dim]{escape(m)}[/dim]"),
                            host_done=host_done, fabric=args.fabric if args.timing else None, issue=args.issue,
                            telemetry=figures.update, capture=Path(args.capture) if args.capture else None,
                            options=options)
    for r in results:
        out.print(f"== host {r.host} (port {r.port}, exit {r.status if r.status is not None else '-'})",
                  highlight=False)
        if r.error:
            out.print(escape(r.error), highlight=False)
        elif r.data:        # byte for byte, ending a line so the next host's header starts one
            write_output(r.data if r.data.endswith(b"\n") else r.data + b"\n")
    if figures:
        cli_telemetry.show(figures, args.report)
    failed = [r.host for r in results if r.error or r.status]
    err.print(f"{len(results) - len(failed)} of {len(results)} hosts ok, {time.monotonic() - start:.1f}s wall"
              + (f"; failed: {', '.join(map(str, failed))}" if failed else ""))
    return 1 if failed else 0


def add_parsers(sub, common) -> None:
    ap = sub.add_parser("appliance", help="the appliance service that owns the pooled memory",
                        description="Start, stop and inspect the appliance service: one background process "
                        "that owns the pool (16 modules, 16 ports in pf-appliance) and hands its memory to "
                        "hosts over a unix socket.")
    asub = ap.add_subparsers(dest="appliance_cmd", metavar="ACTION", required=True)

    def base(p):
        p.add_argument("--topology", "-t", help=f"topology with an [appliance] section (default {DEFAULT_APPLIANCE})")
        p.add_argument("--run-dir", help="socket, pid file, log (and persistent pool files); "
                       "default $PFCXL_CACHE/appliance/<topology name>")
        return p

    p = base(asub.add_parser("start", help="start in the background (pid file, log, socket 0600)",
                             description="Start the appliance of the topology in the background: it creates the "
                             "pool's partitions, listens on a socket in its run directory and hands each host "
                             "that attaches its memory. Hosts attach by booting with the topology (pfcxl run, "
                             "multihost, or Machine(host=N))."))
    p.add_argument("--foreground", action="store_true", help="run in this terminal, logging to stderr")
    p.add_argument("--scan-interval", type=float, default=5.0, help="seconds between change scans (default 5)")
    p.add_argument("--idle-timeout", type=float, help="seconds a connection without an attachment may stay "
                   "silent before the service closes it (default 60)")
    p.add_argument("--fabric", choices=tuple(APPLIANCE_FABRICS), help="time every attached host's traffic: load the TCG "
                   "plugin in each, drain their trace rings here and model all hosts' traffic together on this "
                   "fabric system (default: off; see 'appliance top' and docs/appliance-timing.md)")
    argtypes.old_spelling(p, "--timing", "--fabric", choices=tuple(APPLIANCE_FABRICS))
    p.add_argument("--issue", choices=ISSUES, default="dependent", help="--fabric: each vCPU's requests "
                   "wait for the previous one (dependent, a pointer chase; default) or not (independent)")
    p.add_argument("--capture", metavar="DIR", help="--fabric: keep every host's drained trace records and a "
                   "manifest in DIR (absent or empty; the manifest says complete once the appliance stops; "
                   "docs/appliance-timing.md)")
    p.add_argument("--clock", choices=CLOCKS, default="emulator", help="virtual: keep the hosts "
                   "that boot with --clock virtual in one virtual timeline, so their requests queue behind each "
                   "other's in their own clocks (docs/virtual-time.md); hosts on the emulator's clock stay out")
    p.add_argument("--quantum", type=int, metavar="NS", help="--clock virtual: the timeline's quantum, in ns of "
                   f"virtual time ({timeline.MIN_QUANTUM_NS} to {timeline.MAX_QUANTUM_NS:,}; default "
                   f"{timeline.DEFAULT_QUANTUM_NS})")
    p.set_defaults(func=cmd_start)
    base(asub.add_parser("stop", help="stop it (or clean up after a crashed one)",
                         description="Stop the running appliance of the topology (shut its hosts down "
                         "first: their memory goes with it); with none running, remove what a crashed one "
                         "left (socket, pid file, its shm pool).")).set_defaults(func=cmd_stop)
    p = base(asub.add_parser("status", help="modules, ports, attached hosts, bytes mapped and changed",
                             description="Ask the running appliance what it holds: its modules and ports, the "
                             "hosts attached and the bytes each has mapped, and how many bytes changed between "
                             "its last scans."))
    p.add_argument("--json", action="store_true", help="the raw status reply")
    p.set_defaults(func=cmd_status)
    p = base(asub.add_parser("where", help="which module serves a pool offset",
                             description="Name the memory module (and the offset inside it) that serves a byte "
                             "of the pool, from the appliance's interleave of the pool over its modules. Example: "
                             "pfcxl appliance where 0x40001000"))
    p.add_argument("offset", help="pool offset (decimal or 0x hex)")
    p.set_defaults(func=cmd_where)
    cli_telemetry.add_parsers(asub, base, _service)

    p = sub.add_parser("multihost", help="boot N hosts on one appliance, run a command in each",
                       description="Boot N guests attached to one appliance (hosts 0..N-1), two per CPU at a time "
                       "(ready ones paused until the last is ready), run "
                       "CMD in each with {host} and {hosts} replaced, and print every host's output. "
                       "Uses the running appliance of the topology, or starts a temporary one.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", "-n", type=argtypes.count, required=True, help="number of hosts")
    p.add_argument("--topology", "-t", help=f"default {DEFAULT_APPLIANCE}")
    boot_options.add_arguments(p, ("appliance",), spellings={"appliance": ("--run-dir",)},
                               helps={"appliance": "the run directory of a running appliance to use (as for "
                                      "appliance and kv commands)"})
    argtypes.old_spelling(p, "--appliance-dir", "--run-dir")
    p.add_argument("--timeout", type=argtypes.seconds, default=timeouts.FLEET_READY_S,
                   help=f"seconds for all guests to be ready (default {timeouts.FLEET_READY_S})")
    boot_options.add_arguments(p, ("data_path",))
    p.add_argument("--command-timeout", type=argtypes.seconds, default=timeouts.FLEET_COMMAND_S,
                   help=f"seconds for the command (default {timeouts.FLEET_COMMAND_S})")
    p.add_argument("--parallel-boots", type=argtypes.count, help="guests booting at once (default: two per CPU)")
    p.add_argument("--timing", choices=("trace",), help="trace every host's CXL requests into the appliance, "
                   "which models them together; prints per-host and per-module modelled latency, utilisation, "
                   "HBM3E hit rate and ring fill (a temporary appliance is started timed; a running one must be)")
    p.add_argument("--fabric", choices=tuple(APPLIANCE_FABRICS), default="pf", help="--timing with a temporary appliance: the "
                   "fabric it models (default pf)")
    p.add_argument("--issue", choices=ISSUES, default="dependent", help="--timing with a temporary appliance: "
                   "dependent (default) or independent issue")
    p.add_argument("--report", help="--timing: also write the appliance's figures as JSON to this file")
    p.add_argument("--capture", metavar="DIR", help="--timing: keep every host's drained trace records and its "
                   "plugin phases in DIR (absent or empty; a temporary appliance completes the manifest as it "
                   "stops, a running one must have been started with this --capture)")
    # --fabric above: the fabric each timed host is charged by too
    boot_options.add_arguments(p, boot_options.OWN_QEMU + ("clock", "fabric_params"))
    p.add_argument("--quantum", type=int, metavar="NS", help="--clock virtual: the hosts share one timeline in "
                   f"quanta of NS ns of virtual time ({timeline.MIN_QUANTUM_NS} to {timeline.MAX_QUANTUM_NS:,}; "
                   f"default {timeline.DEFAULT_QUANTUM_NS}, or a running appliance's own)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command for each guest")
    p.set_defaults(func=cmd_multihost)
