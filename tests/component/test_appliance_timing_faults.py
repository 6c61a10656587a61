"""A timed appliance facing what one client can do to it: write its own trace ring's header,
write records its plugin cannot have produced, or capture onto a full disk. The service is run
for real (no VMs); the test plays the plugin, as tests/component/test_appliance_timing.py does."""

from __future__ import annotations

import io
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from pfcxl.device.appliance import rundir as appliance_rundir
from pfcxl.device.trace import capture as trace_capture
from pfcxl.device.trace import records as tf
from pfcxl.device.trace.plausible import MAX_INSN_PER_SECOND
from pfcxl.errors import PfcxlError
from pfcxl.host_tools.timing import telemetry_view
from pfcxl.host_tools import appliance_client as appliance

from .appliance_helpers import _stop_and_check, play_plugin, reads_of_the_shared_region, write_topology

# What a client may write into its own ring's header (head, tail; the capacity is 2^19):
# each breaks one invariant of the ring, and the last one (tail moved back, head - tail within
# the capacity) used to be drained again as if new.
CAPACITY = 1 << 19
CORRUPTIONS = {
    "tail ahead of head": lambda head, tail: (head, head + 1),
    "head moved back": lambda head, tail: (head - 5, tail),
    "head past the capacity": lambda head, tail: (tail + CAPACITY + 1, tail),
    "head at 2^64-1": lambda head, tail: ((1 << 64) - 1, tail),
    "tail moved back": lambda head, tail: (head, tail - 10),
}

pytestmark = pytest.mark.component


def corrupt(att: appliance.Attachment, how) -> None:
    fd = att.ring_fd
    head, tail = struct.unpack("<QQ", os.pread(fd, 16, tf.HEAD_OFFSET))
    os.pwrite(fd, struct.pack("<QQ", *how(head, tail)), tf.HEAD_OFFSET)


def host(stats: dict, h: int) -> dict:
    return next(e for e in stats["hosts"] if e["host"] == h)


def log_of(run_dir: Path) -> str:
    return (run_dir / appliance_rundir.LOG).read_text()


def test_a_ring_its_client_corrupts_is_cut_and_every_other_host_goes_on(tmp_path):
    topo, path = write_topology(tmp_path / "t.toml", ports=8, module_capacity="1G")
    run_dir, folder = tmp_path / "run", tmp_path / "capture"
    pid = appliance.start(topo, path, run_dir, scan_interval=3600, fabric="pf", capture=folder)
    played = reads_of_the_shared_region(topo, 700)
    try:
        with appliance.Client(run_dir) as c:
            good = c.attach(0)
            bad = {h: c.attach(h) for h in range(1, 1 + len(CORRUPTIONS))}
            for att in (good, *bad.values()):
                play_plugin(att, played[:200])
            c.call("stats", sync=True)
            for att, how in zip(bad.values(), CORRUPTIONS.values()):
                corrupt(att, how)
            for i in (1, 2):                            # windows after the corruption
                play_plugin(good, played[200 * i:200 * (i + 1)])
                stats = c.call("stats", sync=True)
            assert stats["error"] is None and stats["failures"] == 0 and stats["pending"] == 0
            assert host(stats, 0)["reads"] == 600 and host(stats, 0)["attached"]
            for h, why in zip(bad, CORRUPTIONS):
                e = host(stats, h)
                assert e["reads"] == 200 and not e["attached"], why
                assert "corrupt ring" in e["ring"]["cut"], why
            assert [x["host"] for x in stats["rings"]["cut"]] == list(bad)
            text = io.StringIO()
            Console(file=text, width=400, color_system=None).print(telemetry_view.render(stats))
            assert all(f"host {h}'s ring detached: " in text.getvalue() for h in bad)
            assert text.getvalue().count("(cut)") == len(bad)
            logged = log_of(run_dir)
            for _ in range(5):                          # more windows: the log does not grow
                play_plugin(good, played[600:600])
                c.call("stats", sync=True)
            assert log_of(run_dir) == logged
            assert logged.count("trace ring detached") == len(bad) and "Traceback" not in logged
            late = c.attach(7)                          # attached after the corruption: drained and modelled
            play_plugin(late, played[:50])
            play_plugin(good, played[600:])
            stats = c.call("stats", sync=True)
            assert host(stats, 7)["reads"] == 50 and host(stats, 0)["reads"] == 700
            assert host(stats, 7)["ring"]["cut"] is None
    finally:
        _stop_and_check(run_dir, pid)
    with pytest.raises(PfcxlError, match="incomplete: .*host 1 stream 2 cut: .*corrupt ring"):
        trace_capture.read_capture(folder)
    got = trace_capture.read_capture(folder, need_complete=False)
    assert np.array_equal(got["hosts"][0]["records"], played)
    assert all(np.array_equal(got["hosts"][h]["records"], played[:200]) for h in bad)
    assert np.array_equal(got["hosts"][7]["records"], played[:50])


def implausible_after(last: int, rng: np.random.Generator) -> list[int]:
    """Counts no plugin can write after `last` within a test's few seconds: jumps of 2^40 and
    beyond (up to the u64's end), and steps back of every size."""
    ahead = [last + (1 << 40), last + (1 << 50), (1 << 64) - 1, (1 << 63)]
    ahead += [int(x) for x in rng.integers(last + 300 * MAX_INSN_PER_SECOND, 1 << 63, 4, dtype=np.int64)]
    back = [last - 1, 0] + [int(x) for x in rng.integers(0, last, 3)]
    return ahead + back


def test_records_a_plugin_cannot_have_written_are_refused_and_counted(tmp_path):
    topo, path = write_topology(tmp_path / "t.toml")
    run_dir = tmp_path / "run"
    pid = appliance.start(topo, path, run_dir, scan_interval=3600, fabric="pf")
    rng = np.random.default_rng(8)
    played = reads_of_the_shared_region(topo, 400)
    try:
        with appliance.Client(run_dir) as c:
            honest, hostile = c.attach(0), c.attach(1)
            for att in (honest, hostile):
                play_plugin(att, played[:200])
            before = c.call("stats", sync=True)
            last = int(played["insn"][199])
            bad = implausible_after(last, rng)
            mixed = []                                  # each implausible record between plausible ones
            for i, count in enumerate(bad):
                wrong = played[200 + i:201 + i].copy()
                wrong["insn"] = count
                mixed += [played[200 + i:201 + i], wrong]
            play_plugin(hostile, np.concatenate(mixed + [played[200 + len(bad):201 + len(bad)]]))
            play_plugin(honest, played[200:])
            stats = c.call("stats", sync=True)
    finally:
        _stop_and_check(run_dir, pid)
    assert host(stats, 1)["reads"] == 200 + len(bad) + 1 and host(stats, 0)["reads"] == 400
    assert stats["rings"]["implausible"] == len(bad) == host(stats, 1)["ring"]["implausible"]
    # the model's time is the records' own: no host's 10^12 ns, no utilisation shrunk a millionfold
    span_ns = int(played["insn"][-1])
    assert stats["model_ns"]["pf"] < 2 * span_ns
    busy = host(stats, 0)["utilisation"]["pf"]["port_up"]
    assert busy >= host(before, 0)["utilisation"]["pf"]["port_up"] / 3 > 0


def test_a_capture_on_a_full_disk_stops_and_the_modelling_goes_on(tmp_path):
    """/dev/full answers every write with ENOSPC, as a full file system does: host 1's stream file
    and, later, the manifest's temporary file are made to be it."""
    topo, path = write_topology(tmp_path / "t.toml")
    run_dir, folder = tmp_path / "run", tmp_path / "capture"
    pid = appliance.start(topo, path, run_dir, scan_interval=3600, fabric="pf", capture=folder)
    played = reads_of_the_shared_region(topo, 3000)
    try:
        (folder / "host01.s2.records.partial").symlink_to("/dev/full")
        with appliance.Client(run_dir) as c:
            fine, full = c.attach(0), c.attach(1)
            for att in (fine, full):
                play_plugin(att, played[:1500])
            stats = c.call("stats", sync=True)
            assert host(stats, 0)["reads"] == host(stats, 1)["reads"] == 1500
            assert "writing host01.s2.records: No space left on device" in stats["capture"]["error"]
            (folder / "capture.json.tmp").symlink_to("/dev/full")     # now the manifest cannot be written either
            for att in (fine, full):
                play_plugin(att, played[1500:])
            stats = c.call("stats", sync=True)
            assert stats["error"] is None and stats["pending"] == 0
            assert host(stats, 0)["reads"] == host(stats, 1)["reads"] == 3000
            assert stats["capture"]["lost"] == 3000 + 1500            # host 1's all, host 0's after the stop
            assert appliance_rundir.shm_dir(run_dir).exists() and (run_dir / appliance_rundir.ATTACHMENTS).exists()
        assert "capture" in log_of(run_dir) and "No space left on device" in log_of(run_dir)
    finally:
        _stop_and_check(run_dir, pid)
    # stop cleaned up: no pool in /dev/shm, no attachments, no temporary manifest
    assert not appliance_rundir.shm_dir(run_dir).exists()
    assert not (run_dir / appliance_rundir.ATTACHMENTS).exists()
    assert not (folder / "capture.json.tmp").exists() and not list(folder.glob("*.tmp"))
    # the manifest (written again once the temporary file that failed was gone) says why it is incomplete,
    # and lists each stream with the whole records its file holds
    with pytest.raises(PfcxlError, match="incomplete: capture stopped: writing host01.s2.records: No space"):
        trace_capture.read_capture(folder)
    doc = json.loads((folder / trace_capture.MANIFEST).read_text())
    assert not doc["complete"] and doc["closed"]
    assert [(s["host"], s["records"]) for s in doc["streams"]] == [(0, 1500), (1, 0)]
    assert (folder / "host00.s1.records").stat().st_size == 1500 * tf.RECORD_SIZE
    got = trace_capture.read_capture(folder, need_complete=False)
    assert np.array_equal(got["hosts"][0]["records"], played[:1500])
