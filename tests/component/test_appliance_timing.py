"""A timed appliance service (`appliance start --fabric`), run for real without VMs: the test plays
the TCG plugin, writing records into the ring the service handed out, and checks what the
service's `stats` op then reports; and the op's hostile input."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from pfcxl.device.fabric import model as fabric_model
from pfcxl.device.trace import capture as trace_capture
from pfcxl.device.appliance.ops import MAX_SYNC_WAITING
from pfcxl.errors import PfcxlError
from pfcxl.host_tools import appliance_client as appliance

from .appliance_helpers import Raw, _stop_and_check, play_plugin, reads_of_the_shared_region, write_topology

pytestmark = pytest.mark.component


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    base = tmp_path_factory.mktemp("timed")
    topo, path = write_topology(base / "small.toml")
    run_dir = base / "run"
    pid = appliance.start(topo, path, run_dir, scan_interval=3600, fabric="pf")
    try:
        yield topo, run_dir
    finally:
        _stop_and_check(run_dir, pid)


def test_each_host_gets_its_own_ring_and_its_records_are_modelled(timed):
    topo, run_dir = timed
    with appliance.Client(run_dir) as c:
        att = c.attach(1)
        assert att.ring == {"capacity": att.ring["capacity"], "system": "pf", "issue": "dependent"}
        assert os.readlink(f"/proc/self/fd/{att.ring_fd}").startswith("/memfd:pfcxl-ring-host1")
        play_plugin(att, reads_of_the_shared_region(topo, 3000))
        stats = c.call("stats", sync=True)
        host = next(h for h in stats["hosts"] if h["host"] == 1)
        assert (host["port"], host["reads"], host["writes"], host["attached"]) == (att.port, 3000, 0, True)
        assert host["ring"]["largest_fill"] == 3000 and host["ring"]["dropped"] == 0
        idle = fabric_model.idle_ns("pf", write=False)
        read = host["latency_ns"]["pf"]["read"]
        assert read["count"] == 3000 and abs(read["p50"] - idle) <= fabric_model.fc.PF_JITTER_READ_NS
        assert sum(m["reads"] for m in stats["modules"]) == 3000
        assert stats["rings"]["largest_fill"] >= 3000 and stats["pending"] == 0
    with appliance.Client(run_dir) as c:                       # the host is gone; its figures stay
        stats = c.call("stats", sync=True)
        host = next(h for h in stats["hosts"] if h["host"] == 1)
        assert host["reads"] == 3000 and not host["attached"]
        assert c.call("status")["appliance"]["timing"] == {"system": "pf", "issue": "dependent", "capture": None}


def test_a_capturing_service_keeps_exactly_what_it_modelled(tmp_path):
    topo, path = write_topology(tmp_path / "small.toml")
    run_dir, folder = tmp_path / "run", tmp_path / "capture"
    pid = appliance.start(topo, path, run_dir, scan_interval=3600, fabric="pf", capture=folder)
    played = reads_of_the_shared_region(topo, 2500)
    try:
        with appliance.Client(run_dir) as c:
            assert c.call("hello")["appliance"]["timing"]["capture"] == str(folder)
            att = c.attach(2)
            play_plugin(att, played[:1000])
            c.call("stats", sync=True)
            play_plugin(att, played[1000:])
            host = next(h for h in c.call("stats", sync=True)["hosts"] if h["host"] == 2)
            assert host["reads"] == 2500
            # attached: its stream is still being written, and the manifest does not list it yet
            assert list(folder.glob("host02.s*.records.partial"))
            with pytest.raises(PfcxlError, match="not closed"):
                trace_capture.read_capture(folder)
    finally:
        _stop_and_check(run_dir, pid)
    got = trace_capture.read_capture(folder)
    assert got["complete"] and list(got["hosts"]) == [2] and got["hosts"][2]["port"] == att.port
    assert np.array_equal(got["hosts"][2]["records"], played)


BAD_STATS = [b'{"op": "stats", "sync": 1}', b'{"op": "stats", "sync": "yes"}', b'{"op": "stats", "sync": null}',
             b'{"op": "stats", "host": 0}', b'{"op": "stats", "sync": [true]}']


def test_bad_stats_requests_get_one_clear_error_each(timed):
    _, run_dir = timed
    raw = Raw(run_dir)
    try:
        raw.send(b"\n".join(BAD_STATS) + b"\n")
        errors = [r["error"] for r in raw.replies(len(BAD_STATS))]
    finally:
        raw.close()
    assert errors[:3] == ["stats: field 'sync' must be bool, got int", "stats: field 'sync' must be bool, got str",
                          "stats: field 'sync' must be bool, got NoneType"]
    assert errors[3] == "stats: unknown field 'host'"
    assert errors[4] == "stats: field 'sync' must be bool, got list"


def test_a_flood_of_synced_stats_is_answered_without_piling_up(timed):
    _, run_dir = timed
    raw = Raw(run_dir)
    try:
        n = MAX_SYNC_WAITING * 3
        raw.send(b"".join(json.dumps({"op": "stats", "sync": True, "id": i}).encode() + b"\n" for i in range(n)))
        replies = raw.replies(n)
    finally:
        raw.close()
    ok = [r for r in replies if r["ok"]]
    refused = [r for r in replies if not r["ok"]]
    assert len(ok) >= MAX_SYNC_WAITING and len(ok) + len(refused) == n
    assert all("already waiting" in r["error"] for r in refused)
    assert sorted(r["id"] for r in replies) == list(range(n))
    with appliance.Client(run_dir) as c:
        assert c.call("hello")["appliance"]["timing"]["system"] == "pf"


def test_an_untimed_appliance_says_why_it_has_no_figures(services):
    s = services()
    with s.client() as c:
        reply, _ = c.request("stats")
        assert not reply["ok"]
        assert reply["error"] == ("this appliance models no traffic and keeps no timeline: it was started "
                                  "without --fabric or --clock virtual (pfcxl appliance start --fabric "
                                  "pf|electrical, or --clock virtual)")
        att = c.attach(0)
        assert att.ring_fd is None and att.ring is None
