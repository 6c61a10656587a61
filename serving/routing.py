"""Which of N inference hosts serves each request of a trace, and in which batches they run: one
rule for the store's replay (`pfcxl kv replay`, host_tools/kv/replay.py) and the serving model's
N-host replay (serving/hosts_sim.py), so the two can be compared request by request.

Routings: `round-robin`; `session` (a conversation stays on the host that served its first
request); `prefix` (the host that already holds the longest prefix of the request's blocks, ties to
the host with the fewest requests so far, then the lowest number). What a host "holds" is the
caller's: the store asks its index, the model its caches.

Batches: the requests whose arrival lies within `window_ms` of the batch's first. Routing is
decided at a batch's start, from what the earlier batches left.
"""

from __future__ import annotations

from typing import Callable, Iterator

from pfcxl.serving.traces import Request

ROUTINGS = ("round-robin", "session", "prefix")

# (a request's blocks, the live hosts) -> per live host, how many of its first blocks that host holds
Held = Callable[[list[int], list[int]], dict[int, int]]


def batches(requests: list[Request], window_ms: int) -> Iterator[list[int]]:
    """Lists of request indices: each starts at a request and takes the ones within window_ms."""
    i = 0
    while i < len(requests):
        j = i + 1
        while j < len(requests) and requests[j].timestamp_ms - requests[i].timestamp_ms <= window_ms:
            j += 1
        yield list(range(i, j))
        i = j


class Router:
    """Picks a live host for each request (ROUTINGS; the module doc)."""

    def __init__(self, kind: str, hosts: int, requests: list[Request], held: Held) -> None:
        self.kind, self.held = kind, held
        self.count = [0] * hosts
        self.turn = 0
        self.sessions: dict[int | None, int] = {}
        first = requests[0].hash_ids
        self.common = next((i for i in range(len(first))
                            if any(len(r.hash_ids) <= i or r.hash_ids[i] != first[i] for r in requests)), len(first))

    def session(self, r: Request) -> int | None:
        """The conversation a request belongs to: its first block after the prefix every request of
        the trace shares (a system prompt), else its last block."""
        return r.hash_ids[min(self.common, len(r.hash_ids) - 1)] if r.hash_ids else None

    def pick(self, r: Request, live: list[int]) -> int:
        if self.kind == "prefix":
            depth = self.held(list(r.hash_ids), live)
            host = min(live, key=lambda h: (-depth[h], self.count[h], h))
        elif self.kind == "session" and (key := self.session(r)) in self.sessions and self.sessions[key] in live:
            host = self.sessions[key]
        else:
            host = live[self.turn % len(live)]
            self.turn += 1
            if self.kind == "session":
                self.sessions[self.session(r)] = host
        self.count[host] += 1
        return host


def held_depths(holds: Callable[[int], set[int]]) -> Held:
    """A `Held` from `holds(block)`: the hosts holding one block. A host's depth is the length of
    the request's first blocks that it holds, every one of them."""
    def depth(blocks: list[int], live: list[int]) -> dict[int, int]:
        out = dict.fromkeys(live, 0)
        going = set(live)
        for i, block in enumerate(blocks):
            going &= holds(block)
            for h in going:
                out[h] = i + 1
            if not going:
                break
        return out
    return depth
