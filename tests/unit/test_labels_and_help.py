"""Reports say which system they modelled and why; help texts take figures from the model; the
exit status of each kind of failure is listed in `pfcxl --help`."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from rich.console import Console

from pfcxl import errors
from pfcxl.device import address_map, fabric_model, topology
from pfcxl.device import trace_format as tf
from pfcxl.host_tools import bench_report, timing_report


def load(name: str) -> topology.Topology:
    return topology.load(topology.resolve(name))


def some_reads(topo: topology.Topology, n: int = 64) -> np.ndarray:
    base = address_map.dax_placements(topo)[0].base
    records = np.zeros(n, np.dtype(tf.RECORD_FIELDS))
    records["insn"] = np.arange(n) * 100
    records["hpa"] = base + np.arange(n) * tf.LINE
    records["size"] = 8
    return records


def rendered(table) -> str:
    """The table as text, whitespace (and rich's wrapping) folded to single spaces."""
    console = Console(width=400, record=True)
    console.print(table)
    return " ".join(console.export_text().split())


def test_a_topology_without_an_appliance_says_which_appliance_was_modelled():
    report = timing_report.model_trace(load("pf-nic"), some_reads(load("pf-nic")), dependent=True)
    said = report["modelled_system"]
    assert "pf-appliance" in said and "'pf-nic' describes no appliance" in said
    assert f"modelled system: {said}" in rendered(timing_report.table(report, "t"))


def test_an_appliance_topology_is_modelled_as_itself():
    topo = load("pf-appliance")
    report = timing_report.model_trace(topo, some_reads(topo), dependent=True)
    assert report["modelled_system"].startswith("the appliance of topology 'pf-appliance'")
    assert "describes no appliance" not in report["modelled_system"]


def test_bench_idle_table_names_the_model_and_a_missing_topology():
    results = {"environment": {"topology": "no-such-topology"}, "results": []}
    text = rendered(bench_report.tables(results)[0])
    assert "topology 'no-such-topology' of these results is not at hand" in text
    assert "pf-appliance" in text


def run_help(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli", *args, "--help"],
                          capture_output=True, text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_help_lists_every_exit_code_and_a_build_failure_is_not_a_vm_failure():
    text = run_help()
    for code, name, _ in errors.exit_codes():
        assert f"{code:3}  {name}" in text
    assert errors.BuildError.exit_code != errors.VMError.exit_code
    assert errors.TimingError.exit_code != errors.VMError.exit_code


def test_help_figures_come_from_the_model():
    text = " ".join(run_help("run").split())
    read, write = fabric_model.idle_ns("pf", False), fabric_model.idle_ns("pf", True)
    assert f"{read} ns read, {write} ns write" in text


def test_errors_keep_their_cause():
    """An error raised while handling another names it as its cause (`raise ... from err`), so
    --debug shows the whole chain: no `from None` in the code."""
    import pfcxl
    repo = pfcxl.__path__[0].rsplit("/", 1)[0]
    done = subprocess.run(["grep", "-rn", "--include=*.py", r") from None\|raise .* from None",
                           *(f"{repo}/{d}" for d in ("device", "firmware_tables", "guest", "host_tools",
                                                      "pfcxl", "serving"))], capture_output=True, text=True)
    assert done.stdout == "", done.stdout
