"""Guests in fabric time (--clock virtual): the timed QEMU under icount, the plugin charging every
request the modelled cache and fabric latency. The guest's own clock is asserted against the
model's figures (host_tools/timing/vtime.py), and a second boot under a CPU hog must read the
same figures: virtual time does not move with the host's load.

One pf-nic guest measures every fabric: the chase's --profile K puts FABRICS[K] in force."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pfcxl.device import topology
from pfcxl.device.fabric import constants as fc
from pfcxl.guest.tool_output import tool_json
from pfcxl.host_tools.timing import vtime

pytestmark = pytest.mark.integration

TOPOLOGY = "pf-nic"
COLD = "chase --cold --lines 5000 --span 64M --loads 5000"      # one line a load, caches emptied first
STREAM = "chase --stream --cold --span 64M --loads 80000"        # one load a line, in address order
# the figures a determinism check compares: every fabric's cold chase, then local DRAM's
SWEEP = "; ".join([f"{COLD} --profile {k}" for k in range(len(vtime.FABRICS))] + [f"{COLD} --local"])


@pytest.fixture(scope="module")
def topo():
    return topology.load(topology.resolve(TOPOLOGY))


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    from pfcxl import Machine
    machine = Machine(TOPOLOGY, clock="virtual", run_dir=tmp_path_factory.mktemp("vt"), name="vt",
                      ready_timeout=300).start()
    yield machine
    machine.close()


def chases(machine, command: str) -> list[dict]:
    result = machine.run(command, timeout=900)
    assert result.status == 0, f"{command}: status {result.status}\n{result.output}"
    return [tool_json(line, "chase") for line in result.output.splitlines() if line.startswith('{"tool":"chase"')]


def test_a_cold_chase_reads_each_fabrics_idle_latency_and_local_dram(timed, topo):
    rows = chases(timed, SWEEP)
    assert len(rows) == len(vtime.FABRICS) + 1
    for fabric, row in zip(vtime.FABRICS, rows):
        want = vtime.expected_idle_ns(topo, fabric)   # pf_hbm: the chain's lines were just written: HBM hits
        assert row["p50_ns_per_load"] == pytest.approx(want, rel=0.03), (fabric, row)
    assert rows[-1]["where"] == "local"
    assert rows[-1]["p50_ns_per_load"] == pytest.approx(fc.LOCAL_DDR5_NS, rel=0.03)
    timed.sweep = rows                                 # for the determinism check


def test_a_warm_chase_reads_the_modelled_l2_and_a_movnti_the_write_latency(timed, topo):
    # the fabric a --profile put in force stays until another: pf (profile 0) again
    warm, write = chases(timed, "chase --warm --lines 3000 --span 2M --loads 20000 --profile 0; "
                                "chase --write --cold --lines 5000 --span 64M --loads 5000")
    assert warm["p50_ns_per_load"] == pytest.approx(fc.CPU_L2_HIT_NS, rel=0.03)
    # each store waits for its write, then the loop's own few instructions run (1 ns each)
    assert 0 <= write["p50_ns_per_load"] - vtime.expected_idle_ns(topo, "pf", write=True) < 10


@pytest.mark.parametrize("fabric", ("pf", "electrical"))
def test_a_sequential_read_reaches_the_hosts_bandwidth_bound(timed, topo, fabric):
    row, = chases(timed, f"{STREAM} --profile {vtime.FABRICS.index(fabric)}")
    gbs = 64 / row["p50_ns_per_load"]      # the median of 1024-load batches: no tick in it
    assert gbs == pytest.approx(vtime.sequential_bound_gbs(topo, fabric), rel=0.10)


def test_the_same_command_reads_the_same_figures_while_a_cpu_hog_runs(timed, tmp_path):
    """A second boot, with a busy loop competing for the CPUs all along: every latency of the sweep
    equals the first guest's, in TSC ticks (virtual ns: no boot's clock calibration enters them)."""
    first = getattr(timed, "sweep", None) or chases(timed, SWEEP)
    from pfcxl import Machine
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with Machine(TOPOLOGY, clock="virtual", run_dir=tmp_path / "again", name="again",
                     ready_timeout=300) as again:
            second = chases(again, SWEEP)
    finally:
        hog.kill()
        hog.wait()
    assert [r["p50_ticks_per_load"] for r in second] == [r["p50_ticks_per_load"] for r in first]
