"""`pfcxl bench` and `pfcxl bench compare A B` (the benchmark, report and numpy modules are imported
when the command runs: the parser stays light, see host_tools/cli/main.py)."""

from __future__ import annotations

import argparse
import os

from rich.markup import escape

from pfcxl.errors import PfcxlError

from pfcxl.host_tools.vm import boot_options
from pfcxl.host_tools import argtypes, timeouts
from pfcxl.host_tools.results_dir import results_dir
from pfcxl.host_tools.ui import err, out


def cmd_bench(args) -> int:
    from pfcxl.device.topology import data_path
    from pfcxl.device import topology
    from pfcxl.host_tools.bench import run as bench_run
    topo = data_path.with_data_path(topology.load(topology.resolve(args.topology)), args.data_path)
    options = boot_options.from_args(args)
    on_appliance = any(d.appliance for d in topo.devices)
    if on_appliance and args.clock == "virtual":
        return _loaded_curve(args, topo, options)
    if on_appliance:
        raise PfcxlError(f"bench boots its own guest; topology '{topo.name}' needs the appliance: give "
                         "--clock virtual for the guests' loaded-latency curve on it, or use pf-nic, "
                         "electrical-switch or two-hb-interleave")
    for flag, value in (("--hosts", args.hosts), ("--quantum", args.quantum), ("--gaps", args.gaps)):
        if value is not None:
            raise PfcxlError(f"{flag} sets the guests' loaded-latency curve: give an appliance topology "
                             "(pf-appliance) and --clock virtual")
    if args.clock == "virtual":
        out_dir = results_dir(args.out, topo.name, tag="virtual")
        with err.status("virtual-time benchmark") as status:
            virtual = bench_run.run_virtual(topo, options, out_dir=out_dir, ready_timeout=args.timeout,
                                            say=lambda m: status.update(f"{topo.name}: {m}"))
        out.print(virtual.table)
        for note in virtual.report["notes"]:
            err.print(f"[dim]{escape(note)}[/dim]")
        err.print(f"done in {virtual.seconds:.0f}s; results in {escape(str(out_dir / 'results.json'))}")
        return 0
    out_dir = results_dir(args.out, topo.name)
    with err.status("running the benchmark suite") as status:
        done = bench_run.run(topo, options, suite=args.suite, out_dir=out_dir, ready_timeout=args.timeout,
                             whole_trace=bool(args.timing), say=lambda m: status.update(f"{topo.name}: {m}"))
    for table in done.tables:
        out.print(table)
    runs = len(done.results.runs)
    err.print(f"{runs - len(done.failed)} of {runs} benchmarks ok in "
              f"{done.seconds:.0f}s; results in {escape(str(out_dir / 'results.json'))}; plots: "
              f"{', '.join(p.name for p in done.plots)}")
    return 1 if done.failed else 0


def _loaded_curve(args, topo, options) -> int:
    """--clock virtual on an appliance topology: the guests' loaded-latency curve
    (host_tools/bench/virtual_loaded.py)."""
    from pfcxl.device.appliance import timeline
    from pfcxl.host_tools.bench import virtual_loaded
    out_dir = results_dir(args.out, topo.name, tag="loaded-virtual")
    hosts = args.hosts if args.hosts is not None else virtual_loaded.DEFAULT_HOSTS
    with err.status("loaded latency from timed guests") as status:
        curve = virtual_loaded.run(args.topology or topo.name, options, hosts, args.quantum or timeline.DEFAULT_QUANTUM_NS,
                                   out_dir=out_dir, gaps=args.gaps or virtual_loaded.GAPS,
                                   say=lambda m: status.update(f"{topo.name}: {m}"))
    out.print(curve.table)
    err.print(f"done in {curve.seconds:.0f}s; results in {escape(str(out_dir / 'results.json'))}")
    return 0


def _gaps(text: str) -> tuple[int, ...]:
    """--gaps: ticks per line, comma-separated, each 0 or more."""
    try:
        gaps = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of whole ticks (e.g. 0,64,512)")
    if not gaps or any(g < 0 or g > 1 << 32 for g in gaps):
        raise argparse.ArgumentTypeError(f"'{text}': every gap is 0 to 2^32 ticks a line")
    return gaps


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
    g = p.add_argument_group("loaded latency from timed guests (an appliance topology with --clock virtual, "
                             "e.g. -t pf-appliance; docs/virtual-time.md)")
    g.add_argument("--hosts", type=argtypes.count, metavar="N",
                   help="timed guests: host 0 chases, the other N-1 stream (default 3)")
    g.add_argument("--quantum", type=int, metavar="NS", help="the timeline's quantum in ns (default 1000)")
    g.add_argument("--gaps", type=_gaps, metavar="T,...",
                   help="the traffic hosts' pace, TSC ticks (virtual ns) a line, one point each "
                   "(default 0,32,64,128,512; 0: as fast as one core streams)")
    p.set_defaults(func=cmd_bench)
    actions = p.add_subparsers(dest="bench_action", metavar="[compare]", required=False)
    c = actions.add_parser("compare", help="compare two results files",
                           description="Print the figures of two benchmark results side by side with their ratio "
                           "(B / A), metric by metric; the metrics found in only one of them are counted.")
    c.add_argument("a", metavar="RESULTS_A", help="results.json of a pfcxl bench run, or its folder")
    c.add_argument("b", metavar="RESULTS_B", help="the other results.json, or its folder")
    c.set_defaults(func=cmd_compare)
