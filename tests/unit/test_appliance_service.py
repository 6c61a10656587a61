"""The appliance service, run for real (a background process on a unix socket, no VMs): the
protocol, memory handed out as descriptors, ports and sticky private regions, persistent
backing, leftovers of crashed runs, and clients that misbehave while a real host is served.

Every service is started with `appliance.start` and stopped with `appliance.stop` in a fixture
finalizer, which also checks that its process is gone."""

from __future__ import annotations

import json
import mmap
import os
import random
import re
import select
import socket
import stat
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from pfcxl.device import appliance_protocol as proto
from pfcxl.device import topology
from pfcxl.device.appliance_service import MAX_CHECKSUMS_WAITING, MAX_CLIENTS
from pfcxl.device.pool import bytes_per_module
from pfcxl.device.topology import Topology
from pfcxl.device.units import MiB
from pfcxl.errors import ApplianceError
from pfcxl.host_tools import appliance

# 4 modules x 256 MiB, 2 ports; shared 256 MiB + 2 x private 256 MiB = 768 MiB mapped
SMALL = {"modules": 4, "module_capacity": "256M", "ports": 2, "shared": "256M", "private": "256M"}
SHARED = PRIVATE = 256 * MiB
POOL_END = SHARED + 2 * PRIVATE
WAIT = 20.0                      # seconds a wait_until may take before the test fails


# --------------------------------------------------------------------------- helpers


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


@pytest.fixture
def services(tmp_path):
    """start(**appliance values, run_dir=...) -> Running; every service started is stopped and
    its process checked gone at teardown."""
    started: list[tuple[Path, int]] = []

    def start(run_dir: Path | None = None, **values: object) -> Running:
        topo, path = write_topology(tmp_path / f"topology-{len(started)}.toml", **values)
        run_dir = run_dir or tmp_path / "run"
        pid = appliance.start(topo, path, run_dir, scan_interval=3600)
        started.append((run_dir, pid))
        return Running(run_dir, pid, topo, path)

    yield start
    errors = []
    for run_dir, pid in started:
        try:
            _stop_and_check(run_dir, pid)
        except AssertionError as exc:
            errors.append(str(exc))
    assert not errors, errors


# --------------------------------------------------------------------------- protocol


def test_socket_is_private_and_hello_names_version_1(services):
    s = services()
    mode = os.stat(s.run_dir / appliance.SOCKET).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert int((s.run_dir / appliance.PID).read_text()) == s.pid
    with s.client() as c:
        hello = c.call("hello")
        assert hello["version"] == proto.VERSION == 1
        assert hello["appliance"] == {"topology": "pf-appliance", "modules": 4, "module_capacity": 256 * MiB,
                                      "hbm_cache": 32 * MiB, "ports": 2, "granularity": 4096,
                                      "shared": SHARED, "private": PRIVATE, "backing": "memfd"}
        # ids are echoed, on success and on failure alike
        assert c.request("hello", id=7)[0]["id"] == 7
        assert c.request("where", offset=-1, id="w-1")[0] == {
            "ok": False, "id": "w-1", "error": "pool offset -0x1 is outside the pool's 0x30000000 mapped bytes"}
        assert c.call("attach", host=0, id=9)["id"] == 9          # (call closes the two descriptors)
        assert c.request("detach", host=5, id="d")[0] == {"ok": False, "error": "host 5 is not attached", "id": "d"}


def test_attach_hands_out_one_memfd_per_region(services):
    s = services()
    with s.client() as a:
        reply, fds = a.request("attach", host=0)
        try:
            assert reply == {"ok": True, "host": 0, "port": 0, "regions": [
                {"name": "shared", "partition": "shared", "pool_offset": 0, "size": SHARED},
                {"name": "private", "partition": "private/0", "pool_offset": SHARED, "size": PRIVATE}]}
            assert len(fds) == 2
            assert [os.fstat(fd).st_size for fd in fds] == [SHARED, PRIVATE]
            assert os.readlink(f"/proc/self/fd/{fds[0]}").startswith("/memfd:pfcxl-shared")
            assert os.readlink(f"/proc/self/fd/{fds[1]}").startswith("/memfd:pfcxl-private-0")
        finally:
            for fd in fds:
                os.close(fd)

        # the same connection may attach another host; it gets the next port and private slot
        h1 = a.attach(1)
        assert (h1.port, [r.partition for r in h1.regions]) == (1, ["shared", "private/1"])


def test_shared_memory_is_shared_and_private_memory_is_not(services):
    s = services()
    with s.client() as a, s.client() as b:
        h0, h1 = a.attach(0), b.attach(1)
        assert (h0.port, h1.port) == (0, 1)
        assert [r.partition for r in h1.regions] == ["shared", "private/1"]
        shared0, shared1 = h0.region("shared").fd, h1.region("shared").fd
        own0, own1 = h0.region("private").fd, h1.region("private").fd
        assert same_object(shared0, shared1)
        assert not same_object(own0, own1)

        poke(shared0, 12345, b"written by host 0")
        assert peek(shared1, 12345, 17) == b"written by host 0"
        poke(shared1, SHARED - 5, b"tail!")
        assert peek(shared0, SHARED - 5, 5) == b"tail!"

        poke(own0, 0, b"host 0 only")
        poke(own0, PRIVATE - 4, b"end0")
        assert os.fstat(own1).st_blocks == 0               # nothing at all reached host 1's region
        assert peek(own1, 0, 11) == bytes(11) and peek(own1, PRIVATE - 4, 4) == bytes(4)
        assert peek(own0, 0, 11) == b"host 0 only"


def test_region_and_detach_rules(services):
    s = services()
    with s.client() as a, s.client() as b:
        h0, h1 = a.attach(0), b.attach(1)

        reply, fds = a.request("region", host=0, name="shared", id=1)
        assert reply == {"ok": True, "host": 0, "id": 1, "regions": [
            {"name": "shared", "partition": "shared", "pool_offset": 0, "size": SHARED}]}
        assert len(fds) == 1 and same_object(fds[0], h0.region("shared").fd)
        os.close(fds[0])
        for name in ("private", "private/0"):
            reply, fds = a.request("region", host=0, name=name)
            assert reply["regions"][0]["partition"] == "private/0"
            assert len(fds) == 1 and same_object(fds[0], h0.region("private").fd)
            os.close(fds[0])

        def refused(client, op, **fields):
            reply, fds = client.request(op, **fields)
            assert fds == [] and reply["ok"] is False, reply
            return reply["error"]

        assert refused(a, "region", host=0, name="private/1") == "region private/1 belongs to host 1, not host 0"
        assert refused(b, "region", host=1, name="private/0") == "region private/0 belongs to host 0, not host 1"
        assert refused(a, "region", host=0, name="private/7") == "region private/7 belongs to no host, not host 0"
        assert refused(a, "region", host=1, name="shared") == "host 1 is not attached through this connection"
        assert refused(a, "region", host=0, name="other") == "no region 'other' (shared, private)"
        assert refused(a, "detach", host=1) == "host 1 was attached by another connection"
        assert refused(b, "attach", host=0) == "host 0 is already attached at port 0"
        assert refused(a, "attach", host=0) == "host 0 is already attached at port 0"

        assert a.call("detach", host=0) == {"ok": True, "host": 0, "port": 0}
        assert refused(a, "detach", host=0) == "host 0 is not attached"
        assert refused(a, "region", host=0, name="shared") == "host 0 is not attached through this connection"
        assert [h["host"] for h in b.call("status")["hosts"]] == [1]


def test_where_layout_status_and_checksum(services):
    s = services()
    spec = s.topo.appliance
    with s.client() as a, s.client() as b:
        assert a.call("where", offset=SHARED + 4096 + 3) == {
            "ok": True, "offset": SHARED + 4096 + 3, "module": 1, "module_offset": 64 * MiB + 3,
            "region": "private/0", "region_offset": 4096 + 3}
        assert a.request("where", offset=POOL_END)[0] == {
            "ok": False, "error": "pool offset 0x30000000 is outside the pool's 0x30000000 mapped bytes"}
        layout = a.call("layout")
        assert layout["partitions"] == [
            {"name": "shared", "partition": "shared", "pool_offset": 0, "size": SHARED},
            {"name": "private", "partition": "private/0", "pool_offset": SHARED, "size": PRIVATE},
            {"name": "private", "partition": "private/1", "pool_offset": SHARED + PRIVATE, "size": PRIVATE}]

        status = a.call("status")
        assert [m["bytes_mapped"] for m in status["modules"]] == [0, 0, 0, 0]
        assert status["hosts"] == [] and status["pid"] == s.pid
        assert [(p["port"], p["host"]) for p in status["ports"]] == [(0, None), (1, None)]

        h0, h1 = a.attach(0), b.attach(1)
        expected = [0] * 4
        for att in (h0, h1):
            for r in att.regions:
                expected = [x + y for x, y in zip(expected, bytes_per_module(spec, r.pool_offset, r.size))]
        status = b.call("status")
        assert [m["bytes_mapped"] for m in status["modules"]] == expected == [(2 * SHARED + 2 * PRIVATE) // 4] * 4
        assert [m["capacity"] for m in status["modules"]] == [256 * MiB] * 4
        assert [(p["port"], p["host"]) for p in status["ports"]] == [(0, 0), (1, 1)]
        assert status["hosts"] == [
            {"host": 0, "port": 0, "private_slot": 0, "bytes_mapped": SHARED + PRIVATE},
            {"host": 1, "port": 1, "private_slot": 1, "bytes_mapped": SHARED + PRIVATE}]
        assert status["private_slots"] == {"0": 0, "1": 1}

        rng = random.Random(1)
        writes = {"shared": {0: rng.randbytes(4096), 100 * MiB + 7: rng.randbytes(999), SHARED - 64: b"s" * 64},
                  "private/0": {5: rng.randbytes(3000)}, "private/1": {PRIVATE - 10: rng.randbytes(10)}}
        fds = {"shared": h0.region("shared").fd, "private/0": h0.region("private").fd,
               "private/1": h1.region("private").fd}
        for partition, chunks in writes.items():
            for offset, data in chunks.items():
                poke(fds[partition], offset, data)
        blocks = [os.fstat(fd).st_blocks for fd in fds.values()]
        assert 0 < blocks[0] * 512 <= 3 * 4096                # the three pages written
        reply, fds_back = a.request("checksum", id="c")
        assert fds_back == [] and reply["ok"] and reply["id"] == "c"
        pool_crc, expected = 0, {}
        for name, size in (("shared", SHARED), ("private/0", PRIVATE), ("private/1", PRIVATE)):
            expected[name] = f"{crc_of(size, writes[name]):#010x}"
            pool_crc = crc_of(size, writes[name], pool_crc)
        expected["pool"] = f"{pool_crc:#010x}"
        assert reply["checksums"] == expected
        # a checksum reads the pool without filling it: pages never written stay unallocated
        assert [os.fstat(fd).st_blocks for fd in fds.values()] == blocks


# --------------------------------------------------------------------------- ports and private slots


def _port_of(client: appliance.Client, host: int) -> int | None:
    return next((p["port"] for p in client.call("status")["ports"] if p["host"] == host), None)


def test_ports_limit_the_hosts_attached_at_once(services):
    s = services(private="0")                 # no private regions: only the ports limit hosts
    with s.client() as a, s.client() as b, s.client() as c:
        a.attach(0), a.attach(1)
        with pytest.raises(ApplianceError, match=r"refused host 2: all 2 ports are in use \(hosts 0, 1\): "
                                                 r"detach one first"):
            b.attach(2)
        assert a.call("detach", host=0) == {"ok": True, "host": 0, "port": 0}
        h2 = b.attach(2)
        assert h2.port == 0 and [r.partition for r in h2.regions] == ["shared"]
        with pytest.raises(ApplianceError, match="port 1 is in use by host 1"):
            c.attach(3, port=1)
        with pytest.raises(ApplianceError, match=r"port 2 does not exist \(ports 0..1\)"):
            c.attach(3, port=2)
        a.close()                              # closing a connection detaches its hosts
        wait_until(lambda: _port_of(c, 1) is None, "host 1 detached when its connection closed")
        assert c.attach(3, port=1).port == 1
        assert [(h["host"], h["port"], h["private_slot"]) for h in c.call("status")["hosts"]] == [
            (2, 0, None), (3, 1, None)]


def test_private_slots_stay_with_their_host(services):
    s = services()
    with s.client() as b, s.client() as c:
        with s.client() as a:
            h0 = a.attach(0)
            poke(h0.region("private").fd, 4096, b"kept for host 0")
            a.call("detach", host=0)           # detach and attach again on one connection
            h0 = a.attach(0)
            assert h0.region("private").partition == "private/0"
            b.attach(1)
            with pytest.raises(ApplianceError, match=r"all 2 ports are in use \(hosts 0, 1\)"):
                c.attach(2)
        wait_until(lambda: _port_of(b, 0) is None, "host 0 detached when its connection closed")
        # port 0 is free, but both private regions belong to hosts 0 and 1 for good: a third host
        # gets no private region rather than someone else's
        with pytest.raises(ApplianceError, match=r"no private region left: all 2 belong to hosts 0, 1"):
            c.attach(2)
        h0 = c.attach(0)
        assert h0.port == 0 and h0.region("private").partition == "private/0"
        assert peek(h0.region("private").fd, 4096, 15) == b"kept for host 0"
        assert c.call("status")["private_slots"] == {"0": 0, "1": 1}


# --------------------------------------------------------------------------- persistent backing


def _pool_files(run_dir: Path) -> dict[str, tuple[int, int]]:
    """name -> (size, crc32) of every file in the pool directory, read without mapping."""
    out = {}
    for path in sorted((run_dir / "pool").iterdir()):
        out[path.name] = (path.stat().st_size, crc_of_file(path))
    return out


def crc_of_file(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(4 * MiB):
            crc = zlib.crc32(chunk, crc)
    return crc


def test_directory_backing_survives_a_restart(services, tmp_path):
    run_dir = tmp_path / "persistent"
    s = services(run_dir, backing="directory")
    with s.client() as c:
        h0 = c.attach(0)
        assert os.readlink(f"/proc/self/fd/{h0.region('shared').fd}") == str(run_dir / "pool" / "shared.pool")
        poke(h0.region("shared").fd, 777, b"shared survives")
        poke(h0.region("private").fd, PRIVATE - 8, b"private!")
        before = c.call("checksum")["checksums"]
    assert appliance.stop(run_dir) == f"stopped pid {s.pid}"
    assert _gone(s.pid)

    s2 = services(run_dir, backing="directory")
    assert s2.pid != s.pid
    with s2.client() as c:
        assert c.call("checksum")["checksums"] == before
        assert c.call("status")["private_slots"] == {"0": 0}
        h0 = c.attach(0)
        assert h0.region("private").partition == "private/0"
        assert peek(h0.region("shared").fd, 777, 15) == b"shared survives"
        assert peek(h0.region("private").fd, PRIVATE - 8, 8) == b"private!"
    appliance.stop(run_dir)

    files = _pool_files(run_dir)
    assert set(files) == {"layout.json", "shared.pool", "private-0.pool", "private-1.pool"}
    with pytest.raises(ApplianceError, match=r"exited at start.*pool files in .* were made for another layout "
                                             r"\(shared 268435456 -> 536870912\); refusing to reuse them"):
        services(run_dir, backing="directory", shared="512M")
    assert _pool_files(run_dir) == files        # same bytes, same sizes
    assert not (run_dir / appliance.PID).exists() and not (run_dir / appliance.SOCKET).exists()
    assert appliance.stop(run_dir) == "no appliance was running"


# --------------------------------------------------------------------------- leftovers of crashed runs


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _stray_socket(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()                                   # the file stays, nobody listens


@pytest.fixture
def small_topology(tmp_path):
    return write_topology(tmp_path / "small.toml")


def test_a_dead_pid_file_is_named_and_stop_cleans_it(small_topology, tmp_path, services):
    topo, path = small_topology
    run_dir = tmp_path / "crashed"
    run_dir.mkdir()
    pid = _dead_pid()
    (run_dir / appliance.PID).write_text(f"{pid}\n")
    _stray_socket(run_dir / appliance.SOCKET)
    with pytest.raises(ApplianceError, match=rf"names pid {pid}, which is not a running appliance: left by a "
                                             r"crashed run; 'pfcxl appliance stop --run-dir .*' cleans up"):
        appliance.start(topo, path, run_dir)
    with pytest.raises(ApplianceError, match=r"no appliance is serving .*appliance.sock \(Connection refused\)"):
        appliance.Client(run_dir)               # nobody answers on the stale socket
    assert appliance.stop(run_dir) == "removed the leftovers of a crashed run"
    assert not (run_dir / appliance.PID).exists() and not (run_dir / appliance.SOCKET).exists()
    s = services(run_dir)                       # clean now: it starts
    with s.client() as c:
        assert c.call("hello")["version"] == 1


MY_PID = os.getpid()


@pytest.mark.parametrize("pid_text,socket_file,message", [
    (f"{MY_PID}\n", False, rf"appliance.pid names pid {MY_PID}, which is not a running appliance"),  # alive, not one
    ("not a pid\n", False, r"appliance.pid does not hold a pid: left by a crashed run; remove it"),
    (None, True, r"appliance.sock is left from a crashed run \(no pid file\): remove it, or run "
                 r"'pfcxl appliance stop --run-dir .*'"),
], ids=["live-other-process", "garbage-pid", "socket-without-pid"])
def test_other_leftovers_are_named_and_stop_cleans_them(small_topology, tmp_path, pid_text, socket_file, message):
    topo, path = small_topology
    run_dir = tmp_path / "left"
    run_dir.mkdir()
    if pid_text is not None:
        (run_dir / appliance.PID).write_text(pid_text)
    if socket_file:
        _stray_socket(run_dir / appliance.SOCKET)
    with pytest.raises(ApplianceError, match=message):
        appliance.start(topo, path, run_dir)
    assert appliance.stop(run_dir) == "removed the leftovers of a crashed run"   # and signals nobody
    assert not (run_dir / appliance.PID).exists() and not (run_dir / appliance.SOCKET).exists()


def test_start_refuses_while_one_is_running(services):
    s = services()
    with pytest.raises(ApplianceError, match=rf"an appliance is already running for .* \(pid {s.pid}\)"):
        appliance.start(s.topo, s.path, s.run_dir)
    with s.client() as c:                       # the running one is untouched
        assert c.call("status")["pid"] == s.pid
    assert appliance.running_pid(s.run_dir) == s.pid


# --------------------------------------------------------------------------- hostile clients
#
# One service for the rest of the file. A real host (host 0, on its own connection) has written
# marks into its regions; after every batch of bad input it must still be served correctly, and
# once the batch's connections are closed the service holds no more descriptors than before.


MARKS = {0: b"first page", 5 * MiB + 3: b"middle", SHARED - 16: b"last"}


class RealHost:
    def __init__(self, running: Running) -> None:
        self.s = running
        self.client = running.client()
        self.att = self.client.attach(0)
        for name in ("shared", "private"):
            for offset, data in MARKS.items():
                poke(self.att.region(name).fd, offset, name.encode() + data)
        self.baseline_fds = len(os.listdir(f"/proc/{running.pid}/fd"))

    def check(self, open_connections: int = 0) -> None:
        """Still served: status right, region descriptors are the same memory with the marks;
        and no descriptors held but the real host's and `open_connections` others."""
        c, pid = self.client, self.s.pid
        assert c.call("hello")["version"] == 1
        status = c.call("status")
        assert status["pid"] == pid
        assert {"host": 0, "port": 0, "private_slot": 0, "bytes_mapped": SHARED + PRIVATE} in status["hosts"]
        assert status["ports"][0]["host"] == 0
        for name in ("shared", "private"):
            reply, fds = c.request("region", host=0, name=name)
            assert reply["ok"] and len(fds) == 1, reply
            try:
                assert same_object(fds[0], self.att.region(name).fd)
                for offset, data in MARKS.items():
                    assert peek(fds[0], offset, len(name) + len(data)) == name.encode() + data
            finally:
                os.close(fds[0])
        assert Path(f"/proc/{pid}").exists() and proc_status(pid)["State"][0] in "RS"
        want = self.baseline_fds + open_connections
        try:
            wait_until(lambda: len(os.listdir(f"/proc/{pid}/fd")) == want,
                       f"the service back at {want} descriptors once the batch's connections closed")
        except AssertionError as exc:
            held = sorted(os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))
            raise AssertionError(f"{exc}; it holds {held}") from None

    def expected_checksums(self) -> dict[str, str]:
        writes = {offset: data for offset, data in MARKS.items()}
        shared = {o: b"shared" + d for o, d in writes.items()}
        private = {o: b"private" + d for o, d in writes.items()}
        pool = crc_of(SHARED, shared)
        pool = crc_of(PRIVATE, private, pool)
        pool = crc_of(PRIVATE, {}, pool)
        return {"shared": f"{crc_of(SHARED, shared):#010x}", "private/0": f"{crc_of(PRIVATE, private):#010x}",
                "private/1": f"{crc_of(PRIVATE, {}):#010x}", "pool": f"{pool:#010x}"}


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    topo, path = write_topology(base / "small.toml")
    run_dir = base / "run"
    pid = appliance.start(topo, path, run_dir, scan_interval=3600)
    host = None
    try:
        host = RealHost(Running(run_dir, pid, topo, path))
        host.check()
        yield host
    finally:
        if host is not None:
            host.client.close()
        _stop_and_check(run_dir, pid)


def expected_reply(line: bytes) -> tuple[dict | None, dict]:
    """What the protocol says about a line: (the exact error reply, or None if the line is a
    valid request), and the parsed request."""
    try:
        return None, proto.parse(line)
    except proto.RequestError as exc:
        return {"ok": False, "error": str(exc)}, {}


def check_reply(line: bytes, reply: dict) -> None:
    """A reply is JSON with ok true or false: for a line the protocol refuses, exactly its error;
    for a request, its id echoed, and the ops that cannot fail succeeded."""
    error, request = expected_reply(line)
    assert isinstance(reply, dict) and reply.get("ok") in (True, False), (line, reply)
    if error is not None:
        assert reply == error, (line, reply)
        return
    if "id" in request:
        assert reply["id"] == request["id"], (line, reply)
    if request["op"] in ("hello", "status", "layout"):
        assert reply["ok"], (line, reply)
    if request["op"] == "where":
        assert reply["ok"] == (0 <= request["offset"] < POOL_END), (line, reply)
    if not reply["ok"]:
        assert isinstance(reply["error"], str) and reply["error"], (line, reply)


def exchange(s: Running, lines: list[bytes]) -> list[dict]:
    """Send lines on a fresh connection, read exactly one reply per line, close; check each."""
    raw = s.raw()
    raw.send(b"".join(line + b"\n" for line in lines))
    replies = raw.replies(len(lines))
    raw.finish()
    for line, reply in zip(lines, replies):
        check_reply(line, reply)
    return replies


MALFORMED = [b"{", b'{"op": "hello"', b"", b"   ", b"nul", b"{'op': 'hello'}", b'{"op": "hello",}',
             b"\xff\xfe\x00", b'{"op": "hello"}}', b"[1, 2", b'{"op": "\xc3\x28"}', b"NaN1", b"1" * 5000,
             b"[" * 60_000, b'{"a": ' * 10_000]
NOT_OBJECTS = [b"1", b'"hello"', b"[]", b'[{"op": "hello"}]', b"null", b"true", b"1.5", b"-0"]
UNKNOWN_OPS = [b'{"op": "nope"}', b'{"op": ""}', b'{"op": "HELLO"}', b'{"op": "' + b"x" * 1000 + b'"}',
               b'{"op": 5}', b'{"op": null}', b"{}", b'{"id": 1}', b'{"op": ["hello"]}']
WRONG_TYPES = [b'{"op": "attach", "host": "0"}', b'{"op": "attach", "host": true}',
               b'{"op": "attach", "host": 0.0}', b'{"op": "attach", "host": null}',
               b'{"op": "attach", "host": [0]}', b'{"op": "attach", "host": 1, "port": "1"}',
               b'{"op": "where", "offset": "4096"}', b'{"op": "where", "offset": 1e3}',
               b'{"op": "region", "host": 0, "name": 1}', b'{"op": "hello", "id": 1.5}',
               b'{"op": "hello", "id": [1]}', b'{"op": "hello", "id": false}', b'{"op": "hello", "v": "1"}',
               b'{"op": "hello", "v": 2}', b'{"op": "hello", "v": true}', b'{"op": "detach", "host": {}}']
MISSING_FIELDS = [b'{"op": "attach"}', b'{"op": "attach", "port": 1}', b'{"op": "region", "host": 0}',
                  b'{"op": "region", "name": "shared"}', b'{"op": "where"}', b'{"op": "detach", "id": 3}']
UNKNOWN_FIELDS = [b'{"op": "hello", "x": 1}', b'{"op": "attach", "host": 5, "ports": 1}',
                  b'{"op": "status", "verbose": true}', b'{"op": "shutdown", "now": true}',
                  b'{"op": "checksum", "partition": "shared"}', b'{"op": "where", "offset": 0, "size": 1}']
BAD_HOSTS = [b'{"op": "attach", "host": -1}', b'{"op": "attach", "host": 1024}',
             b'{"op": "attach", "host": 1000000000000000000000000000000}',
             b'{"op": "region", "host": -1000000000000000000000000000000, "name": "shared"}',
             b'{"op": "detach", "host": 4096}']


@pytest.mark.parametrize("batch", [MALFORMED, NOT_OBJECTS, UNKNOWN_OPS, WRONG_TYPES, MISSING_FIELDS,
                                   UNKNOWN_FIELDS, BAD_HOSTS],
                         ids=["malformed", "not-objects", "unknown-ops", "wrong-types", "missing-fields",
                              "unknown-fields", "bad-hosts"])
def test_bad_requests_get_one_error_each(real, batch):
    replies = exchange(real.s, batch)
    assert all(r["ok"] is False and r["error"] for r in replies)
    real.check()


def test_error_messages_name_the_mistake(real):
    lines = [b"{", b"[]", b'{"op": "nope"}', b'{"op": "attach", "host": true}', b'{"op": "attach"}',
             b'{"op": "hello", "x": 1}', b'{"op": "attach", "host": 1024}', b'{"op": "hello", "v": 2}',
             b"[" * 60_000]
    errors = [r["error"] for r in exchange(real.s, lines)]
    assert errors[0].startswith("not JSON: ")
    assert errors[1] == "a request is a JSON object, got list"
    assert errors[2].startswith("unknown op 'nope' (known: hello, attach, region")
    assert errors[3] == "attach: field 'host' must be int, got bool"
    assert errors[4] == "attach: missing field 'host'"
    assert errors[5] == "hello: unknown field 'x'"
    assert errors[6] == "attach: host id 1024 is outside 0..1023"
    assert errors[7] == "protocol version 2 is not supported (this service speaks 1)"
    assert errors[8].startswith("not JSON: ")          # too deep to decode: refused, not an internal error


def test_lines_up_to_the_limit_are_served_and_longer_ones_close_the_connection(real):
    pad = proto.MAX_LINE - len(b'{"op": "hello", "id": ""}')
    exact = b'{"op": "hello", "id": "' + b"x" * pad + b'"}'
    assert len(exact) == proto.MAX_LINE
    raw = real.s.raw()
    raw.send(exact + b"\n" + b'{"op": "hello", "id": 2}\n')
    first, second = raw.replies(2)
    assert first["ok"] and first["id"] == "x" * pad and second["id"] == 2
    raw.send(b'{"op": "hello", "id": 3}\n' + b"x" * (proto.MAX_LINE + 1) + b'\n{"op": "hello", "id": 4}\n')
    assert raw.until_closed() == [
        {"ok": True, "version": 1, "appliance": first["appliance"], "id": 3},
        {"ok": False, "error": f"request line longer than {proto.MAX_LINE} bytes; closing"}]
    raw.close()

    raw = real.s.raw()                          # no newline at all: refused as soon as it is too long
    try:
        raw.send(b"y" * (4 * proto.MAX_LINE))
    except (BrokenPipeError, ConnectionResetError):
        pass                                    # it may close before we finish sending
    assert raw.until_closed() == [{"ok": False, "error": f"request line longer than {proto.MAX_LINE} bytes; closing"}]
    raw.close()
    real.check()


def test_abrupt_disconnects(real):
    raw = real.s.raw()
    raw.send(b'{"op": "sta')                    # mid-line
    raw.close()
    raw = real.s.raw()
    raw.send(b'{"op": "attach", "host": 7}\n{"op": "status"}\n' * 1 + b'{"op": "hel')
    raw.close()                                 # attached, replies unread, half a line: gone
    raw = real.s.raw()
    raw.send(b'{"op": "status"}\n' * 200)       # replies never read
    raw.close()
    wait_until(lambda: all(h["host"] != 7 for h in real.client.call("status")["hosts"]),
               "host 7 detached once its connection went away")
    assert real.client.call("status")["ports"][1]["host"] is None
    real.check()


def test_a_half_closed_client_gets_all_its_replies(real):
    """`socat`/`nc -N` style: send the requests, shut the sending side, then read."""
    raw = real.s.raw()
    raw.send(b"".join(b'{"op": "status", "id": %d}\n' % i for i in range(400)))   # ~400 KB of replies
    raw.sock.shutdown(socket.SHUT_WR)
    # Two round trips on another connection: the service has seen our end of file by the second
    # (it was ready by the first's loop turn), while most of our replies still wait unread.
    real.client.call("status"), real.client.call("status")
    replies = raw.until_closed()
    raw.close()
    assert [r["id"] for r in replies] == list(range(400)) and all(r["ok"] for r in replies)
    real.check()


def _wait_hangup(sock: socket.socket) -> bool:
    """Wait, without reading, until the service closes the connection."""
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP)
    return any(ev & (select.POLLHUP | select.POLLERR | select.POLLRDHUP)
               for _, ev in poller.poll(int(WAIT * 1000)))


def test_a_client_that_never_reads_is_dropped_and_others_are_served(real):
    idle = real.s.raw()
    idle.send(b'{"op": "status"}\n' * 20)       # a few unread replies: it may stay
    flood = real.s.raw()
    sent, dropped = 0, False
    chunk = b'{"op": "layout"}\n' * 4000
    while sent < 64 * MiB:
        try:
            flood.send(chunk)
        except (BrokenPipeError, ConnectionResetError):
            dropped = True
            break
        sent += len(chunk)
    assert dropped, f"sent {sent} bytes of requests without reading a reply and was never dropped"
    flood.close()
    real.check(open_connections=1)              # served meanwhile (the patient one still connected)
    assert idle.replies(20)[-1]["ok"]           # the patient one is still connected and served
    idle.finish()
    real.check()


def test_requests_after_a_drop_are_not_served(real):
    """Requests already received from a client the service drops (for not reading) must not be
    acted on: an attach served for a dropped connection would hold a port for good."""
    statuses = b'{"op": "status"}\n' * 3500           # ~3 MB of replies, far over what it may leave unread
    attach = b'{"op": "attach", "host": 9}\n'
    assert len(statuses + attach) < 64 * 1024          # one read for the service
    raw = real.s.raw()
    raw.send(statuses + attach)
    assert _wait_hangup(raw.sock), "the service never dropped a client that reads nothing"
    raw.close()
    status = real.client.call("status")
    assert [h["host"] for h in status["hosts"]] == [0]
    assert status["ports"][1]["host"] is None and "9" not in status["private_slots"]
    real.check()


def test_binary_garbage(real):
    rng = random.Random(20261129)
    lines = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300))).replace(b"\n", b"")
             for _ in range(300)]
    lines += [b"\x00" * 100, bytes(range(256)).replace(b"\n", b""), b"\r", b"\x1b[2J"]
    exchange(real.s, lines)
    real.check()


def test_more_connections_than_it_serves(real):
    conns, answered, refused = [], 0, 0
    try:
        for _ in range(MAX_CLIENTS + 40):
            conns.append(real.s.raw())
        for raw in conns:
            try:
                raw.send(b'{"op": "hello"}\n')
                raw.replies(1)
                answered += 1
            except (BrokenPipeError, ConnectionResetError, AssertionError):
                refused += 1
    finally:
        for raw in conns:
            raw.close()
    assert answered == MAX_CLIENTS - 1 and refused == 41      # the real host holds one of them
    real.check()


def test_checksum_requests_are_all_answered_without_piling_up_work(real):
    before = resources(real.s.pid)
    raw = real.s.raw()
    n = 100
    raw.send(b"".join(b'{"op": "checksum", "id": %d}\n' % i for i in range(n)))
    replies = raw.replies(n)
    raw.finish()
    assert sorted(r["id"] for r in replies) == list(range(n))
    expected = real.expected_checksums()
    answered = [r for r in replies if r["ok"]]
    assert all(r["checksums"] == expected for r in answered)
    # past MAX_CHECKSUMS_WAITING waiting on one connection, a request is refused at once
    assert len(answered) >= MAX_CHECKSUMS_WAITING
    assert all(r["error"] == f"{MAX_CHECKSUMS_WAITING} checksum requests of this connection are already "
               "waiting: read their replies first" for r in replies if not r["ok"])
    after = resources(real.s.pid)
    # one reader at a time, reading into a small buffer: the peak RSS barely moves
    assert after["hwm_kib"] - before["hwm_kib"] < 64 * 1024, (before, after)
    wait_until(lambda: resources(real.s.pid)["threads"] <= before["threads"], "checksum workers finished")
    real.check()


# --------------------------------------------------------------------------- random messages

FUZZ_KEYS = ["op", "v", "id", "host", "port", "name", "offset", "size", "hosts", "", "op ", "ID"]


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(11 if depth < 2 else 7)
    if kind == 0:
        return rng.choice([0, 1, 2, 3, 5, -1, 1023, 1024, 65535])
    if kind == 1:
        return rng.randint(-(1 << 70), 1 << 70)
    if kind == 2:
        return "".join(rng.choice("abc xyz/\\\"'\u00e9\u2028\U0001f600\x00\x7f") for _ in range(rng.randrange(30)))
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return rng.choice([0.0, -1.5, 1e300, 4096.0])
    if kind == 5:
        return rng.choice(["shared", "private", "private/0", "private/1", "private/-1", ""])
    if kind == 6:
        return rng.randrange(0, POOL_END + (1 << 20))
    if kind in (7, 8):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(FUZZ_KEYS): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def _plausible(rng: random.Random, key: str):
    """A value of the right type, often a telling one."""
    if key == "host":      # mostly host 1, so attach, region and detach often succeed
        return 1 if rng.random() < 0.6 else rng.choice([0, 2, 3, rng.randrange(1024)])
    if key == "port":
        return rng.choice([0, 1, 2, -1])
    if key == "name":
        return rng.choice(["shared", "private", "private/0", "private/1", "other"])
    if key == "offset":
        return rng.randrange(-10, POOL_END + (1 << 20))
    if key == "v":
        return rng.choice([1, 1, 1, 2, 0])
    if key == "id":
        return rng.choice([rng.randrange(1 << 40), "".join(rng.choice("abc-_.") for _ in range(rng.randrange(40)))])
    raise AssertionError(key)


# field -> (chance of a plausible value, chance of any value); else the field is left out
FIELD_ODDS = {"host": (0.9, 0.05), "name": (0.9, 0.05), "offset": (0.9, 0.05), "port": (0.3, 0.03),
              "id": (0.4, 0.03), "v": (0.2, 0.02)}


def _random_request(rng: random.Random) -> bytes:
    op = rng.choice(list(proto.OPS) + ["nope"])
    request: dict = {} if rng.random() < 0.02 else {"op": op if rng.random() < 0.97 else _random_value(rng)}
    for key in [*proto.OPS.get(op, {}), "id", "v"]:
        plausible, anything = FIELD_ODDS[key]
        roll = rng.random()
        if roll < plausible:
            request[key] = _plausible(rng, key)
        elif roll < plausible + anything:
            request[key] = _random_value(rng)
    if rng.random() < 0.05:
        request[rng.choice(FUZZ_KEYS)] = _random_value(rng)
    return json.dumps(request, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")


def random_line(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.7:
        line = _random_request(rng)
    elif roll < 0.8:                                      # a request cut short
        line = _random_request(rng)
        line = line[:rng.randrange(len(line) + 1)]
    elif roll < 0.9:                                      # a request with a byte changed
        line = bytearray(_random_request(rng))
        line[rng.randrange(len(line))] = rng.randrange(256)
        line = bytes(line)
    elif roll < 0.95:                                     # JSON that is not an object
        line = json.dumps(_random_value(rng)).encode()
    else:                                                 # bytes
        line = rng.randbytes(rng.randrange(300))
    line = line.replace(b"\n", b" ")
    _, request = expected_reply(line)
    if request.get("op") in ("shutdown", "checksum"):     # would stop the service / read the whole pool
        return random_line(rng)
    return line


def _random_batches(real: RealHost, rng: random.Random, connections: int, per_connection: int,
                    at_once: int = 4) -> tuple[int, int]:
    """`connections` connections, `at_once` open together, each sending `per_connection` random
    lines in one go and reading one checked reply per line. Returns (lines, successes)."""
    lines_sent = successes = 0
    for first in range(0, connections, at_once):
        group = [(real.s.raw(), [random_line(rng) for _ in range(per_connection)])
                 for _ in range(min(at_once, connections - first))]
        for raw, lines in group:
            raw.send(b"".join(line + b"\n" for line in lines))
        for raw, lines in group:
            replies = raw.replies(len(lines))
            for line, reply in zip(lines, replies):
                check_reply(line, reply)
                successes += reply["ok"]
            raw.finish()
            lines_sent += len(lines)
        real.check()
    return lines_sent, successes


def test_ten_thousand_random_messages_leave_the_service_as_it_was(real):
    rng = random.Random(0x5046_1001)
    _random_batches(real, rng, connections=4, per_connection=250)           # warm-up
    before = resources(real.s.pid)
    lines, successes = _random_batches(real, rng, connections=40, per_connection=250)
    after = resources(real.s.pid)
    print(f"\nservice resources before {before}, after {lines} random messages {after}")
    assert lines == 10_000 and 0 < successes < lines
    assert abs(after["fds"] - before["fds"]) <= 2, (before, after)
    assert after["rss_kib"] - before["rss_kib"] <= 16 * 1024, (before, after)
    assert after["threads"] == before["threads"], (before, after)
    assert [h["host"] for h in real.client.call("status")["hosts"]] == [0]
