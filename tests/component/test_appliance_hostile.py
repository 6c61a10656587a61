"""The appliance service, run for real (a background process on a unix socket, no VMs), with
clients that misbehave while a real host is served: bad requests, oversized lines, abrupt and
half-closed connections, clients that never read, binary garbage, too many connections and
checksum floods (the random messages are in test_appliance_fuzz.py).

The one service is started with `appliance.start` and stopped with `appliance.stop` in the
`real` fixture's finalizer (conftest.py), which also checks that its process is gone."""

from __future__ import annotations

import os
import random
import select
import socket

import pytest

from pfcxl.device.appliance import protocol as proto
from pfcxl.device.appliance.service import MAX_CHECKSUMS_WAITING, MAX_CLIENTS, MAX_PER_PROCESS
from pfcxl.device.topology.units import MiB

from .appliance_helpers import WAIT, resources, wait_until
from .hostile_helpers import exchange


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

pytestmark = pytest.mark.component


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
