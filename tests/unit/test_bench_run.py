"""host_tools/bench/run.py: the modelling step of a bench run, on captured streams (no boot)."""

import numpy as np
import pytest

from pfcxl.device import topology
from pfcxl.device.fabric.engine import trace_dtype
from pfcxl.device.topology import address_map
from pfcxl.errors import TimingError
from pfcxl.host_tools.bench import run as bench_run
from pfcxl.host_tools.bench import suite as bench

pytestmark = pytest.mark.unit

TOPO = topology.load(topology.resolve("pf-nic"))
BASE = address_map.dax_placements(TOPO)[0].base
SPECS = {s.name: s for s in bench.load_suite("quick")}


def stream(n: int, write: bool = False) -> np.ndarray:
    tr = np.zeros(n, trace_dtype())
    tr["hpa"] = BASE + np.arange(n) * 64
    tr["size"], tr["write"], tr["insn"] = 64, write, np.arange(n) * 137
    return tr


class Capture:
    """What a TracedRun gives the modelling step: the rows cut from a capture (as recorded)."""

    def __init__(self, pieces):
        self.pieces = pieces

    def rows(self, n):
        if n != len(self.pieces):
            raise TimingError(f"{len(self.pieces)} captured phases for {n} rows")
        return self.pieces

    def model(self, dependent=True):
        raise AssertionError("only with --timing trace")


def result(spec, data):
    return bench.BenchResult(spec.name, spec.system, spec.command, "ok", 1.0, data=data)


def test_a_marked_bandwidth_run_gets_its_rows_and_curve():
    spec = SPECS["bandwidth/cxl"]
    data = {"tool": "bandwidth", "results": [{"pattern": "seq", "op": "read"}, {"pattern": "seq", "op": "write"}]}
    r = result(spec, data)
    bench_run.modelled(TOPO, spec, r, Capture([stream(1 << 14), stream(1 << 14, write=True)]), whole_trace=False)
    assert len(r.modelled["rows"]) == 2 and set(r.modelled["curve"]) == {"pf", "electrical", "dram"}


def test_a_capture_that_does_not_match_is_said_not_fatal():
    spec = SPECS["bandwidth/cxl"]
    r = result(spec, {"tool": "bandwidth", "results": [{"pattern": "seq", "op": "read"}] * 2})
    bench_run.modelled(TOPO, spec, r, Capture([stream(64)]), whole_trace=False)
    assert r.modelled == {"rows_error": "1 captured phases for 2 rows"}


def test_local_runs_are_not_modelled():
    spec = SPECS["bandwidth/local"]
    r = result(spec, {"tool": "bandwidth", "results": []})
    bench_run.modelled(TOPO, spec, r, Capture([]), whole_trace=True)
    assert r.modelled == {}
