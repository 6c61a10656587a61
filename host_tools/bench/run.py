"""One `pfcxl bench` run as a library call: boot, run the suite, model the CXL runs, write the
results file and plots, and give back what the command prints (the CLI only parses and prints)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pfcxl.errors import TimingError
from pfcxl.device.topology import Topology
from pfcxl.host_tools.vm.boot_options import BootOptions
from pfcxl.host_tools.timing import config as timing
from pfcxl.host_tools.bench import suite as bench


@dataclass(frozen=True)
class BenchRun:
    """A finished suite: its results (also in out_dir/results.json), report tables and plots."""

    out_dir: Path
    results: bench.Results
    tables: list[Any]           # the report's rich tables, to print
    plots: list[Path]
    seconds: float

    @property
    def failed(self) -> list[str]:
        return [r.name for r in self.results.runs if r.status != "ok"]


@dataclass(frozen=True)
class VirtualRun:
    """--clock virtual: the report (also in out_dir/results.json) and its table."""

    out_dir: Path
    report: dict
    table: Any
    seconds: float


def _trace_options(options: BootOptions, out_dir: Path) -> BootOptions:
    # always in trace mode: the modelled columns replay the stream each run issued
    return dataclasses.replace(options, timing="trace", run_dir=str(out_dir / "run"))


def modelled(topo: Topology, spec: bench.BenchSpec, result: bench.BenchResult, traced: Any, *,
             whole_trace: bool) -> None:
    """A CXL run's modelled columns from its capture: the whole trace (with --timing trace) and,
    for a run that marks its rows, each row's stream at its nominal load."""
    from pfcxl.host_tools.bench import model as bench_model
    if spec.system != "cxl":
        return
    if whole_trace:
        result.modelled = traced.model(dependent=spec.name.startswith("idle_latency"))
    if timing.marks_rows(spec.command) and result.data is not None:
        rows = len(result.data.get("results", result.data.get("rows", [])))
        try:    # a capture that does not match the rows is said in the results, not fatal
            pieces = traced.rows(rows)
        except TimingError as exc:
            result.modelled["rows_error"] = str(exc)
            return
        result.modelled.update(bench_model.model_run(topo, result.data.get("tool", ""), result.data, pieces))


def run(topo: Topology, options: BootOptions, *, suite: str, out_dir: Path, ready_timeout: float,
        whole_trace: bool = False, say: Callable[[str], None] = lambda m: None) -> BenchRun:
    """Boot `topo` (again after a guest died) and run `suite`; whole_trace (bench --timing trace)
    also models each CXL run's whole trace. The boot is in trace mode either way."""
    from pfcxl.machine import Machine
    from pfcxl.host_tools.bench import plots as bench_plots
    from pfcxl.host_tools.bench import report as bench_report
    specs = bench.on_data_paths(bench.load_suite(suite), topo)
    results = bench.Results(out_dir, bench.environment(topo, suite=suite, image=options.image,
                                                       timing="trace" if whole_trace else None))
    start = time.monotonic()
    with contextlib.ExitStack() as stack:
        boots = [0]

        def boot():
            boots[0] += 1
            machine = Machine(topo, name=f"bench{boots[0]}", ready_timeout=ready_timeout,
                              options=_trace_options(options, out_dir))
            stack.callback(machine.close)
            machine.start()
            # the kernel and QEMU that ran, as the guest and Machine say (--kernel, --qemu)
            results.env.update(kernel=machine.ready.get("kernel"), kernel_origin=machine.ready.get("kernel_origin"),
                               qemu_binary=machine.qemu)
            return machine

        def bracket(spec):      # --timing: a CXL run that does not mark its rows is one phase
            return whole_trace and spec.system == "cxl" and not timing.marks_rows(spec.command)

        bench.run_suite(specs, results, boot=boot, bracket=bracket, say=say,
                        after=lambda vm, spec, result, traced: modelled(topo, spec, result, traced,
                                                                         whole_trace=whole_trace))
    tables = list(bench_report.tables({"environment": results.env, "results": [r.__dict__ for r in results.runs]}))
    written = bench_plots.plots(bench_report.load(out_dir), out_dir)
    return BenchRun(out_dir, results, tables, list(written), time.monotonic() - start)


def run_virtual(topo: Topology, options: BootOptions, *, out_dir: Path, ready_timeout: float,
                say: Callable[[str], None] = lambda m: None) -> VirtualRun:
    """--clock virtual: one timed boot, every fabric's latency and bandwidth in the guest's clock."""
    from pfcxl.machine import Machine
    from pfcxl.host_tools.bench import virtual as bench_virtual
    start = time.monotonic()
    with Machine(topo, name="bench-virtual", ready_timeout=ready_timeout,
                 options=_trace_options(options, out_dir)) as machine:
        report = bench_virtual.run(machine, topo, say=say)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(report, indent=1))
    return VirtualRun(out_dir, report, bench_virtual.table(report), time.monotonic() - start)
