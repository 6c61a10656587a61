"""The `pfcxl` command. The only place that exits the process or prints tracebacks (--debug)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from pfcxl import __version__
from pfcxl.device import address_map, topology
from pfcxl.device.units import hexaddr, human
from pfcxl.errors import PfcxlError, TopologyError

from pfcxl.firmware_tables import generate as tables_generate

from pfcxl.device import fabric_constants

from . import appliance, cli_appliance, cli_bench, cli_tables, discovery, image, qemu, terminal, timing, timing_report
from .ui import err, out
from .vm import VM, boot_ready


EPILOG = """\
Topologies: give a shipped name (pf-nic, two-hb-interleave, electrical-switch) or a path to a
TOML file; the default is pf-nic. Files are kept in --run-dir (default: a temporary directory,
removed afterwards; kept with its logs when something fails). Setup: 'make setup'.
"""


# --------------------------------------------------------------------------- helpers


def _load(arg: str | None) -> topology.Topology:
    return topology.load(topology.resolve(arg))


@contextlib.contextmanager
def _run_dir(arg: str | None, keep: bool):
    """The directory for backing files and logs: given (kept), or temporary."""
    if arg:
        path = Path(arg)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix="pfcxl-run-"))
    failed = True
    try:
        yield path
        failed = False
    finally:
        if keep or failed:
            # Keep the logs for the error message; sparse backing files too, if asked to keep.
            if not keep:
                for f in path.glob("*.mem"):
                    f.unlink()
            err.print(f"[dim]run directory kept: {path}[/dim]")
        else:
            shutil.rmtree(path)


def _build_image(topo: topology.Topology, cedt_mode: str = "auto", kind: str = "busybox") -> image.BootImage:
    ours = tables_generate.cedt_for_boot(topo, cedt_mode)
    with err.status("building guest image") as status:
        img = image.build(topo, progress=lambda m: status.update(m), acpi_tables={"CEDT": ours} if ours else None,
                          kind=kind)
    if ours:
        err.print("[dim]our CEDT replaces QEMU's (initrd ACPI table upgrade)[/dim]")
    err.print(f"[dim]guest image {img.initrd.name} ({'built' if img.rebuilt else 'cached'}), "
              f"kernel {img.kernel_release}[/dim]")
    return img


@contextlib.contextmanager
def _booted(topo: topology.Topology, args):
    """A ready guest for a command: run directory, appliance attachment (when the topology's
    devices are served by the appliance), VM; all torn down in reverse order."""
    with contextlib.ExitStack() as stack:
        run_dir = stack.enter_context(_run_dir(args.run_dir, keep=args.keep))
        fds = {}
        if any(d.appliance for d in topo.devices):
            where = Path(args.appliance_dir) if args.appliance_dir else appliance.default_dir(topo)
            client = stack.enter_context(appliance.Client(where))
            att = client.attach(args.host)
            err.print(f"[dim]attached as host {att.host} at appliance port {att.port} ({where})[/dim]")
            fds = {d.id: att.region(d.appliance).fd for d in topo.devices if d.appliance}
        img = _build_image(topo, args.cedt, args.image)
        session = None
        if args.timing:
            config = _timing_config(topo, args, img, run_dir)
            session = stack.enter_context(timing.TimingSession(topo, run_dir, config))
        start = time.monotonic()
        with err.status(f"booting {topo.name} under TCG (QEMU start to PFCXL-READY)"):
            vm = stack.enter_context(boot_ready(topo, img, run_dir, extra_cmdline=args.append,
                                               timeout=args.timeout, appliance_fds=fds,
                                               extra_args=session.qemu_args() if session else None))
        if session:
            session.start()
        err.print(f"[dim]{topo.name}: guest ready in {time.monotonic() - start:.1f}s wall "
                  f"({', '.join(r['dax'] + ' ' + r['mode'] for r in vm.ready_info.get('regions', []))})[/dim]")
        yield vm, session


def _timing_config(topo: topology.Topology, args, img, run_dir: Path) -> "timing.TimingConfig":
    if args.timing != "inject":
        return timing.TimingConfig(args.timing)
    profile = args.inject_profile
    baseline = args.baseline_ns
    if baseline is None:
        with err.status("calibrating the emulator's cost per CXL request (a count-mode guest)"):
            baseline = timing.measure_baseline(topo, img, run_dir / "calibrate")["baseline_ns"]
        err.print(f"[dim]emulator baseline: {baseline:.0f} ns per CXL request (TCG overhead, subtracted "
                  "from the modelled latency; nothing is added where the model is below it)[/dim]")
    return timing.TimingConfig("inject", read_ns=fabric_constants.idle_read_ns(profile),
                               write_ns=fabric_constants.idle_write_ns(profile), baseline_ns=baseline)


def _timed_command(command: str) -> str:
    """Bracket a command with the plugin's phase markers; keep its exit status."""
    return f"pfcxl_mark start; {command}; rc=$?; pfcxl_mark stop; (exit $rc)"


# --------------------------------------------------------------------------- commands


def cmd_topology_show(args) -> int:
    topo = _load(args.topology)
    t = Table(title=f"{topo.name}: {topo.description}", title_justify="left")
    for col in ("kind", "id", "attached to", "details"):
        t.add_column(col)
    g = topo.guest
    t.add_row("guest", "-", "-", f"{human(g.memory)} RAM (maxmem {human(g.maxmem)}, {g.slots} slots), "
              f"{g.cpus} vCPU")
    chbs = address_map.chbs_bases(topo)
    for hb in topo.host_bridges:
        t.add_row("host bridge", hb.id, "pcie.0", f"bus_nr {hb.bus_nr}, CHBS {hexaddr(chbs[hb.id])}")
    for rp in topo.root_ports:
        t.add_row("root port", rp.id, rp.host_bridge, f"port {rp.port}, chassis {rp.chassis} slot {rp.slot}")
    for sw in topo.switches:
        t.add_row("switch", sw.id, sw.root_port, f"{len(sw.downstream)} downstream ports")
        for dp in sw.downstream:
            t.add_row("  downstream", dp.id, sw.id, f"port {dp.port}, chassis {dp.chassis} slot {dp.slot}")
    for d in topo.devices:
        t.add_row("type 3 device", d.id, d.port, f"{human(d.volatile)} volatile, serial {d.serial:#x}")
    out.print(t)
    m = Table(title="predicted host physical address map (QEMU 10 q35, Linux 6.12)", title_justify="left")
    for col in ("linux name", "topology", "base", "end", "size", "ways", "granularity"):
        m.add_column(col)
    for p in (address_map.window_placements(topo) + address_map.region_placements(topo)
              + address_map.dax_placements(topo)):
        m.add_row(p.name, p.what, hexaddr(p.base), hexaddr(p.base + p.size - 1), human(p.size),
                  str(p.ways), human(p.granularity))
    out.print(m)
    return 0


def cmd_topology_check(args) -> int:
    for path in args.files:
        topo = topology.load(path)
        out.print(f"{path}: ok ({topo.name}: {len(topo.devices)} devices, {len(topo.windows)} windows, "
                  f"{len(topo.regions)} regions)")
    return 0


def cmd_topology_list(args) -> int:
    for path in topology.shipped_topologies():
        topo = topology.load(path)
        out.print(f"{topo.name:20} {topo.description}")
    return 0


def cmd_qemu_args(args) -> int:
    topo = _load(args.topology)
    run_dir = Path(args.run_dir or "RUN_DIR")
    kernel = initrd = None
    try:
        img = image.build(topo)
        kernel, initrd = img.kernel, img.initrd
    except PfcxlError as exc:
        err.print(f"[yellow]note:[/yellow] guest image not available ({exc}); showing placeholders")
    boot = qemu.BootFiles(kernel or Path("VMLINUZ"), initrd or Path("INITRD"),
                          qemu.kernel_cmdline(topo, args.append))
    # The appliance hands a booting pfcxl one descriptor per served region; QEMU maps it through
    # /proc/self/fd/N. Here N is a named placeholder: the number is only known at attach time.
    served = {d.id: f"APPLIANCE_{d.appliance.upper()}_FD" for d in topo.devices if d.appliance}
    backing = {**qemu.backing_paths(topo, run_dir),
               **{dev_id: f"/proc/self/fd/{fd}" for dev_id, fd in served.items()}}
    argv = qemu.argv(topo, boot, backing, console_fd=3, qmp_fd=4, qemu=qemu.qemu_binary())
    if args.lines:
        out.print("\n".join(argv), markup=False, highlight=False, soft_wrap=True)
    else:
        out.print(qemu.show(argv), markup=False, highlight=False, soft_wrap=True)
    err.print("[dim]fds 3 and 4 are the console and QMP socket pairs pfcxl passes in[/dim]")
    for d in topo.devices:
        if d.appliance:
            err.print(f"[dim]{served[d.id]}: the appliance's {d.appliance} region for device '{d.id}', a "
                      "descriptor pfcxl gets when it attaches to the running appliance[/dim]", highlight=False)
    return 0


def cmd_image(args) -> int:
    topo = _load(args.topology)
    img = _build_image(topo, args.cedt, args.image)
    print(json.dumps({"kernel": str(img.kernel), "initrd": str(img.initrd),
                      "kernel_release": img.kernel_release, "rebuilt": img.rebuilt}))
    return 0


def cmd_boot(args) -> int:
    topo = _load(args.topology)
    with _booted(topo, args) as (vm, session):
        terminal.interact(vm.console_fd, banner=f"pfcxl: {topo.name} console; Ctrl-] leaves and "
                                                "powers the guest off")
    return 0


def cmd_run(args) -> int:
    if not args.command:
        raise PfcxlError("pfcxl run: give a command after --, e.g. pfcxl run -- cxl list -R")
    topo = _load(args.topology)
    command = shlex.join(args.command) if len(args.command) > 1 else args.command[0]
    report = None
    with _booted(topo, args) as (vm, session):
        if session is None:
            result = vm.run(command, timeout=args.command_timeout)
        else:
            start = time.monotonic()
            result = vm.run(_timed_command(command), timeout=args.command_timeout)
            seconds = time.monotonic() - start
            phase = session.wait_phases(1)[-1]
            records = session.stop()
            if args.timing == "trace":
                with err.status(f"modelling {len(records)} CXL requests on the PF and electrical fabrics"):
                    report = timing_report.model_trace(topo, records, dependent=args.issue == "dependent")
                report["emulator"] = timing_report.emulator_cost(len(records), seconds)
            else:
                err.print(f"[dim]plugin ({args.timing}): {json.dumps(phase)}[/dim]", highlight=False)
    sys.stdout.write(result.output)
    sys.stdout.flush()
    if report is not None:
        err.print(timing_report.table(report, f"CXL traffic of: {command}"))
        if args.report:
            Path(args.report).write_text(json.dumps(report, indent=1))
    return result.status


def cmd_demo(args) -> int:
    topo = _load(args.topology)
    with _booted(topo, args) as (vm, session):
        found = discovery.discover(vm)
    checks = discovery.compare(topo, found)
    t = Table(title=f"{topo.name}: what the guest's CXL subsystem found vs. what the topology predicts",
              title_justify="left")
    for col in ("object", "field", "predicted", "guest (cxl list / daxctl / sysfs)", ""):
        t.add_column(col)
    for c in checks:
        t.add_row(c.item, c.field, discovery.format_value(c.field, c.predicted),
                  discovery.format_value(c.field, c.observed), "[green]ok[/green]" if c.ok else "[red]DIFF[/red]")
    out.print(t)
    ports = [f"{p.get('port')} ({p.get('host')})" for p in discovery.flatten_ports(found.get("ports", []))]
    out.print(f"CXL ports: {', '.join(ports) or '-'};  memdevs: "
              f"{', '.join(str(m.get('memdev')) for m in found.get('memdevs', []))}")
    bad = [c for c in checks if not c.ok]
    if bad:
        err.print(f"[red]{len(bad)} of {len(checks)} checks differ from the prediction[/red]")
        return 1
    out.print(f"[green]all {len(checks)} checks match[/green]")
    return 0


def cmd_tables(args) -> int:
    if args.items[:1] == ["decode"]:
        return cli_tables.decode_files(args.items[1:], args.kind)
    if len(args.items) > 1:
        raise PfcxlError(f"pfcxl tables takes one topology, got {' '.join(args.items)} "
                         "(to decode files: pfcxl tables decode FILE...)")
    topo = _load(args.items[0] if args.items else None)
    out_dir = Path(args.out or f"tables-{topo.name}")
    written = tables_generate.write(topo, out_dir)
    t = Table(title=f"{topo.name}: firmware tables in {out_dir}", title_justify="left")
    for col in ("file", "bytes", "what"):
        t.add_column(col)
    for path in written:
        t.add_row(path.name, str(path.stat().st_size), _describe_table_file(path))
    out.print(t)
    if topo.timing is None:
        err.print("[dim]no `timing` in this topology: devices keep QEMU's default CDAT; no generic port "
                  "or HMAT options[/dim]")
    return 0


def _describe_table_file(path: Path) -> str:
    return {".dat": "ACPI CEDT (binary)", ".cdat": "CXL CDAT (binary, for cdat=)",
            ".txt": "decoded dump", ".args": "QEMU options: generic port + HMAT"}.get(path.suffix, "")


# --------------------------------------------------------------------------- parser


def _common(p: argparse.ArgumentParser, boots: bool = False) -> None:
    p.add_argument("--topology", "-t", help="shipped topology name or TOML path (default: pf-nic)")
    p.add_argument("--image", choices=image.IMAGE_KINDS, default="busybox",
                   help="guest image: busybox (default, small) or debian (trixie with python3 and the "
                   "pfcxl_guest module; built once with mmdebstrap)")
    p.add_argument("--cedt", choices=tables_generate.CEDT_MODES, default="auto",
                   help="whose CEDT the guest sees: QEMU's, or ours through the initrd table upgrade; "
                   "auto (default) uses ours only when the topology sets fields QEMU cannot write")
    if boots:
        p.add_argument("--run-dir", help="directory for backing files and logs (kept; reused by a later "
                       "boot, so memory contents persist)")
        p.add_argument("--keep", action="store_true", help="keep the temporary run directory")
        p.add_argument("--timeout", type=float, default=300,
                       help="seconds to wait for the guest to become ready (default 300)")
        p.add_argument("--append", default="", help="extra kernel command line")
        p.add_argument("--host", type=int, default=0,
                       help="host id on the appliance, for topologies whose devices it serves (default 0)")
        p.add_argument("--appliance-dir", help="run directory of the appliance to attach to "
                       "(default: $PFCXL_CACHE/appliance/<topology name>)")
        p.add_argument("--timing", choices=timing.MODES, help="load the TCG plugin: count (CXL requests), "
                       "trace (every request, modelled on the PF and electrical fabrics afterwards) or "
                       "inject (slow the vCPU by the modelled latency)")
        p.add_argument("--inject-profile", choices=tuple(fabric_constants.PROFILES), default="pf",
                       help="inject: whose idle latency to add (default pf: 283 ns read, 224 ns write)")
        p.add_argument("--baseline-ns", type=float, help="inject: the emulator's own cost per CXL request "
                       "(default: measured first in a count-mode guest)")
        p.add_argument("--issue", choices=("dependent", "independent"), default="dependent",
                       help="trace: model each vCPU's requests as dependent (pointer chase) or independent")
        p.add_argument("--report", help="trace: also write the modelled report as JSON to this file")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pfcxl", description="Emulate a photonic-fabric CXL memory appliance: "
                                 "QEMU CXL Type 3 devices, a Linux 6.12 guest, /dev/daxN.M.", epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"pfcxl {__version__}")
    ap.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = ap.add_subparsers(dest="command_name", metavar="COMMAND", required=True)

    topo = sub.add_parser("topology", help="show, check or list topologies")
    tsub = topo.add_subparsers(dest="topology_cmd", metavar="ACTION", required=True)
    p = tsub.add_parser("show", help="the topology as a table with its predicted address map")
    p.add_argument("topology", nargs="?", help="name or TOML path (default: pf-nic)")
    p.set_defaults(func=cmd_topology_show)
    p = tsub.add_parser("check", help="validate topology files; one line per mistake")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_topology_check)
    p = tsub.add_parser("list", help="the shipped topologies")
    p.set_defaults(func=cmd_topology_list)

    p = sub.add_parser("qemu-args", help="print the QEMU command line for a topology")
    p.add_argument("topology", nargs="?", help="name or TOML path (default: pf-nic)")
    p.add_argument("--run-dir", help="where backing files would live (default: RUN_DIR placeholder)")
    p.add_argument("--append", default="", help="extra kernel command line")
    p.add_argument("--lines", action="store_true", help="one argv element per line")
    p.set_defaults(func=cmd_qemu_args)

    p = sub.add_parser("image", help="build (or find cached) the guest image; print its paths as JSON")
    _common(p)
    p.set_defaults(func=cmd_image)

    p = sub.add_parser("boot", help="boot a guest and attach to its serial console (Ctrl-] leaves)")
    _common(p, boots=True)
    p.set_defaults(func=cmd_boot)

    p = sub.add_parser("run", help="boot, run one command in the guest, print its output, exit with its status",
                       description="Boot a guest, run CMD in its shell once it is ready, print the output and "
                       "exit with CMD's status. Example: pfcxl run -t two-hb-interleave -- cxl list -R")
    _common(p, boots=True)
    p.add_argument("--command-timeout", type=float, default=600, help="seconds for the command (default 600)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run in the guest")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("tables", help="write a topology's CEDT, CDATs and HMAT options; or decode tables",
                       description="pfcxl tables [TOPOLOGY] [--out DIR]: write CEDT.dat, one CDAT per device "
                       "and switch, the generic-port/HMAT QEMU options and decoded dumps.\n"
                       "pfcxl tables decode FILE...: decode any CEDT or CDAT (ours, QEMU's, a real "
                       "machine's) and list every violation found; exit 1 if there are any.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("items", nargs="*", metavar="TOPOLOGY | decode FILE...")
    p.add_argument("--out", help="output directory (default: tables-<topology name>)")
    p.add_argument("--as", dest="kind", choices=("cedt", "cdat"),
                   help="decode: read files as this table kind (default: CEDT if the file says so, else CDAT)")
    p.set_defaults(func=cmd_tables)

    cli_appliance.add_parsers(sub, _common)
    cli_bench.add_parsers(sub)

    p = sub.add_parser("demo", help="boot and compare what the guest discovered with the topology's predictions")
    _common(p, boots=True)
    p.set_defaults(func=cmd_demo)
    return ap


def _terminate(signum, frame):  # SIGTERM unwinds like Ctrl-C, so every VM is shut down
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args, extra = ap.parse_known_args(argv)
    if extra and getattr(args, "func", None) is cmd_tables and not any(a.startswith("-") for a in extra):
        args.items += extra     # file names after an option: `tables decode --as cdat FILE...`
    elif extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    if isinstance(getattr(args, "command", None), list) and args.command[:1] == ["--"]:
        args.command = args.command[1:]
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return args.func(args)
    except PfcxlError as exc:
        if args.debug:
            raise
        lines = str(exc).splitlines() or [type(exc).__name__]
        # A topology error is one mistake per line; other errors are one line plus context.
        headed = len(lines) if isinstance(exc, TopologyError) else 1
        for i, line in enumerate(lines):
            head = "[red]pfcxl: error:[/red] " if i < headed else ""
            err.print(head + escape(line), highlight=False, soft_wrap=True)   # one line, however long
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("pfcxl: interrupted; guests were shut down")
        return 130


if __name__ == "__main__":
    sys.exit(main())
