"""What the hostile-client tests of the appliance service share: one real service per test
module (the `real` fixture in conftest.py, stopped and checked gone at the module's end) with a real host
(host 0) whose regions hold marks, and the protocol's own verdict on any line (check_reply)."""

from __future__ import annotations

import os
from pathlib import Path

from pfcxl.device.appliance import protocol as proto
from pfcxl.device.topology.units import MiB

from .appliance_helpers import (
    POOL_END, PRIVATE, SHARED, Running, crc_of, peek, poke, proc_status, same_object, wait_until,
)

# One service for the whole module. A real host (host 0, on its own connection) has written
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
