"""The trace ring without QEMU: its header is the documented layout, and the drain logic works
against a producer written in Python the way the plugin writes (records first, then head; waits
when full), refusing every header the drainer did not leave."""

from __future__ import annotations

import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pfcxl.device.trace import records as tf
from pfcxl.device.trace import ring as trace_ring
from pfcxl.host_tools.timing import config as timing

pytestmark = pytest.mark.component


class FakePlugin:
    """Produces records the way pfcxl_plugin.c does: write the slot, then publish head; wait
    (never overwrite) while the ring is full."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "r+b", buffering=0)   # unbuffered: see the drainer's tail
        self.capacity = struct.unpack_from("<Q", self.f.read(64), 16)[0]

    def _u64(self, offset: int) -> int:
        self.f.seek(offset)
        return struct.unpack("<Q", self.f.read(8))[0]

    def push(self, rec: tuple, timeout: float = 10) -> None:
        head = self._u64(24)
        deadline = time.monotonic() + timeout
        while head - self._u64(32) >= self.capacity:
            assert time.monotonic() < deadline, "drainer never made room"
            time.sleep(0.0005)
        self.f.seek(tf.HEADER_SIZE + (head % self.capacity) * tf.RECORD_SIZE)
        self.f.write(struct.pack("<QQIBBH", *rec))
        self.f.flush()
        self.f.seek(24)
        self.f.write(struct.pack("<Q", head + 1))
        self.f.flush()


def rec(i: int) -> tuple:
    return (1000 + i, 0x3_9000_0000 + 64 * i, 8 + i % 57, i % 2, i % 3, 0)


def test_ring_header_is_the_documented_layout(tmp_path):
    ring = trace_ring.Ring.create(tmp_path / "r", capacity=100)
    raw = (tmp_path / "r").read_bytes()
    assert len(raw) == 64 + 100 * 24
    magic, version, size, cap, head, tail, dropped = tf.HEADER_STRUCT.unpack_from(raw)
    assert raw[:8] == b"PFCXLRNG" and magic == tf.RING_MAGIC
    assert (version, size, cap, head, tail, dropped) == (1, 24, 100, 0, 0, 0)
    assert raw[48:64] == bytes(16)
    assert np.dtype(tf.RECORD_FIELDS).itemsize == tf.RECORD_SIZE
    ring.close()
    ring.close()   # harmless twice


def test_ring_open_rejects_other_files(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"NOTARING" + bytes(200))
    with pytest.raises(timing.TimingError, match="not a version-1 trace ring"):
        trace_ring.Ring.open(bad)
    short = tmp_path / "short"
    trace_ring.Ring.create(short, capacity=10).close()
    with open(short, "r+b") as f:
        f.truncate(64 + 5 * 24)
    with pytest.raises(timing.TimingError, match="claims 10 records"):
        trace_ring.Ring.open(short)


def test_drain_returns_records_in_order_across_the_wrap(tmp_path):
    ring = trace_ring.Ring.create(tmp_path / "r", capacity=8)
    producer = FakePlugin(tmp_path / "r")
    got = []
    for batch in (5, 3, 7, 8, 0, 1):          # head wraps several times
        start = ring.head
        for i in range(start, start + batch):
            producer.push(rec(i))
        records = ring.drain()
        assert ring.tail == ring.head == start + batch
        got.extend(records.tolist())
    assert got == [rec(i) for i in range(24)]
    ring.close()


def test_drain_refuses_a_corrupt_ring(tmp_path):
    ring = trace_ring.Ring.create(tmp_path / "r", capacity=4)
    with open(tmp_path / "r", "r+b") as f:
        f.seek(24)
        f.write(struct.pack("<QQ", 9, 2))     # head - tail > capacity
    with pytest.raises(timing.TimingError, match="corrupt ring"):
        ring.drain()
    ring.close()


def test_drain_refuses_every_header_the_drainer_did_not_leave(tmp_path):
    """Only the drainer stores tail and head never goes back: a header that says otherwise
    (within the capacity, which once passed) is refused, not drained again."""
    for i, (head, tail) in enumerate([(6, 3), (6, 5), (4, 6), (5, 5), (6, 7), (3, 2)]):
        ring = trace_ring.Ring.create(tmp_path / f"r{i}", capacity=4)
        producer = FakePlugin(tmp_path / f"r{i}")
        for j in range(6):
            producer.push(rec(j))
            if j in (1, 3):
                ring.drain()                  # head and tail at 4 after the second drain
        with open(tmp_path / f"r{i}", "r+b") as f:
            f.seek(24)
            f.write(struct.pack("<QQ", head, tail))
        with pytest.raises(timing.TimingError, match="corrupt ring"):
            ring.drain()
        ring.close()


def test_drainer_thread_keeps_up_with_a_waiting_producer(tmp_path):
    ring = trace_ring.Ring.create(tmp_path / "r", capacity=16)
    out = tmp_path / "trace"
    drainer = trace_ring.Drainer(ring, out, interval=0.001).start()
    producer = FakePlugin(tmp_path / "r")
    n = 2000                                  # 125 ring lengths: the producer must wait
    thread = threading.Thread(target=lambda: [producer.push(rec(i)) for i in range(n)])
    thread.start()
    thread.join(60)
    records = drainer.stop()
    assert len(records) == n and ring.dropped == 0
    assert records.tolist() == [rec(i) for i in range(n)]
    assert np.fromfile(out, np.dtype(tf.RECORD_FIELDS)).tolist() == records.tolist()
    ring.close()
