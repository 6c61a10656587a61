"""A bandwidth run captured by the TCG plugin (`pfcxl run --timing trace --trace-out`) and
replayed at full load (`pfcxl model replay`): the captured stream keeps its accesses, and at load
1.0 the host offers one PF port's 25.6 GB/s, which the appliance carries over the ports its
addresses reach."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pfcxl.device.fabric import constants as fc
from pfcxl.device.fabric import model as fabric_model

from .conftest import pfcxl_cli

pytestmark = pytest.mark.integration

PORT_GBS = fc.PF_PORT_BANDWIDTH_MBS / 1000
LINES = 16384                       # 1 MiB of 64-B reads: the replay's last latency is under 1% of it


def test_a_captured_bandwidth_run_replays_at_full_load(tmp_path):
    trace = tmp_path / "bw.npy"
    done = pfcxl_cli("run", "--timing", "trace", "--issue", "independent", "--trace-out", str(trace), "--",
                     f"bandwidth --target /dev/dax0.0 --pattern seq --op read --sizes 64 --bytes {LINES * 64} "
                     f"--span {LINES * 64}")
    assert done.returncode == 0, done.stderr
    records = np.load(trace)
    reads = records[records["write"] == 0]
    assert len(reads) >= LINES                                  # every line the tool read, at least
    done = pfcxl_cli("model", "replay", str(trace), "--system", "pf", "--load", "1", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    ports = report["ports"]["port_up"]
    print(f"captured {len(records)} records; PF ports at load 1.0: {np.round(ports['gbs'], 2).tolist()} GB/s")
    # one host at load 1.0 offers 25.6 GB/s; the sequential walk spreads it evenly over the
    # modules the 4 KiB interleave reaches, and the appliance carries all of it: the reads come
    # up the ports, the tool's few writes (whole 64-byte lines, as the fabric moves them) go down
    carried = sum(report["ports"]["module"]["gbs"])
    assert carried == pytest.approx(PORT_GBS, rel=0.02)
    assert sum(ports["gbs"]) + sum(report["ports"].get("port_down", {"gbs": [0]})["gbs"]) == \
        pytest.approx(carried, rel=1e-6)
    assert max(ports["gbs"]) - min(ports["gbs"]) < 0.1 * max(ports["gbs"])
    # the captured gaps are kept in proportion, so the guest's bursts queue at the ports: at full
    # load the median is above the idle 283 ns; at a light load it is the idle figure
    idle = fabric_model.idle_ns("pf", False)
    assert report["read"]["p50"] >= idle - fc.PF_JITTER_READ_NS
    light = json.loads(pfcxl_cli("model", "replay", str(trace), "--system", "pf", "--load", "0.05",
                                 "--json").stdout)
    print(f"read p50 at load 1.0: {report['read']['p50']:.1f} ns, at load 0.05: {light['read']['p50']:.1f} ns")
    assert light["read"]["p50"] == pytest.approx(idle, abs=fc.PF_JITTER_READ_NS + 1)
