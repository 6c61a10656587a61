"""`pfcxl bench` and `pfcxl bench compare A B` (the benchmark, report and numpy modules are imported
when the command runs: the parser stays light, see host_tools/cli/main.py)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import time
from pathlib import Path

from rich.markup import escape

from pfcxl.errors import PfcxlError, TimingError

from pfcxl.host_tools.vm import boot_options
from pfcxl.host_tools import argtypes, timeouts
from pfcxl.host_tools.ui import err, out


def cmd_bench(args) -> int:
    from pfcxl.device.topology import data_path
    from pfcxl.device import topology
    from pfcxl.machine import Machine
    from pfcxl.host_tools.bench import suite as bench
    from pfcxl.host_tools.timing import config as timing
    from pfcxl.host_tools.bench import model as bench_model
    from pfcxl.host_tools.bench import plots as bench_plots
    from pfcxl.host_tools.bench import report as bench_report
    topo = data_path.with_data_path(topology.load(topology.resolve(args.topology)), args.data_path)
    if any(d.appliance for d in topo.devices):
        raise PfcxlError(f"bench boots its own guest; topology '{topo.name}' needs the appliance "
                         "(use pf-nic, electrical-switch or two-hb-interleave)")
    if args.clock == "virtual":
        return _bench_virtual(args, topo)
    specs = bench.on_data_paths(bench.load_suite(args.suite), topo)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.out or Path("results") / f"{stamp}-{topo.name}")
    results = bench.Results(out_dir, bench.environment(topo, suite=args.suite, image=args.image, timing=args.timing))
    start = time.monotonic()
    with contextlib.ExitStack() as stack:
        boots = [0]

        def boot():
            boots[0] += 1
            # always in trace mode: the modelled columns replay the stream each run issued
            machine = Machine(topo, name=f"bench{boots[0]}", ready_timeout=args.timeout,
                              options=dataclasses.replace(boot_options.from_args(args), timing="trace",
                                                          run_dir=str(out_dir / "run")))
            stack.callback(machine.close)
            machine.start()
            # the kernel and QEMU that ran, as the guest and Machine say (--kernel, --qemu)
            results.env.update(kernel=machine.ready.get("kernel"), kernel_origin=machine.ready.get("kernel_origin"),
                               qemu_binary=machine.qemu)
            return machine

        def bracket(spec):      # --timing: a CXL run that does not mark its rows is one phase
            return bool(args.timing) and spec.system == "cxl" and not timing.marks_rows(spec.command)

        def after(vm, spec, result, traced):
            if spec.system != "cxl":
                return
            if args.timing:
                dependent = spec.name.startswith("idle_latency")
                result.modelled = traced.model(dependent=dependent)
            if timing.marks_rows(spec.command) and result.data is not None:
                rows = len(result.data.get("results", result.data.get("rows", [])))
                try:    # a capture that does not match the rows is said in the results, not fatal
                    pieces = traced.rows(rows)
                except TimingError as exc:
                    result.modelled["rows_error"] = str(exc)
                    return
                result.modelled.update(bench_model.model_run(topo, result.data.get("tool", ""), result.data, pieces))

        with err.status("running the benchmark suite") as status:
            bench.run_suite(specs, results, boot=boot, bracket=bracket, after=after,
                            say=lambda m: status.update(f"{topo.name}: {m}"))
    for table in bench_report.tables({"environment": results.env,
                                      "results": [r.__dict__ for r in results.runs]}):
        out.print(table)
    written = bench_plots.plots(bench_report.load(out_dir), out_dir)
    failed = [r.name for r in results.runs if r.status != "ok"]
    err.print(f"{len(results.runs) - len(failed)} of {len(results.runs)} benchmarks ok in "
              f"{time.monotonic() - start:.0f}s; results in {escape(str(out_dir / 'results.json'))}; plots: "
              f"{', '.join(p.name for p in written)}")
    return 1 if failed else 0


def _bench_virtual(args, topo) -> int:
    """--clock virtual: one timed boot, every fabric's latency and bandwidth in the guest's clock."""
    import json

    from pfcxl.machine import Machine
    from pfcxl.host_tools.bench import virtual as bench_virtual
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.out or Path("results") / f"{stamp}-{topo.name}-virtual")
    start = time.monotonic()
    options = dataclasses.replace(boot_options.from_args(args), timing="trace", run_dir=str(out_dir / "run"))
    with Machine(topo, name="bench-virtual", ready_timeout=args.timeout, options=options) as machine, \
            err.status("virtual-time benchmark") as status:
        report = bench_virtual.run(machine, topo, say=lambda m: status.update(f"{topo.name}: {m}"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(report, indent=1))
    out.print(bench_virtual.table(report))
    for note in report["notes"]:
        err.print(f"[dim]{escape(note)}[/dim]")
    err.print(f"done in {time.monotonic() - start:.0f}s; results in {escape(str(out_dir / 'results.json'))}")
    return 0


def cmd_compare(args) -> int:
    from pfcxl.host_tools.bench import report as bench_report
    out.print(bench_report.compare(bench_report.load(args.a), bench_report.load(args.b)))
    return 0


def _suite(text: str) -> str:
    """--suite: a shipped suite or a file that exists (one that is not: argparse's one line, status 2,
    as for every other bad value); the file is read and checked when the command runs."""
    from pfcxl.host_tools.bench import suite as bench       # when bench's arguments are parsed, not for --help
    if text in bench.SUITES or os.path.lexists(text):
        return text
    raise argparse.ArgumentTypeError(bench.unknown_suite(text))


def add_parsers(sub) -> None:
    p = sub.add_parser("bench", help="run the guest benchmark suite; or compare two results",
                       description="pfcxl bench [--topology T] [--suite quick|full|FILE] [--image busybox|debian] "
                       "[--timing trace]: boot, run idle_latency, loaded_latency and bandwidth on the CXL DAX "
                       "device and on local memory, save results/<time>-<topology>/results.json and PNG plots, "
                       "print tables with labelled columns (measured in emulator, modelled PF appliance, "
                       "modelled electrical switch pool, local DRAM). The TCG plugin always captures the CXL "
                       "runs: the loaded-latency and bandwidth rows of a run with --mark-rows 1 (the "
                       "shipped suites) get modelled columns, each row's captured stream replayed at its "
                       "nominal load, and the bandwidth run's read rows a latency-against-bandwidth curve "
                       "(latency_bandwidth.png). With --timing trace every CXL run's whole trace is also "
                       "fed to the fabric models (the idle table's traced figures). With "
                       "--data-path direct the CXL runs go to the direct device, with both they run on "
                       "each, in a column per path.\n"
                       "pfcxl bench compare A B: compare two results files (pfcxl bench compare --help).",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", "-t", help="the topology to boot (default pf-nic)")
    p.add_argument("--suite", type=_suite, default="quick",
                   help="quick (default, a minute or two), full, or a JSON suite file")
    boot_options.add_arguments(p, boot_options.IMAGE)
    p.add_argument("--timing", choices=("trace",), help="also model each CXL run's whole trace (idle latency "
                   "from the traced chase)")
    boot_options.add_arguments(p, ("data_path",))
    p.add_argument("--out", help="results directory (default results/<time>-<topology>)")
    p.add_argument("--timeout", type=argtypes.seconds, default=timeouts.READY_S,
                   help=f"seconds for the guest to become ready (default {timeouts.READY_S})")
    boot_options.add_arguments(p, boot_options.OWN_QEMU + boot_options.CLOCK)
    p.set_defaults(func=cmd_bench)
    actions = p.add_subparsers(dest="bench_action", metavar="[compare]", required=False)
    c = actions.add_parser("compare", help="compare two results files",
                           description="Print the figures of two benchmark results side by side with their ratio "
                           "(B / A), metric by metric; the metrics found in only one of them are counted.")
    c.add_argument("a", metavar="RESULTS_A", help="results.json of a pfcxl bench run, or its folder")
    c.add_argument("b", metavar="RESULTS_B", help="the other results.json, or its folder")
    c.set_defaults(func=cmd_compare)
