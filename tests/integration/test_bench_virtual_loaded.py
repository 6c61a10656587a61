"""The guests' loaded-latency curve (`pfcxl bench --clock virtual -t pf-appliance`,
host_tools/bench/virtual_loaded.py): two timed guests in one timeline on the electrical pool,
its switch uplink narrowed to 2 GB/s (what-if switch_link_mbs=2000) so that one core's stream can
fill it. Host 1's stream at full pace holds the uplink and host 0's chase waits behind it; paced
to a sixteenth of the uplink, it leaves the chase near its idle latency. Every point agrees with
the offline engine's replay of both hosts' requests."""

from __future__ import annotations

import json

import pytest

from pfcxl.host_tools.bench import virtual_loaded
from pfcxl.host_tools.vm.boot_options import BootOptions

pytestmark = pytest.mark.integration


def test_a_paced_stream_loads_the_chase_as_the_model_says(tmp_path):
    options = BootOptions(clock="virtual", fabric="electrical", fabric_params=("switch_link_mbs=2000",))
    curve = virtual_loaded.run("pf-appliance", options, 2, 1000, out_dir=tmp_path, gaps=(0, 512))
    alone, full, paced = curve.report["points"]
    assert alone["gap_ticks"] is None and alone["chase_p50_ns"] == pytest.approx(833, rel=0.01)
    assert full["traffic_gbs"] == pytest.approx(2.0, rel=0.05)           # the uplink's bandwidth
    assert paced["traffic_gbs"] == pytest.approx(64 / 512, rel=0.05)    # the pace asked for
    assert full["chase_p50_ns"] > 1.5 * alone["chase_p50_ns"]
    assert paced["chase_p50_ns"] < 1.1 * alone["chase_p50_ns"]
    for p in curve.report["points"]:
        assert p["traffic_outlasted_chase"]
        assert p["chase_mean_ns"] == pytest.approx(p["model_mean_ns"], rel=0.10), p
    assert json.loads((tmp_path / "results.json").read_text()) == curve.report
