"""The appliance service, run for real (a background process on a unix socket, no VMs), with
clients that misbehave while a real host is served: bad requests, oversized lines, abrupt and
half-closed connections, clients that never read, binary garbage, too many connections and
checksum floods, then ten thousand random messages.

The one service is started with `appliance.start` and stopped with `appliance.stop` in the
`real` fixture's finalizer, which also checks that its process is gone."""

from __future__ import annotations

import json
import os
import random
import select
import socket
from pathlib import Path

import pytest

from pfcxl.device import appliance_protocol as proto
from pfcxl.device.appliance_service import MAX_CHECKSUMS_WAITING, MAX_CLIENTS, MAX_PER_PROCESS
from pfcxl.device.units import MiB
from pfcxl.host_tools import appliance

from .appliance_helpers import (
    POOL_END, PRIVATE, SHARED, WAIT, Running, _stop_and_check, crc_of, peek, poke, proc_status,
    resources, same_object, wait_until, write_topology,
)


# --------------------------------------------------------------------------- hostile clients
#
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
               b'{"op": "hello", "v": 2}', b'{"op": "hello", "v": true}', b'{"op": "detach", "host": {}}',
               b'{"op": "stats", "sync": 1}', b'{"op": "stats", "sync": "true"}']
MISSING_FIELDS = [b'{"op": "attach"}', b'{"op": "attach", "port": 1}', b'{"op": "region", "host": 0}',
                  b'{"op": "region", "name": "shared"}', b'{"op": "where"}', b'{"op": "detach", "id": 3}']
UNKNOWN_FIELDS = [b'{"op": "hello", "x": 1}', b'{"op": "attach", "host": 5, "ports": 1}',
                  b'{"op": "status", "verbose": true}', b'{"op": "shutdown", "now": true}',
                  b'{"op": "checksum", "partition": "shared"}', b'{"op": "where", "offset": 0, "size": 1}',
                  b'{"op": "stats", "host": 0}']
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


def test_more_connections_than_one_process_may_hold(real):
    # Past MAX_PER_PROCESS connections of one process (the real host holds one of ours), each
    # new one gets one line saying why, then is closed; other processes are not locked out by
    # them (test_appliance_lifetime).
    conns, replies = [], []
    try:
        for _ in range(MAX_CLIENTS + 40):
            conns.append(real.s.raw())
        for raw in conns:
            try:
                raw.send(b'{"op": "hello"}\n')
            except BrokenPipeError:           # closed already: its one line is still to be read
                pass
            replies.append(raw.replies(1)[0])
    finally:
        for raw in conns:
            raw.close()
    assert [r["ok"] for r in replies[:MAX_PER_PROCESS - 1]] == [True] * (MAX_PER_PROCESS - 1)
    refusal = {"ok": False, "closed": "refused", "error": f"pid {os.getpid()} already holds {MAX_PER_PROCESS} "
               f"connections to this appliance (the limit per process is {MAX_PER_PROCESS}): close some"}
    assert replies[MAX_PER_PROCESS - 1:] == [refusal] * (MAX_CLIENTS + 40 - MAX_PER_PROCESS + 1)
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
    if key == "sync":
        return rng.choice([True, False])
    if key == "id":
        return rng.choice([rng.randrange(1 << 40), "".join(rng.choice("abc-_.") for _ in range(rng.randrange(40)))])
    raise AssertionError(key)


# field -> (chance of a plausible value, chance of any value); else the field is left out
FIELD_ODDS = {"host": (0.9, 0.05), "name": (0.9, 0.05), "offset": (0.9, 0.05), "port": (0.3, 0.03),
              "id": (0.4, 0.03), "v": (0.2, 0.02), "sync": (0.5, 0.05)}


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
