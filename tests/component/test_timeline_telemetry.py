"""A timeline's telemetry (`pfcxl appliance top|stats` on an appliance started with --clock
virtual, and no --fabric): the timeline's table, with each timed host's state, virtual time,
waits and contention, read from the file the hosts' plugins share (its slots written here as a
plugin writes them)."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys

import pytest

from pfcxl.device.appliance import timeline
from pfcxl.host_tools import appliance_client as appliance

from .appliance_helpers import _stop_and_check, write_topology

pytestmark = pytest.mark.component


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "250"})


@pytest.fixture
def timed_appliance(tmp_path):
    topo, path = write_topology(tmp_path / "topology.toml")
    run_dir = tmp_path / "run"
    pid = appliance.start(topo, path, run_dir, scan_interval=3600, quantum_ns=2000)
    try:
        yield path, run_dir
    finally:
        _stop_and_check(run_dir, pid)


def host_in_round(run_dir) -> None:
    """Host 3 in a round under way, as its plugin leaves the slot after 7 quanta."""
    with open(timeline.path_in(run_dir), "r+b") as f, mmap.mmap(f.fileno(), timeline.SIZE) as m:
        head = timeline._Head.from_buffer(m)
        head.started, head.epoch, head.merged = 1, 7, 1234
        s = head.slots[3]
        s.state, s.pid, s.quanta, s.time_ps = timeline.STATES.index("in"), os.getpid(), 7, 13_500_000
        s.requests, s.contention_ps, s.wait_ns = 321, 4_500_000, 2_500_000_000
        del head, s             # no exported pointer into the mapping is left when it closes


def test_top_and_stats_show_the_timeline_of_an_appliance_that_models_no_traffic(timed_appliance):
    path, run_dir = timed_appliance
    where = ("-t", str(path), "--run-dir", str(run_dir))
    empty = cli("appliance", "top", "--once", *where)
    assert empty.returncode == 0, empty.stderr
    assert "no fabric model" in empty.stdout and "no timed host has joined yet" in empty.stdout
    assert "quantum 2,000 ns" in empty.stdout
    host_in_round(run_dir)
    shown = cli("appliance", "top", "--once", *where)
    assert shown.returncode == 0, shown.stderr
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in shown.stdout.splitlines() if "│" in line]
    # host, state, pid, virtual time, lag (the timeline is at 7 quanta of 2 us), quanta, requests,
    # contention, host seconds waited
    assert rows == [["3", "in", str(os.getpid()), "13.5 us", "0.5 us", "7", "321", "4,500 ns", "2.50"]]
    assert "round under way" in shown.stdout and "1,234 requests merged" in shown.stdout
    stats = json.loads(cli("appliance", "stats", "--json", *where).stdout)["timeline"]
    assert stats["quantum_ns"] == 2000 and stats["virtual_ns"] == 14_000
    assert [(h["host"], h["state"], h["lag_ns"], h["contention_ns"]) for h in stats["hosts"]] == [(3, "in", 500, 4500)]
