"""The appliance service, run for real (a background process on a unix socket, no VMs): the
protocol, memory handed out as descriptors, ports and sticky private regions, persistent
backing, and leftovers of crashed runs.

Every service is started with `appliance.start` and stopped with `appliance.stop` in a fixture
finalizer, which also checks that its process is gone."""

from __future__ import annotations

import os
import random
import re
import socket
import stat
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from pfcxl.device.appliance import protocol as proto
from pfcxl.device.appliance.pool import bytes_per_module
from pfcxl.device.topology.units import MiB
from pfcxl.errors import ApplianceError
from pfcxl.host_tools import appliance_client as appliance

from .appliance_helpers import (
    POOL_END, PRIVATE, SHARED, _gone, crc_of, peek, poke, same_object, wait_until, write_topology,
)

pytestmark = pytest.mark.component


# --------------------------------------------------------------------------- protocol


def test_socket_is_private_and_hello_names_version_1(services):
    s = services()
    mode = os.stat(s.run_dir / appliance.SOCKET).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert int((s.run_dir / appliance.PID).read_text()) == s.pid
    with s.client() as c:
        hello = c.call("hello")
        assert hello["version"] == proto.VERSION == 1
        identity = {k: hello["appliance"].pop(k) for k in ("incarnation", "pool_id")}
        assert all(re.fullmatch(r"[0-9a-f]{12}", v) for v in identity.values()), identity
        assert hello["appliance"] == {"topology": "pf-appliance", "modules": 4, "module_capacity": 256 * MiB,
                                      "hbm_cache": 32 * MiB, "ports": 2, "granularity": 4096,
                                      "shared": SHARED, "private": PRIVATE, "backing": "shm", "timing": None,
                                      "timeline": None}
        # ids are echoed, on success and on failure alike
        assert c.request("hello", id=7)[0]["id"] == 7
        assert c.request("where", offset=-1, id="w-1")[0] == {
            "ok": False, "id": "w-1", "error": "pool offset -1 is negative: offsets run from 0 to 0x2fffffff"}
        assert c.call("attach", host=0, id=9)["id"] == 9          # (call closes the two descriptors)
        assert c.request("detach", host=5, id="d")[0] == {"ok": False, "error": "host 5 is not attached", "id": "d"}


def test_attach_hands_out_one_memfd_per_region(services):
    s = services(backing="memfd")
    with s.client() as a:
        reply, fds = a.request("attach", host=0)
        try:
            assert {k: reply.pop(k) for k in ("incarnation", "pool_id")} == {
                k: a.call("hello")["appliance"][k] for k in ("incarnation", "pool_id")}
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
    assert set(files) == {"layout.json", "pool-id", "shared.pool", "private-0.pool", "private-1.pool"}
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
    assert appliance.running_pid(run_dir) is None          # nobody holds the directory's lock
    with pytest.raises(ApplianceError, match=r"no appliance is serving .*appliance.sock \(Connection refused\)"):
        appliance.Client(run_dir)               # nobody answers on the stale socket
    assert appliance.stop(run_dir) == "removed the leftovers of a crashed run"
    assert not (run_dir / appliance.PID).exists() and not (run_dir / appliance.SOCKET).exists()
    s = services(run_dir)                       # clean now: it starts
    with s.client() as c:
        assert c.call("hello")["version"] == 1


MY_PID = os.getpid()


@pytest.mark.parametrize("pid_text,socket_file,taken", [
    (f"{MY_PID}\n", False, "appliance.pid"),               # a live process, but not the lock holder
    ("not a pid\n", False, "appliance.pid"),
    (None, True, "appliance.sock"),
    (f"{_dead_pid()}\n", True, "appliance.pid and appliance.sock"),
], ids=["live-other-process", "garbage-pid", "socket-without-pid", "dead-pid-and-socket"])
def test_start_takes_over_what_a_crashed_run_left(small_topology, tmp_path, services, pid_text, socket_file, taken):
    # Nobody holds the directory's lock, so nobody uses its pid file or socket: a new service
    # replaces them (and says so), and signals no one.
    run_dir = tmp_path / "left"
    run_dir.mkdir()
    if pid_text is not None:
        (run_dir / appliance.PID).write_text(pid_text)
    if socket_file:
        _stray_socket(run_dir / appliance.SOCKET)
    s = services(run_dir)
    assert int((run_dir / appliance.PID).read_text()) == s.pid == appliance.running_pid(run_dir)
    with s.client() as c:
        assert c.call("status")["pid"] == s.pid
    assert f"took over {taken} from a service that died" in (run_dir / appliance.LOG).read_text()


def test_start_refuses_while_one_is_running(services):
    s = services()
    with pytest.raises(ApplianceError, match=rf"an appliance is already running for .* \(pid {s.pid}\)"):
        appliance.start(s.topo, s.path, s.run_dir)
    with s.client() as c:                       # the running one is untouched
        assert c.call("status")["pid"] == s.pid
    assert appliance.running_pid(s.run_dir) == s.pid
