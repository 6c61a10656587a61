"""Appliance-side timing with real guests: two hosts on a timed appliance (`multihost --timing
trace`) chase pointers through the shared pool; the appliance drains both hosts' trace rings,
merges them and models them on the PF fabric (device/appliance/timing.py)."""

from __future__ import annotations

import pytest

from pfcxl.device.fabric import constants as fc
from pfcxl.device.fabric import model as fabric_model
from pfcxl.device import topology
from pfcxl.device.trace import capture as trace_capture
from pfcxl.host_tools.fleet import multihost

pytestmark = pytest.mark.integration

LOADS = 5000


def test_two_timed_hosts_are_merged_and_modelled_on_the_pf_fabric(tmp_path):
    path = topology.resolve("pf-appliance")
    figures: dict = {}
    results = multihost.run(topology.load(path), path, 2, f"chase --dax /dev/dax0.0 --loads {LOADS}",
                            fabric="pf", telemetry=figures.update, capture=tmp_path / "capture")
    assert [(r.host, r.status, r.error) for r in results] == [(0, 0, None), (1, 0, None)], results
    hosts = {h["host"]: h for h in figures["hosts"]}
    assert sorted(hosts) == [0, 1]
    idle = fabric_model.idle_ns("pf", write=False)
    for h in hosts.values():
        assert h["reads"] >= LOADS, h                    # every load of the chase reached the model
        assert h["ring"]["drained"] == h["reads"] + h["writes"] and h["ring"]["dropped"] == 0
        p50 = h["latency_ns"]["pf"]["read"]["p50"]
        assert idle - fc.PF_JITTER_READ_NS <= p50 <= fc.PF_PAPER_LOADED_READ_NS[1], h["latency_ns"]
    # every record was one of the hosts' pool addresses, and the modules saw what the hosts sent
    assert figures["unmapped"] == 0 and figures["records"] == sum(h["reads"] + h["writes"] for h in hosts.values())
    assert sum(m["reads"] for m in figures["modules"]) == sum(h["reads"] for h in hosts.values())
    assert figures["rings"]["dropped"] == 0 and 0 < figures["rings"]["largest_fill"] <= figures["rings"]["capacity"]
    assert figures["error"] is None and figures["pending"] == 0
    # the real plugin's rings keep their invariants and its counts are within the plausible bound
    assert figures["rings"]["implausible"] == 0 and figures["rings"]["cut"] == []
    # --capture: each host's capture holds exactly the records the service drained and modelled,
    # complete (the temporary appliance closed it), with the plugin's one phase (the bracket) per host
    got = trace_capture.read_capture(tmp_path / "capture")
    assert got["complete"] and got["system"] == "pf" and sorted(got["hosts"]) == [0, 1]
    for host, cap in got["hosts"].items():
        h = hosts[host]
        assert len(cap["records"]) == h["ring"]["drained"] == h["reads"] + h["writes"]
        assert int((cap["records"]["write"] == 0).sum()) == h["reads"]
        assert [p["reads"] + p["writes"] for p in cap["phases"]] == [len(cap["records"])]
