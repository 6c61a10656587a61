"""The appliance's capture of drained trace records (device/trace/capture.py)."""

import json

import numpy as np
import pytest

from pfcxl.device.trace import capture as trace_capture
from pfcxl.device.trace.records import RECORD_FIELDS
from pfcxl.errors import ApplianceError, PfcxlError

pytestmark = pytest.mark.component


def records(n: int, host: int, start: int = 0) -> np.ndarray:
    r = np.zeros(n, dtype=np.dtype(RECORD_FIELDS))
    r["insn"] = np.arange(start, start + n) * 3
    r["hpa"] = 0x1_0000_0000 + np.arange(start, start + n) * 64 + host * 4096
    r["size"] = 64
    r["write"] = np.arange(n) % 2
    return r


def test_round_trip_keeps_every_record_in_order_with_phases(tmp_path):
    folder = tmp_path / "cap"
    w = trace_capture.CaptureWriter(folder, "pf")
    w.stream(1, host=0, port=0)
    w.stream(2, host=5, port=5)
    a1, a2, b = records(100, 0), records(50, 0, 100), records(70, 5)
    w.add(1, a1)
    w.add(2, b)
    w.add(1, a2)
    w.finish(1)
    # host 0 detached: listed; host 5 still open: a .partial file, not listed, capture not complete
    doc = json.loads((folder / trace_capture.MANIFEST).read_text())
    assert [s["host"] for s in doc["streams"]] == [0] and doc["complete"] is False
    assert (folder / "host05.s2.records.partial").exists()
    with pytest.raises(PfcxlError, match="not closed"):
        trace_capture.read_capture(folder)
    assert list(trace_capture.read_capture(folder, need_complete=False)["hosts"]) == [0]
    w.stream(3, host=0, port=0)                  # host 0 attaches again: its records follow on
    a3 = records(10, 0, 150)
    w.add(3, a3)
    trace_capture.write_phases(folder, 0, [{"event": "phase", "reads": 80, "writes": 80}])
    w.close()
    got = trace_capture.read_capture(folder)
    assert got["complete"] and got["system"] == "pf" and sorted(got["hosts"]) == [0, 5]
    assert np.array_equal(got["hosts"][0]["records"], np.concatenate([a1, a2, a3]))
    assert np.array_equal(got["hosts"][5]["records"], b)
    assert got["hosts"][0]["phases"] == [{"event": "phase", "reads": 80, "writes": 80}]
    assert got["hosts"][5]["phases"] is None and got["hosts"][5]["port"] == 5
    assert not list(folder.glob("*.partial")) and not list(folder.glob("*.tmp"))


def test_a_truncated_stream_is_refused(tmp_path):
    w = trace_capture.CaptureWriter(tmp_path / "cap", "electrical")
    w.stream(1, host=2, port=2)
    w.add(1, records(20, 2))
    w.close()
    path = tmp_path / "cap" / "host02.s1.records"
    path.write_bytes(path.read_bytes()[:-24])
    with pytest.raises(PfcxlError, match="the manifest says 20 records"):
        trace_capture.read_capture(tmp_path / "cap")


def test_bad_directories_are_refused_in_one_line(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "file").write_text("x")
    for bad, why in ((tmp_path / "full", "not empty"), (tmp_path / "file", "not a directory"),
                     (tmp_path / "no" / "cap", "does not exist")):
        with pytest.raises(ApplianceError, match=why) as exc:
            trace_capture.CaptureWriter(bad, "pf")
        assert "\n" not in str(exc.value)
    assert not (tmp_path / "no").exists()
    with pytest.raises(PfcxlError, match="not a capture's manifest"):
        trace_capture.read_capture(tmp_path / "full")


def test_appliance_start_checks_capture_before_starting(tmp_path):
    from pfcxl.device import topology
    from pfcxl.host_tools import appliance_client as appliance
    path = topology.resolve("pf-appliance")
    topo = topology.load(path)
    with pytest.raises(ApplianceError, match="needs|give --fabric"):
        appliance.start(topo, path, tmp_path / "run", capture=tmp_path / "cap")
    (tmp_path / "cap").mkdir()
    (tmp_path / "cap" / "old").write_text("x")
    with pytest.raises(ApplianceError, match="not empty"):
        appliance.start(topo, path, tmp_path / "run", fabric="pf", capture=tmp_path / "cap")
    assert appliance.running_pid(tmp_path / "run") is None


def test_a_stream_cut_short_keeps_its_records_and_the_capture_is_not_complete(tmp_path):
    w = trace_capture.CaptureWriter(tmp_path / "cap", "pf")
    w.stream(1, host=0, port=0)
    w.stream(2, host=1, port=1)
    w.add(1, records(30, 0))
    w.add(2, records(10, 1))
    w.finish(2, cut="corrupt ring (head 5 after 9)")
    w.close()
    doc = json.loads((tmp_path / "cap" / trace_capture.MANIFEST).read_text())
    assert doc["closed"] and not doc["complete"]
    assert doc["problems"] == ["host 1 stream 2 cut: corrupt ring (head 5 after 9)"]
    with pytest.raises(PfcxlError, match=r"incomplete: host 1 stream 2 cut: corrupt ring \(head 5 after 9\)"):
        trace_capture.read_capture(tmp_path / "cap")
    got = trace_capture.read_capture(tmp_path / "cap", need_complete=False)
    assert np.array_equal(got["hosts"][1]["records"], records(10, 1)) and len(got["hosts"][0]["records"]) == 30


def test_a_full_disk_at_any_write_loses_no_consistency_and_raises_nothing(tmp_path):
    """/dev/full (ENOSPC on every write) stands for a full file system at a file the capture
    writes: the manifest's temporary file, or a stream's file (the stream opened just then), at
    the first stream, in the middle or at the close. What is left is never a temporary file, never
    a manifest claiming completeness, and every listed stream holds exactly its count."""
    for case, (manifest, stage) in enumerate((m, st) for m in (True, False) for st in (0, 1, 2)):
        folder = tmp_path / f"c{case}"
        w = trace_capture.CaptureWriter(folder, "pf")

        def fill_up(key: int, host: int) -> None:
            name = trace_capture.MANIFEST + ".tmp" if manifest else f"host{host:02d}.s{key}.records.partial"
            (folder / name).symlink_to("/dev/full")

        plan = {0: (1, 0), 1: (3, 2), 2: (4, 3)}    # stage -> the stream opened right after the disk filled
        if stage == 0:
            fill_up(*plan[0])
        w.stream(1, host=0, port=0)
        w.stream(2, host=1, port=1)
        w.add(1, records(40, 0))
        if stage == 1:
            fill_up(*plan[1])
        w.stream(3, host=2, port=2)
        w.add(2, records(20, 1))
        w.add(3, records(10, 2))
        w.add(1, records(40, 0, 40))
        w.finish(2)
        if stage == 2:
            fill_up(*plan[2])
        w.stream(4, host=3, port=3)
        w.add(4, records(5, 3))
        w.close()
        what = (manifest, stage)
        assert w.error is not None and "No space left on device" in w.error, what
        assert not list(folder.glob("*.tmp")), what
        doc = json.loads((folder / trace_capture.MANIFEST).read_text())
        assert not doc["complete"] and doc["problems"], what
        for s in doc["streams"]:
            path = folder / s["file"]
            if not path.is_symlink():             # the stream whose file was /dev/full has nothing to read
                assert path.stat().st_size == s["records"] * 24, what
        if not manifest:
            assert w.lost > 0, what
