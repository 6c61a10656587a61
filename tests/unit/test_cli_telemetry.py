"""The appliance's timing thread in-process (device/appliance/timing.py: rings, drain, sync,
detach) and the tables `appliance top` / `multihost --timing trace` print from its figures."""

from __future__ import annotations

import io
import os
import threading

import numpy as np
import pytest
from rich.console import Console

from pfcxl.device.topology import address_map
from pfcxl.device.fabric import model as fabric_model
from pfcxl.device import topology
from pfcxl.device.trace import records as tf
from pfcxl.device.appliance.timing import ApplianceTiming
from pfcxl.host_tools.timing import telemetry_view
from pfcxl.device.trace.ring import Ring

TOPO = topology.load(topology.resolve("pf-appliance"))
APP = TOPO.appliance

pytestmark = pytest.mark.unit


def produce(fd: int, n: int, writes: bool = False) -> None:
    """What the plugin does, through the descriptor the appliance handed out."""
    ring = Ring.open(f"/proc/self/fd/{fd}")
    try:
        r = np.zeros(n, np.dtype(tf.RECORD_FIELDS))
        r["insn"] = np.arange(n, dtype=np.uint64) * 4000
        r["hpa"] = address_map.dax_placements(TOPO)[0].base + np.arange(n, dtype=np.uint64) * 4096
        r["size"], r["write"] = 8, writes
        start = tf.HEADER_SIZE + ring.head * tf.RECORD_SIZE
        ring._mm[start:start + r.nbytes] = r.tobytes()
        ring._head.value = ring.head + n
    finally:
        ring.close()


def synced(timing: ApplianceTiming) -> dict:
    done = threading.Event()
    timing.sync(done.set)
    assert done.wait(30), "the timing thread did not answer a sync"
    return timing.stats()


@pytest.fixture
def timing():
    t = ApplianceTiming(TOPO, "pf", capacity=4096).start()
    yield t
    t.close()


def test_the_thread_drains_models_and_keeps_a_gone_hosts_figures(timing):
    offsets = {"shared": 0, "private/0": APP.shared}
    fd = timing.attach(2, 4, offsets, 0)
    produce(fd, 3000)
    stats = synced(timing)
    host = stats["hosts"][0]
    assert (host["host"], host["port"], host["reads"], host["attached"]) == (2, 4, 3000, True)
    assert host["ring"] == {"capacity": 4096, "largest_fill": 3000, "dropped": 0, "drained": 3000, "implausible": 0,
                            "cut": None}
    assert stats["rings"]["largest_fill"] == 3000 and stats["pending"] == 0 and stats["error"] is None
    timing.detach(2)
    stats = synced(timing)
    assert not stats["hosts"][0]["attached"] and stats["hosts"][0]["reads"] == 3000
    with pytest.raises(OSError):
        os.fstat(fd)                                  # the ring is released once drained
    fd = timing.attach(2, 4, offsets, 0)              # back: a new ring, the same host's figures
    produce(fd, 1000, writes=True)
    host = synced(timing)["hosts"][0]
    assert (host["reads"], host["writes"], host["ring"]["drained"]) == (3000, 1000, 4000)


def test_the_tables_label_every_figure_with_its_model(timing):
    produce(timing.attach(0, 0, {"shared": 0}, None), 2000)
    stats = {**synced(timing), "appliance": {"topology": TOPO.name}, "pid": 1}
    text = io.StringIO()
    Console(file=text, width=250, color_system=None).print(telemetry_view.render(stats))
    out = text.getvalue()
    assert "modelled PF appliance (DDR5 path) and modelled PF + HBM3E cache, dependent issue" in out
    assert "2,000 CXL requests modelled" in out and "0 dropped" in out
    p = stats["hosts"][0]["latency_ns"]["pf"]["read"]
    assert abs(p["p50"] - fabric_model.idle_ns("pf", False)) <= fabric_model.fc.PF_JITTER_READ_NS
    assert f"{p['p50']} / {p['p99']}" in out
    assert "the paper's loaded PF range: reads 275-290 ns" in out and "traced/s" not in out
    later = {**stats, "hosts": [{**stats["hosts"][0], "bytes": stats["hosts"][0]["bytes"] + 64 * 1024}]}
    text = io.StringIO()
    Console(file=text, width=250, color_system=None).print(telemetry_view.render(later, stats, 2.0))
    assert "32.0 KiB/s" in text.getvalue() and "emulator's wall clock (TCG), not a fabric rate" in text.getvalue()


def test_a_hosts_own_report_leaves_out_hosts_that_are_gone(timing):
    """`pfcxl run --host 3` on a timed appliance where host 0 ran and left: its tables show host 3
    alone and say the modules count everyone; amounts read in one unit style (no '192064 B')."""
    produce(timing.attach(0, 0, {"shared": 0}, None), 3001)        # 3,001 x 64 B = 192,064 B
    timing.detach(0)
    produce(timing.attach(3, 1, {"shared": 0}, None), 500)
    stats = {**synced(timing), "appliance": {"topology": TOPO.name}, "pid": 1}
    assert {h["host"] for h in stats["hosts"]} == {0, 3}
    mine = telemetry_view.for_host(stats, 3)
    text = io.StringIO()
    Console(file=text, width=400, color_system=None).print(telemetry_view.render(mine))
    host_table = text.getvalue().split("per module")[0]
    rows = [line for line in host_table.splitlines() if line.startswith("│")]
    assert [r.split("│")[1].strip() for r in rows] == ["3"], host_table
    assert "(gone)" not in host_table and "host 3 only; the modules carry every host's traffic" in text.getvalue()
    text = io.StringIO()
    Console(file=text, width=400, color_system=None).print(telemetry_view.render(stats))
    assert "188 KiB" in text.getvalue() and "192064 B" not in text.getvalue()
