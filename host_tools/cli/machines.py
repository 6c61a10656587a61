"""`pfcxl up / exec / ps / down`: machines that stay up between commands (host_tools/fleet/detached.py),
and `run --reuse`, which matches them on the boot options (host_tools/vm/boot_options.py)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.markup import escape

from pfcxl.errors import PfcxlError

from pfcxl.host_tools.vm import boot_options
from pfcxl.host_tools.fleet import detached
from pfcxl.host_tools import argtypes, timeouts
from pfcxl.host_tools.ui import err, out, write_output

DEFAULT_NAME = "default"


def _topology(args) -> tuple[Path, str]:
    from pfcxl.device import topology
    path = topology.resolve(args.topology)
    return path, topology.load(path).name      # validated before any daemon starts


def reusable(args) -> str | None:
    """run --reuse: a ready machine with the same topology content and boot options, if any."""
    if args.timing:
        raise PfcxlError("--reuse runs the command in an up machine; --timing needs its own boot "
                         "(give one or the other)")
    path, _ = _topology(args)
    return detached.find_reusable(path, boot_options.from_args(args))


def run_reused(args, command: str) -> int | None:
    """run --reuse: the command's status from a matching up machine, or None if there is none."""
    name = reusable(args)
    if name is None:
        return None
    err.print(f"[dim]reusing machine '{escape(name)}' (pfcxl ps)[/dim]")
    return exec_in(name, command, args.command_timeout)


def add_reuse_option(p) -> None:
    p.add_argument("--reuse", action="store_true", help="run it in an up machine (pfcxl up) of the same "
                   "topology file and boot options if there is one, else boot as usual")


def exec_in(name: str, command: str, timeout: float) -> int:
    """Run `command` in machine `name`; print its output as `pfcxl run` does; its status."""
    status, output = detached.exec_command(name, command, timeout)
    write_output(output)
    return status


def cmd_up(args) -> int:
    for flag, given in (("--run-dir", args.run_dir), ("--dry-run", args.dry_run), ("--keep", args.keep)):
        if given:
            raise PfcxlError(f"pfcxl up: {flag} is not for up (a machine keeps its files in "
                             f"{detached.machines_dir()}/<name>/ until pfcxl down)")
    path, name = _topology(args)
    options = boot_options.from_args(args)
    start = time.monotonic()
    with err.status(f"booting {name} as machine '{args.name}' in the background"):
        info = detached.up(args.name, path, name, options, ready_timeout=args.timeout, wait=args.timeout + 600)
    err.print(f"[dim]machine '{args.name}' ({name}) ready in {time.monotonic() - start:.1f}s; "
              f"pfcxl exec {args.name} -- CMD; pfcxl down {args.name}[/dim]")
    out.print(escape(args.name), highlight=False)
    return 0 if info["state"] == "ready" else 1


def cmd_exec(args) -> int:
    if not args.command:
        raise PfcxlError(f"pfcxl exec: give a command after --, e.g. pfcxl exec {args.name} -- cxl list -R")
    from pfcxl.host_tools.vm.console import shell_command     # pexpect with it: not for the parser
    return exec_in(args.name, shell_command(args.command), args.command_timeout)


def _age(started: float | None) -> str:
    if not started:
        return "-"
    seconds = int(time.time() - started)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def _field(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"'{text}' is not KEY=VALUE")
    try:
        return key.replace("-", "_"), int(value, 0)
    except ValueError:
        return key.replace("-", "_"), value


def cmd_inject(args) -> int:
    import json
    fields: dict = {}
    given = [(f"--set {key.replace('_', '-')}={value}", key, value) for key, value in args.set]
    given += [(f"--{key} {getattr(args, key)}", key, _field(f"{key}={getattr(args, key)}")[1])
              for key in ("dpa", "length", "log", "type") if getattr(args, key) is not None]
    said: dict[str, str] = {}
    for option, key, value in given:      # one field set twice is a conflict, whichever value would win
        if key in said:
            raise PfcxlError(f"{said[key]} and {option} both set the field {key.replace('_', '-')}: give it once")
        said[key], fields[key] = option, value
    request = dict(fields, kind=args.kind, device=args.device, expect=args.expect, timeout=args.expect_timeout)
    reply = detached.call(args.name, {"op": "inject", "inject": request},
                          timeout=2 * detached.INJECT_TIMEOUT + args.expect_timeout + detached.EXEC_SLACK)
    if "error" in reply:
        raise PfcxlError(f"machine '{args.name}': {reply['error']}")
    done = reply["injected"]
    err.print(f"[dim]injected {escape(done['kind'])} into {escape(done['device'])} (serial {done['serial']:#x}): "
              f"{escape(done['qmp'])} {escape(json.dumps(done['arguments']))}[/dim]", highlight=False)
    for record in done.get("guest", []):
        out.print(escape(record), highlight=False, soft_wrap=True)
    return 0


def cmd_ps(args) -> int:
    from rich.table import Table
    names = detached.names()
    if not names:
        out.print("no machines are up (pfcxl up starts one)")
        return 0
    table = Table("name", "topology", "age", "state", "daemon", "qemu")
    for name in names:
        info = detached.describe(name)
        table.add_row(escape(name), escape(info["topology"]), _age(info["started"]), escape(info["state"]),
                      str(info["daemon_pid"] or "-"), str(info["qemu_pid"] or "-"))
    out.print(table)
    return 0


def cmd_down(args) -> int:
    if bool(args.all) == bool(args.name):
        raise PfcxlError("pfcxl down: give a machine name or --all")
    for name in detached.names() if args.all else [args.name]:
        detached.down(name)
        err.print(f"[dim]machine '{escape(name)}' is down[/dim]")
    return 0


def add_command_timeout(p: argparse.ArgumentParser) -> None:
    """--command-timeout of run and exec: one guest command's limit."""
    p.add_argument("--command-timeout", type=argtypes.seconds, default=timeouts.COMMAND_S,
                   help=f"seconds for the command (default {timeouts.COMMAND_S})")


def add_parsers(sub, common) -> None:
    p = sub.add_parser("up", help="boot a guest in the background; exec runs commands in it",
                       description="Boot a guest as `pfcxl run` would, but keep it up in a background process "
                       f"with a control socket in {detached.machines_dir()}/NAME/. Then: pfcxl exec NAME -- CMD, "
                       "pfcxl ps, pfcxl down NAME, pfcxl run --reuse.")
    common(p, boots=True)
    p.add_argument("--name", default=DEFAULT_NAME, help=f"the machine's name (default {DEFAULT_NAME})")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("exec", help="run a command in an up machine (output and status as pfcxl run)",
                       description="Run CMD in the guest of machine NAME (started by pfcxl up), print its "
                       "output and exit with its status, as pfcxl run does without the boot. Example: "
                       "pfcxl exec default -- cxl list -R")
    p.add_argument("name", help="the machine (pfcxl ps)")
    add_command_timeout(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run in the guest")
    p.set_defaults(func=cmd_exec, interrupted="pfcxl: interrupted; the machine stays up, and the command may "
                   "still be running in it")

    from pfcxl.host_tools.vm.inject import KINDS
    p = sub.add_parser("inject", help="inject a CXL error (poison, event record, RAS error) into an up machine",
                       description="Inject a CXL error into a device of a machine kept up with pfcxl up, through "
                       "QEMU's QMP: " + ", ".join(KINDS) + ". The device is named as in the topology; bad "
                       "arguments are refused before anything is injected. --expect waits for the guest's record "
                       "(cxl list -L, the CXL trace event in tracefs, AER messages) and prints it.")
    p.add_argument("kind", choices=tuple(KINDS), help="what to inject: " + ", ".join(KINDS))
    p.add_argument("--name", default=DEFAULT_NAME, help=f"the machine (pfcxl ps; default {DEFAULT_NAME})")
    p.add_argument("--device", "-d", required=True, help="the device's id in the topology")
    p.add_argument("--dpa", help="device physical address (poison start, event DPA; 64-byte aligned)")
    p.add_argument("--length", help="poison: bytes, a multiple of 64 (default 64)")
    p.add_argument("--log", help="event records: informational (default), warning, failure or fatal")
    p.add_argument("--type", help="event type (a number), or the RAS error's name (correctable, uncorrectable)")
    p.add_argument("--set", type=_field, action="append", default=[], metavar="FIELD=VALUE",
                   help="any other field of the QMP command (e.g. --set transaction-type=2 --set temperature=70)")
    p.add_argument("--expect", action="store_true", help="wait for the guest's record of the error and print it")
    p.add_argument("--expect-timeout", type=argtypes.seconds, default=timeouts.EXPECT_S,
                   help=f"seconds --expect waits (default {timeouts.EXPECT_S})")
    p.set_defaults(func=cmd_inject)

    p = sub.add_parser("ps", help="machines that are up: topology, age, state",
                       description="List the machines started by pfcxl up: name, topology, age, state "
                       "(starting, booting, ready, crashed, dead or failed), and the pids of their daemon and QEMU.")
    p.set_defaults(func=cmd_ps, interrupted="pfcxl: interrupted")

    p = sub.add_parser("down", help="stop a machine (or --all) and remove its files",
                       description="Power off the guest of machine NAME (or of every machine with --all), "
                       "stop its daemon and remove its control directory.")
    p.add_argument("name", nargs="?", help="the machine (pfcxl ps)")
    p.add_argument("--all", action="store_true", help="every machine")
    p.set_defaults(func=cmd_down, interrupted="pfcxl: interrupted; pfcxl ps shows what is still up")
