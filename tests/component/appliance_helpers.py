"""Shared by the appliance service tests (test_appliance_protocol, test_appliance_hostile): a
small pf-appliance topology, polling, /proc views of the service, reading and writing memory
through descriptors, crc32s of mostly-zero memory, a bare connection (`Raw`), and the `services`
fixture.

Every service is started with `appliance.start` and stopped with `appliance.stop` in a fixture
finalizer, which also checks that its process is gone."""

from __future__ import annotations

import json
import mmap
import os
import re
import socket
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pfcxl.device.topology import address_map
from pfcxl.device import topology
from pfcxl.device.trace import records as tf
from pfcxl.device.topology import Topology
from pfcxl.device.topology.units import MiB
from pfcxl.host_tools import appliance_client as appliance
from pfcxl.device.trace.ring import Ring


# 4 modules x 256 MiB, 2 ports; shared 256 MiB + 2 x private 256 MiB = 768 MiB mapped
SMALL = {"modules": 4, "module_capacity": "256M", "ports": 2, "shared": "256M", "private": "256M"}
SHARED = PRIVATE = 256 * MiB
POOL_END = SHARED + 2 * PRIVATE
WAIT = 20.0                      # seconds a wait_until may take before the test fails


# --------------------------------------------------------------------------- helpers


def play_plugin(att: appliance.Attachment, records: np.ndarray) -> None:
    """What the plugin does: records after the header, then head moved past them."""
    ring = Ring.open(f"/proc/self/fd/{att.ring_fd}")
    try:
        start = tf.HEADER_SIZE + ring.head * tf.RECORD_SIZE
        ring._mm[start:start + records.nbytes] = records.tobytes()
        ring._head.value = ring.head + len(records)
    finally:
        ring.close()


def reads_of_the_shared_region(topo, n: int) -> np.ndarray:
    r = np.zeros(n, np.dtype(tf.RECORD_FIELDS))
    r["insn"] = np.arange(n, dtype=np.uint64) * 5000          # far apart: an idle fabric
    r["hpa"] = address_map.dax_placements(topo)[0].base + np.arange(n, dtype=np.uint64) * 4096
    r["size"] = 8
    return r


def write_topology(path: Path, **values: object) -> tuple[Topology, Path]:
    """pf-appliance with other [appliance] values; its two appliance devices follow the region
    sizes (a device without a private region stops being appliance-backed)."""
    values = {**SMALL, **values}
    text = topology.resolve("pf-appliance").read_text()
    head, _, rest = text.partition("[appliance]\n")
    section, gap, tail = rest.partition("\n\n")
    for key, value in values.items():
        literal = str(value) if isinstance(value, int) else f'"{value}"'
        section, n = re.subn(rf"^{key} = .*$", f"{key} = {literal}", section, count=1, flags=re.M)
        assert n == 1, f"no {key} in pf-appliance's [appliance]"
    devices = tail.split("[[device]]")
    for i, device in enumerate(devices[1:], 1):
        for region in ("shared", "private"):
            if f'appliance = "{region}"' not in device:
                continue
            if values[region] in ("0", 0):
                device = device.replace(f'appliance = "{region}"\n', "")
            else:
                device = re.sub(r"^volatile = .*$", f'volatile = "{values[region]}"', device, flags=re.M)
        devices[i] = device
    path.write_text(head + "[appliance]\n" + section + gap + "[[device]]".join(devices))
    return topology.load(path), path


def wait_until(predicate, what: str):
    """Poll until `predicate()` is truthy (what a client sees after a close is settled by the
    service's next loop turn); fail naming `what` if it never is."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def resources(pid: int) -> dict[str, int]:
    status = proc_status(pid)
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "rss_kib": int(status["VmRSS"].split()[0]),
            "hwm_kib": int(status["VmHWM"].split()[0]), "threads": int(status["Threads"])}


def poke(fd: int, offset: int, data: bytes) -> None:
    """Write through a mapping of the descriptor, as a host (QEMU) does."""
    size = os.fstat(fd).st_size
    with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
        m[offset:offset + len(data)] = data


def peek(fd: int, offset: int, length: int) -> bytes:
    size = os.fstat(fd).st_size
    with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as m:
        return m[offset:offset + length]


ZEROS = memoryview(bytes(4 * MiB))


def crc_of(size: int, writes: dict[int, bytes], crc: int = 0) -> int:
    """crc32 of `size` bytes that are zero except `writes` (offset -> bytes), continuing `crc`."""
    def zeros(n: int, crc: int) -> int:
        while n:
            k = min(n, len(ZEROS))
            crc, n = zlib.crc32(ZEROS[:k], crc), n - k
        return crc
    pos = 0
    for offset, data in sorted(writes.items()):
        assert offset >= pos, "writes overlap"
        crc = zlib.crc32(data, zeros(offset - pos, crc))
        pos = offset + len(data)
    return zeros(size - pos, crc)


def same_object(fd_a: int, fd_b: int) -> bool:
    a, b = os.fstat(fd_a), os.fstat(fd_b)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class Raw:
    """A bare connection: bytes out; reply lines in, any descriptors that come along closed."""

    def __init__(self, run_dir: Path, timeout: float = 30.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(run_dir / appliance.SOCKET))   # blocking: waits out a full backlog
        self.sock.settimeout(timeout)
        self.buffer = bytearray()
        self.fds_received = 0

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        """Read more; False once the service has closed the connection."""
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 64)
        except ConnectionResetError:      # it closed with our requests still unread
            data, fds = b"", []
        for fd in fds:
            os.close(fd)
        self.fds_received += len(fds)
        self.buffer += data
        return bool(data)

    def _line(self) -> dict | None:
        if b"\n" not in self.buffer:
            return None
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer = bytearray(rest)
        return json.loads(line)

    def replies(self, n: int) -> list[dict]:
        out: list[dict] = []
        while len(out) < n:
            reply = self._line()
            if reply is not None:
                out.append(reply)
            elif not self._fill():
                raise AssertionError(f"the service closed the connection after {len(out)} of {n} replies")
        return out

    def until_closed(self) -> list[dict]:
        """Every reply still to come, up to the service closing the connection."""
        out = []
        while True:
            reply = self._line()
            if reply is not None:
                out.append(reply)
            elif not self._fill():
                assert not self.buffer, f"a partial reply before the close: {bytes(self.buffer[:200])!r}"
                return out

    def finish(self) -> None:
        """Shut our side and read to the service's close: nothing more may come, and the
        service has let go of this connection once this returns."""
        self.sock.shutdown(socket.SHUT_WR)
        assert self.until_closed() == []
        self.sock.close()

    def close(self) -> None:
        self.sock.close()


@dataclass
class Running:
    run_dir: Path
    pid: int
    topo: Topology
    path: Path

    def client(self) -> appliance.Client:
        return appliance.Client(self.run_dir)

    def raw(self) -> Raw:
        return Raw(self.run_dir)


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def _stop_and_check(run_dir: Path, pid: int) -> None:
    appliance.stop(run_dir)
    assert not (run_dir / appliance.PID).exists() and not (run_dir / appliance.SOCKET).exists()
    assert _gone(pid), f"appliance pid {pid} is still there after stop: {proc_status(pid).get('State')}"
