"""The trace ring (device/trace/records.py) seen from pfcxl: created and mapped shared, drained
into numpy records while the plugin fills it."""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from pathlib import Path

from pfcxl.device.trace import records as tf

from pfcxl.errors import TimingError

DEFAULT_CAPACITY = 1 << 20          # records (24 MiB of ring)
_HEADER = tf.HEADER_STRUCT


def _dtype():
    import numpy as np   # the engine's dependency; imported only where records are handled
    return np.dtype(tf.RECORD_FIELDS)


class Ring:
    """The trace ring file, mapped shared: the plugin produces at head, we consume at tail."""

    def __init__(self, path: Path, file, mm: mmap.mmap, capacity: int) -> None:
        self.path, self._file, self._mm, self.capacity = Path(path), file, mm, capacity
        # Single aligned 8-byte loads and stores (the plugin reads tail while we write it):
        # ctypes views, not struct.pack_into, whose byte copy is not promised to be one store.
        self._head = ctypes.c_uint64.from_buffer(mm, tf.HEAD_OFFSET)
        self._tail = ctypes.c_uint64.from_buffer(mm, tf.TAIL_OFFSET)
        self._dropped = ctypes.c_uint64.from_buffer(mm, tf.DROPPED_OFFSET)
        # The invariants a drain checks: only we store tail, and the producer's head never goes back.
        self._our_tail, self._last_head = self._tail.value, self._head.value

    @classmethod
    def create(cls, path: Path, capacity: int = DEFAULT_CAPACITY) -> "Ring":
        """A new, empty ring (an existing file is replaced: a ring holds one run)."""
        if capacity <= 0:
            raise TimingError(f"ring capacity must be positive, not {capacity}")
        path = Path(path)
        with open(path, "wb") as f:
            f.write(_HEADER.pack(tf.RING_MAGIC, tf.RING_VERSION, tf.RECORD_SIZE, capacity, 0, 0, 0))
            f.truncate(tf.HEADER_SIZE + capacity * tf.RECORD_SIZE)   # sparse
        return cls.open(path)

    @classmethod
    def create_memfd(cls, name: str, capacity: int = DEFAULT_CAPACITY) -> "Ring":
        """A new, empty ring in anonymous shared memory (a memfd): its holder hands `fd` out
        (the appliance, to each host's QEMU), and it is gone when the last descriptor closes."""
        if capacity <= 0:
            raise TimingError(f"ring capacity must be positive, not {capacity}")
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        f = os.fdopen(fd, "r+b")
        try:
            f.write(_HEADER.pack(tf.RING_MAGIC, tf.RING_VERSION, tf.RECORD_SIZE, capacity, 0, 0, 0))
            f.truncate(tf.HEADER_SIZE + capacity * tf.RECORD_SIZE)
            f.flush()
        except BaseException:
            f.close()
            raise
        return cls._map(Path(f"memfd:{name}"), f)

    @property
    def fd(self) -> int:
        return self._file.fileno()

    def fill(self) -> int:
        """Records written and not yet drained."""
        return self.head - self.tail

    @classmethod
    def open(cls, path: Path) -> "Ring":
        return cls._map(Path(path), open(path, "r+b"))

    @classmethod
    def _map(cls, path: Path, f) -> "Ring":
        try:
            size = os.fstat(f.fileno()).st_size
            if size < tf.HEADER_SIZE:
                raise TimingError(f"{path} is too small ({size} bytes) for a ring header")
            mm = mmap.mmap(f.fileno(), size)
            magic, version, record_size, capacity, *_ = _HEADER.unpack_from(mm, 0)
            if (magic, version, record_size) != (tf.RING_MAGIC, tf.RING_VERSION, tf.RECORD_SIZE):
                mm.close()
                raise TimingError(f"{path} is not a version-{tf.RING_VERSION} trace ring "
                                  f"(magic {magic:#x}, version {version}, record size {record_size})")
            if capacity <= 0 or size < tf.HEADER_SIZE + capacity * tf.RECORD_SIZE:
                mm.close()
                raise TimingError(f"{path}: header claims {capacity} records, file holds {size} bytes")
        except BaseException:
            f.close()
            raise
        return cls(path, f, mm, capacity)

    @property
    def head(self) -> int:
        return self._head.value

    @property
    def tail(self) -> int:
        return self._tail.value

    @property
    def dropped(self) -> int:
        return self._dropped.value

    def drain(self):
        """Every record written since the last drain, oldest first, as a numpy array; frees
        their slots for the producer."""
        import numpy as np
        head, tail = self.head, self.tail   # head read first: records before it are complete
        if tail != self._our_tail or head < self._last_head or head - tail > self.capacity:
            raise TimingError(f"{self.path}: corrupt ring (head {head} after {self._last_head}, tail {tail} "
                              f"where the drainer left {self._our_tail}, capacity {self.capacity})")
        n = head - tail
        first = tail % self.capacity
        count1 = min(n, self.capacity - first)
        base = tf.HEADER_SIZE
        parts = [np.frombuffer(self._mm, _dtype(), count1, base + first * tf.RECORD_SIZE).copy()]
        if n > count1:
            parts.append(np.frombuffer(self._mm, _dtype(), n - count1, base).copy())
        self._tail.value = self._our_tail = self._last_head = head   # only now may the producer reuse those slots
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def close(self) -> None:
        if self._mm.closed:
            return
        del self._head, self._tail, self._dropped   # release the buffer exports before closing
        try:
            self._mm.close()
        finally:
            self._file.close()


class Drainer:
    """Moves records out of the ring every `interval` seconds on a thread, keeping them in memory
    and, with `out`, appending their raw 24-byte form to a file (np.fromfile(out, dtype) reads it)."""

    def __init__(self, ring: Ring, out: Path | None = None, interval: float = 0.005) -> None:
        self.ring, self.out, self.interval = ring, out, interval
        self._chunks: list = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def drain_once(self) -> int:
        with self._lock:
            batch = self.ring.drain()
            if len(batch):
                self._chunks.append(batch)
                if self.out is not None:
                    with open(self.out, "ab") as f:
                        f.write(batch.tobytes())
            return len(batch)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.drain_once():
                    self._stop.wait(self.interval)
        except BaseException as exc:   # reported by stop()
            self._error = exc

    def start(self) -> "Drainer":
        self._thread = threading.Thread(target=self._run, name="pfcxl-ring-drainer", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Stop the thread, take what is left, and return every record drained."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise TimingError(f"draining {self.ring.path} failed: {self._error}") from self._error
        self.drain_once()
        return self.records()

    def records(self):
        import numpy as np
        with self._lock:
            return np.concatenate(self._chunks) if self._chunks else np.zeros(0, _dtype())
