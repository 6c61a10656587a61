"""The `pfcxl` command. The only place that exits the process or prints tracebacks (--debug).

Building the parser imports only light modules: every command imports what it uses when it runs,
so `pfcxl exec`, `ps` and `--help` start without numpy, jinja2, QMP, the image builder, the ACPI table
code or the plugin's configuration (tests/component/test_cli_imports.py keeps it so).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from rich.markup import escape

from pfcxl import __version__
from pfcxl import errors
from pfcxl.errors import PfcxlError, TopologyError


from pfcxl.host_tools.vm import boot_options
from pfcxl.host_tools.cli import appliance_commands as cli_appliance
from pfcxl.host_tools.cli import bench as cli_bench
from pfcxl.host_tools.cli import kv as cli_kv
from pfcxl.host_tools.cli import machines as cli_machines
from pfcxl.host_tools.cli import model as cli_model
from pfcxl.host_tools.cli import serving as cli_serving
from pfcxl.host_tools import argtypes, timeouts
from pfcxl.host_tools.cli import topology as cli_topology
from pfcxl.host_tools.cli import telemetry as cli_telemetry
from pfcxl.host_tools.ui import err, out, write_output

if TYPE_CHECKING:
    from pfcxl.host_tools.image.initramfs import BootImage


def _epilog() -> str:
    codes = "\n".join(f"  {code:3}  {name:15} {meaning}" for code, name, meaning in errors.exit_codes())
    return ("Topologies: give a shipped name (pfcxl topology list) or a path to a TOML file; the default\n"
            "is pf-nic. Files are kept in --run-dir (default: a temporary directory, removed afterwards;\n"
            "kept with its logs when something fails). Setup: 'make setup'.\n\n"
            "Exit status: `pfcxl run` exits with the guest command's status once the guest is up;\n"
            "otherwise 0 on success, 130 on Ctrl-C, and for each kind of failure:\n" + codes + "\n")


# --------------------------------------------------------------------------- helpers


def _build_image(machine) -> BootImage:
    """The machine's guest image, with a spinner while it is built; say which it is."""
    with err.status("building guest image") as status:
        machine.boot_image(progress=lambda m: status.update(m))    # built here, with the spinner
        plan = machine.plan()            # the plan decides whose CEDT the guest sees
    img = plan.image
    if plan.cedt_override:
        err.print("[dim]our CEDT replaces QEMU's (initrd ACPI table upgrade)[/dim]")
    err.print(f"[dim]guest image {img.initrd.name} ({'built' if img.rebuilt else 'cached'}), "
              f"kernel {img.kernel_release}[/dim]")
    return img


def _machine(args, **overrides):
    """The Machine a boot command's options describe."""
    from pfcxl.machine import Machine
    options = dict(progress=lambda m: err.print(f"[dim]{escape(m)}[/dim]"), ready_timeout=args.timeout)
    options.update(overrides)
    return Machine(args.topology, options=boot_options.from_args(args), **options)


@contextlib.contextmanager
def _booted(args):
    """A ready guest for a command, torn down afterwards (see pfcxl.Machine)."""
    if args.run_dir:
        argtypes.writable_dir(Path(args.run_dir), "--run-dir")   # before anything is written there
    machine = _machine(args)
    topo = machine.topology
    _build_image(machine)
    start = time.monotonic()
    with err.status(f"booting {topo.name} under TCG (QEMU start to PFCXL-READY)"):
        machine.start()
    try:
        err.print(f"[dim]{topo.name}: guest ready in {time.monotonic() - start:.1f}s wall "
                  f"({', '.join(r['dax'] + ' ' + r['mode'] for r in machine.ready.get('regions', []))})[/dim]")
        yield machine
    finally:
        machine.close()


def _print_plan(machine, command: str | None = None) -> int:
    """--dry-run: the whole plan of a boot, nothing started."""
    from pfcxl.machine import RUN_DIR_PLACEHOLDER
    from pfcxl.host_tools.vm.qemu import show
    plan = machine.plan()
    img = plan.image
    cdats = sorted({**plan.tables.device_cdat, **plan.tables.switch_cdat})
    lines = [
        f"topology   {plan.topology.name} ({machine.topology_path or 'given as an object'})",
        f"image      {img.initrd} ({'built now' if img.rebuilt else 'cached'})",
        f"kernel     {img.kernel_release} from {img.kernel_origin}",
        f"boots      {plan.kernel}" + (f" (the PVH entry of {img.kernel.name})" if plan.kernel != img.kernel else ""),
        f"qemu       {machine.qemu}" + (f" (QEMU {machine.qemu_version}, --qemu)" if machine.qemu_version else "")
        + (f", extra arguments: {show(machine.qemu_args)}" if machine.qemu_args else ""),
        "CEDT       " + ("ours, through the initrd table upgrade" if plan.cedt_override else "QEMU's")
        + f" ({len(plan.tables.cedt)} bytes)",
        "CDAT       " + (", ".join(cdats) if cdats else "QEMU's defaults (the topology has no profile)"),
        f"run dir    {plan.run_dir}" + ("  (a temporary directory at boot)"
                                       if plan.run_dir == RUN_DIR_PLACEHOLDER else ""),
        *(f"  {role:14} {path}" for role, path in plan.files.items()),
        "boot options (what --reuse matches, with the topology file's bytes)",
        *machine.options.lines(),
    ]
    if command is not None:
        lines.append(f"command    {command}")
    lines += ["argv", show(plan.argv)]
    out.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
    return 0


# --------------------------------------------------------------------------- commands


def cmd_qemu_args(args) -> int:
    """Exactly the argv a boot with these options execs (Machine.plan: the same code path)."""
    from pfcxl.machine import RUN_DIR_PLACEHOLDER
    from pfcxl.host_tools.vm.qemu import show
    from pfcxl.host_tools.vm.host import CONSOLE_FD, FIRST_MEMORY_FD, OUTPUT_FD, QMP_FD
    plan = _machine(args, progress=lambda m: None).plan()
    out.print("\n".join(plan.argv) if args.lines else show(plan.argv), markup=False, highlight=False,
              soft_wrap=True)
    notes = [f"fds {CONSOLE_FD}, {QMP_FD} and {OUTPUT_FD} are the console, QMP and command-output socket pairs "
             "pfcxl passes in"]
    if any(d.appliance for d in plan.topology.devices):
        notes.append(f"fds from {FIRST_MEMORY_FD} on are the memory descriptors the appliance hands out at attach")
    if plan.run_dir == RUN_DIR_PLACEHOLDER:
        notes.append("RUN_DIR is the temporary run directory of a boot (--run-dir names one)")
    if args.timing == "inject" and args.baseline_ns is None:
        notes.append("baseline_ns is measured at boot (shown as 0; --baseline-ns fixes it)")
    err.print("[dim]" + "; ".join(notes) + "[/dim]")
    return 0


def cmd_image(args) -> int:
    from pfcxl.machine import Machine
    topo = cli_topology.load(args.topology)
    img = _build_image(Machine(topo, cedt=args.cedt, image=args.image, packages=args.packages))
    print(json.dumps({"kernel": str(img.kernel), "initrd": str(img.initrd),
                      "kernel_release": img.kernel_release, "rebuilt": img.rebuilt}))
    return 0


def cmd_boot(args) -> int:
    if args.dry_run:
        return _print_plan(_machine(args, progress=lambda m: None))
    from pfcxl.host_tools.vm import terminal
    terminal.check_foreground()
    with _booted(args) as machine:
        terminal.interact(machine.console, banner=f"pfcxl: {machine.topology.name} console; Ctrl-] leaves "
                                                  "and powers the guest off")
    return 0


def cmd_run(args) -> int:
    if not args.command:
        raise PfcxlError("pfcxl run: give a command after --, e.g. pfcxl run -- cxl list -R")
    from pfcxl.host_tools.vm.console import check_syntax, shell_command
    command = shell_command(args.command)
    if args.dry_run:
        return _print_plan(_machine(args, progress=lambda m: None), command)
    check_syntax(command, args.image)       # before a boot, not after it
    if args.reuse and (status := cli_machines.run_reused(args, command)) is not None:
        return status
    from pfcxl.host_tools.timing import model_runs, report as timing_report
    report = None
    with _booted(args) as vm:
        traced = vm.traced_run(command, timeout=args.command_timeout)
        appliance_figures = traced.appliance_figures()  # on a timed appliance, the appliance models it
        if traced.records is not None:                  # trace mode: modelled here
            with err.status(f"modelling {len(traced.records)} CXL requests on the PF and electrical fabrics"):
                report = traced.report(dependent=args.issue == "dependent")
            if args.trace_out:                          # for pfcxl model replay
                model_runs.save_trace(Path(args.trace_out), traced.records)
        elif traced.phases and getattr(args, "clock", "emulator") == "virtual":
            from pfcxl.host_tools.timing import vtime
            err.print(f"[dim]{vtime.summary(traced.phases[-1])}[/dim]", highlight=False)
        elif traced.phases:
            err.print(f"[dim]plugin ({args.timing}): {json.dumps(traced.phases[-1])}[/dim]", highlight=False)
        if args.timing == "inject" and vm.timing_config is not None:
            from pfcxl.host_tools.timing.calibration import inject_summary
            for line in inject_summary(vm.timing_config):
                err.print(line, highlight=False, markup=False)
    result = traced.result
    write_output(result.data)
    if appliance_figures is not None:
        cli_telemetry.show(appliance_figures, args.report)
    if report is not None:
        err.print(timing_report.table(report, f"CXL traffic of: {command}"))
        if args.report:
            Path(args.report).write_text(json.dumps(report, indent=1))
    return result.status


def cmd_demo(args) -> int:
    from rich.table import Table

    from pfcxl.host_tools.vm import discovery
    if args.dry_run:
        return _print_plan(_machine(args, progress=lambda m: None))
    with _booted(args) as machine:
        topo = machine.topology
        found = discovery.discover(machine)
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


# --------------------------------------------------------------------------- parser


def _common(p: argparse.ArgumentParser, boots: bool = False, timing_options: bool = True) -> None:
    """The topology and image options; `boots`: those of a boot; `timing_options`: the plugin's
    (demo only discovers, so it has none). The boot options come from BootOptions' fields."""
    p.add_argument("--topology", "-t", help="shipped topology name or TOML path (default: pf-nic)")
    boot_options.add_arguments(p, boot_options.IMAGE + ("cedt",))
    if boots:
        boot_options.add_arguments(p, boot_options.PLACE)
        p.add_argument("--keep", action="store_true", help="keep the temporary run directory")
        p.add_argument("--timeout", type=argtypes.seconds, default=timeouts.READY_S,
                       help="seconds to wait for the guest to become ready, not counting time a loaded "
                       f"host keeps QEMU waiting for a CPU (default {timeouts.READY_S})")
        p.add_argument("--dry-run", action="store_true", help="print the whole plan (image, tables, files, "
                       "QEMU argv) and start nothing")
        boot_options.add_arguments(p, boot_options.OWN_QEMU)
    if boots and timing_options:
        boot_options.add_arguments(p, boot_options.PLUGIN)
        p.add_argument("--report", help="trace (or a timed appliance): also write the modelled report as JSON "
                       "to this file")
        p.add_argument("--trace-out", help="trace: also save the captured records (.npy) for pfcxl model replay")
        boot_options.add_arguments(p, boot_options.CLOCK)


class _Parser(argparse.ArgumentParser):
    """pfcxl's parser and, through add_subparsers, every command's: a usage error (a bad choice, a
    value its type refuses, a missing argument) is one line, the error and where the usage is,
    rather than the whole usage (a dozen lines) above it. Status 2, as argparse's."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}; see {self.prog} --help\n")


def parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="pfcxl", description="Emulate a photonic-fabric CXL memory appliance: "
                                 "QEMU CXL Type 3 devices, a Linux 6.12 guest, /dev/daxN.M.", epilog=_epilog(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"pfcxl {__version__}")
    ap.add_argument("--debug", action="store_true", help="show tracebacks for errors, and the command line of "
                    "every program pfcxl starts")
    sub = ap.add_subparsers(dest="command_name", metavar="COMMAND", required=True)
    cli_topology.add_topology_parser(sub)
    p = sub.add_parser("qemu-args", help="print the exact QEMU command line a boot of a topology execs",
                       description="Print the argv that `pfcxl run`/`boot` with the same options would exec: "
                       "CDAT files, generic ports, HMAT and plugin options included, every generated file "
                       "named where the boot writes it (RUN_DIR without --run-dir).")
    p.add_argument("topology_name", nargs="?", metavar="TOPOLOGY", help="name or TOML path (default: pf-nic)")
    _common(p, boots=True)
    p.add_argument("--lines", action="store_true", help="one argv element per line")
    p.set_defaults(func=cmd_qemu_args)

    p = sub.add_parser("image", help="build (or find cached) the guest image; print its paths as JSON",
                       description="Build the guest image a boot of the topology would use (kernel, initrd "
                       "with the guest tools, and for --image debian the Debian root), or find it in the "
                       "cache, and print the kernel and initrd paths and the kernel release as JSON.")
    _common(p)
    p.set_defaults(func=cmd_image)

    p = sub.add_parser("boot", help="boot a guest and attach to its serial console (Ctrl-] leaves)",
                       description="Boot a guest of the topology and connect this terminal to its serial "
                       "console once it is ready (a root shell). Ctrl-] leaves and powers the guest off. "
                       "Needs a terminal in the foreground; pfcxl up and exec work without one.")
    _common(p, boots=True)
    p.set_defaults(func=cmd_boot)

    p = sub.add_parser("run", help="boot, run one command in the guest, print its output, exit with its status",
                       description="Boot a guest, run CMD in its shell once it is ready, print the output and "
                       "exit with CMD's status. CMD runs in sh with stdin from /dev/null; one word is a shell command "
                       "line, several are argv. Example: pfcxl run -t two-hb-interleave -- cxl list -R")
    _common(p, boots=True)
    cli_machines.add_command_timeout(p)
    cli_machines.add_reuse_option(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run in the guest")
    p.set_defaults(func=cmd_run)

    cli_topology.add_tables_parser(sub)
    cli_appliance.add_parsers(sub, _common)
    cli_machines.add_parsers(sub, _common)
    cli_bench.add_parsers(sub)
    cli_serving.add_parsers(sub)
    cli_model.add_parsers(sub)
    cli_kv.add_parsers(sub)

    p = sub.add_parser("demo", help="boot and compare what the guest discovered with the topology's predictions",
                       description="Boot a guest of the topology (no timing plugin), read what its Linux CXL "
                       "subsystem found (cxl list, daxctl, sysfs) and print it beside what the topology "
                       "predicts, check by check; exit 1 if any differs. Example: pfcxl demo -t pf-nic")
    _common(p, boots=True, timing_options=False)
    p.set_defaults(func=cmd_demo)
    return ap


def _terminate(signum, frame):  # SIGTERM and SIGHUP unwind like Ctrl-C, so every VM is shut down
    raise KeyboardInterrupt


def parse(ap: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """parse_known_args, and options given after a command's positional arguments: argparse's
    REMAINDER takes everything after them (`exec NAME --command-timeout 3 -- CMD` sent
    "--command-timeout" to the guest as the command). Options before the `--` are moved in
    front of the positional arguments and parsed; with no `--`, they are refused."""
    args, extra = ap.parse_known_args(argv)
    command = getattr(args, "command", None)
    if not (isinstance(command, list) and command and command[0].startswith("-") and command[0] != "--"):
        return args, extra
    if "--" not in command:
        ap.error(f"pfcxl {args.command_name}: {command[0]} after the positional arguments: options go before "
                 "them, and the command after --")
    head = command[:command.index("--")]
    at = argv.index(args.command_name) + 1        # right after the subcommand's name
    return ap.parse_known_args(argv[:at] + head + argv[at:len(argv) - len(command)] + command[len(head):])


def main(argv: list[str] | None = None) -> int:
    # qemu.qmp runs QMP on a private asyncio loop; a Ctrl-C or SIGTERM/SIGHUP that lands inside it
    # leaves a task whose exception asyncio would print as a traceback at exit. pfcxl has already
    # shut the guest down and said so in one line: that echo is noise to a user.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    ap = parser()
    args, extra = parse(ap, list(sys.argv[1:] if argv is None else argv))
    if extra and getattr(args, "func", None) is cli_topology.cmd_tables and not any(a.startswith("-") for a in extra):
        args.items += extra     # file names after an option: `tables decode --as cdat FILE...`
    elif extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "topology_name", None):
        if args.topology:
            ap.error("give the topology once (positional or --topology)")
        args.topology = args.topology_name
    if getattr(args, "debug", False):      # every program started, as pfcxl.process logs it
        logging.basicConfig(format="pfcxl: %(message)s")
        logging.getLogger("pfcxl.process").setLevel(logging.DEBUG)
    if isinstance(getattr(args, "command", None), list) and args.command[:1] == ["--"]:
        args.command = args.command[1:]
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    # `kill -USR1 PID` prints where every thread of a pfcxl that seems stuck is, and it goes on; not
    # when stderr has no descriptor (main() called with it redirected to a StringIO)
    with contextlib.suppress(AttributeError, ValueError):      # io.UnsupportedOperation is a ValueError
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        status = args.func(args)
        sys.stdout.flush()   # a reader that went away shows here, not as a message at exit
        return status
    except BrokenPipeError:
        # `pfcxl ... | head`: the reader has what it wanted. Stop quietly with status 1, as rich
        # does for what it prints; later flushes go nowhere instead of failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
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
    except OSError as exc:   # the machine, not pfcxl: a full disk, a path that went away
        if args.debug or exc.filename is None:
            raise
        err.print(f"[red]pfcxl: error:[/red] {escape(str(exc.filename))}: {escape(exc.strerror or str(exc))}",
                  highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        # what is true of the command that was interrupted (`exec` leaves its machine up)
        err.print(getattr(args, "interrupted", "pfcxl: interrupted; guests were shut down"), markup=False)
        return 130


if __name__ == "__main__":
    sys.exit(main())
