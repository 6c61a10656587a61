"""Ten thousand random messages, most of them plausible requests, to the real appliance service
while a real host is served (the `real` fixture, conftest.py): each gets the protocol's own verdict, and the
service ends as it began: same hosts, same descriptors, same memory."""

from __future__ import annotations

import pytest
import json
import random

from pfcxl.device.appliance import protocol as proto

from .appliance_helpers import POOL_END, resources
from .hostile_helpers import RealHost, check_reply, expected_reply


FUZZ_KEYS = ["op", "v", "id", "host", "port", "name", "offset", "size", "hosts", "", "op ", "ID"]

pytestmark = pytest.mark.component


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
