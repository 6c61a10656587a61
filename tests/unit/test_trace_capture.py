"""The appliance's capture of drained trace records (device/trace_capture.py)."""

import json

import numpy as np
import pytest

from pfcxl.device import trace_capture
from pfcxl.device.trace_format import RECORD_FIELDS
from pfcxl.errors import ApplianceError, PfcxlError


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
    from pfcxl.host_tools import appliance
    path = topology.resolve("pf-appliance")
    topo = topology.load(path)
    with pytest.raises(ApplianceError, match="needs|give --timing"):
        appliance.start(topo, path, tmp_path / "run", capture=tmp_path / "cap")
    (tmp_path / "cap").mkdir()
    (tmp_path / "cap" / "old").write_text("x")
    with pytest.raises(ApplianceError, match="not empty"):
        appliance.start(topo, path, tmp_path / "run", timing="pf", capture=tmp_path / "cap")
    assert appliance.running_pid(tmp_path / "run") is None
