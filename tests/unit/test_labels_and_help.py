"""Reports say which system they modelled and why; help texts take figures from the model; the
exit status of each kind of failure is listed in `pfcxl --help`."""

from __future__ import annotations

import pytest

import numpy as np
from rich.console import Console

from pfcxl import errors
from pfcxl.device.topology import address_map
from pfcxl.device.fabric import model as fabric_model
from pfcxl.device import topology
from pfcxl.device.trace import records as tf
from pfcxl.host_tools.bench import report as bench_report
from pfcxl.host_tools.timing import report as timing_report

pytestmark = pytest.mark.unit


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


def run_help(capsys, *args: str) -> str:
    """`pfcxl ARGS --help` as the user sees it (argparse prints it and exits 0)."""
    from pfcxl.host_tools.cli.main import main
    with pytest.raises(SystemExit) as done:
        main([*args, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def every_error_class() -> list[type]:
    found, todo = [], [errors.PfcxlError]
    while todo:
        cls = todo.pop(0)
        found.append(cls)
        todo += cls.__subclasses__()
    return found


@pytest.mark.parametrize("cls", every_error_class(), ids=lambda c: c.__name__)
def test_each_kind_of_failure_exits_with_the_status_help_lists_for_it(cls, capsys, monkeypatch):
    listed = {name: code for code, name, _ in errors.exit_codes()}
    text = run_help(capsys)
    assert f"{listed[cls.__name__]} {cls.__name__}" in text
    from pfcxl.host_tools.cli import main as cli

    def fails(path):
        raise cls("what went wrong")
    monkeypatch.setattr(topology, "load", fails)         # what `pfcxl topology check` calls
    assert cli.main(["topology", "check", "x.toml"]) == listed[cls.__name__]
    assert capsys.readouterr().err.strip() == "pfcxl: error: what went wrong"


def test_build_and_timing_failures_are_not_vm_failures():
    assert len({errors.BuildError.exit_code, errors.TimingError.exit_code, errors.VMError.exit_code}) == 3


def test_the_inject_latency_help_states_is_the_one_the_plugin_is_given(capsys):
    from pfcxl.machine import timing_config
    text = run_help(capsys, "run")
    config = timing_config("inject", profile="pf")
    assert (config.read_ns, config.write_ns) == (fabric_model.idle_ns("pf", False), fabric_model.idle_ns("pf", True))
    assert f"{config.read_ns} ns read, {config.write_ns} ns write" in text


def test_every_inject_profile_gives_the_plugin_its_idle_latencies():
    from pfcxl.device.fabric import constants as fabric_constants
    from pfcxl.machine import timing_config
    for profile in fabric_constants.PROFILES:
        config = timing_config("inject", profile=profile)
        assert (config.mode, config.read_ns, config.write_ns, config.baseline_ns) == \
            ("inject", fabric_model.idle_ns(profile, False), fabric_model.idle_ns(profile, True), 0.0), profile
    assert len({timing_config("inject", profile=p).read_ns for p in fabric_constants.PROFILES}) > 1


def test_errors_keep_their_cause(tmp_path):
    """An error raised while handling another names it as its cause (`raise ... from err`), so
    --debug shows the whole chain: each kind of bad input below, with the error it came from."""
    import argparse
    from pfcxl.host_tools import argtypes
    a_file = tmp_path / "file"
    a_file.write_text("")
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[guest\n")
    cases = [(lambda: argtypes.seconds("soon"), argparse.ArgumentTypeError, ValueError),
             (lambda: argtypes.count("many"), argparse.ArgumentTypeError, ValueError),
             (lambda: argtypes.writable_dir(a_file, "--run-dir"), errors.PfcxlError, FileExistsError),
             (lambda: topology.load(bad_toml), errors.TopologyError, Exception)]
    for call, raised, cause in cases:
        with pytest.raises(raised) as info:
            call()
        assert isinstance(info.value.__cause__, cause), (raised, info.value, info.value.__cause__)
