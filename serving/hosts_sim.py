"""N inference hosts in front of the KV tier, sequence-only: the serving model's side of the
cross-check with the real store's replay (`pfcxl kv replay`, docs/kvstore.md "Replay").

Requests are routed as the store's replay routes them (serving/routing.py) and served in trace
order, each on the ceil(input_length / block_tokens) blocks its input fills (traces.counted), as
the store's replay serves them. A request walks its blocks as a prefix (chunk-lru, no GPU tier, no timing: how hit rates are
compared) and then stores every block it did not find:
* `local`: each host has its own LRU cache of `capacity_blocks` and looks only there;
* `shared`: one LRU tier of hosts x `capacity_blocks` that every host reads; a block is stored once,
  by the first host that missed it, which owns it for prefix routing and for "own"/"other" loads.
A block the walk stopped before but that is already cached is `present` and not stored again.

The store's replay computes the same counts from different code. They agree exactly when nothing
is evicted and requests do not share a batch across hosts; the residual differences otherwise are
in docs/kvstore.md ("Replay against the serving model").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pfcxl.errors import ServingError

from pfcxl.serving.routing import ROUTINGS, Router, batches, held_depths
from pfcxl.serving.tiers import LruTier
from pfcxl.serving.traces import Trace, counted

CACHES = ("local", "shared")
UNBOUNDED = float("inf")
COUNTS = ("requests", "blocks", "hits", "own", "other", "present", "stored", "evictions", "input_tokens",
          "hit_tokens")


@dataclass(frozen=True)
class HostsSetup:
    trace: Trace
    hosts: int
    cache: str = "local"
    routing: str = "round-robin"
    capacity_blocks: float = UNBOUNDED      # per host; `shared` is one tier of hosts x this
    window_ms: int = 0                      # routing sees the state at a batch's start (routing.py)

    def __post_init__(self) -> None:
        if not (isinstance(self.hosts, int) and self.hosts >= 1):
            raise ServingError(f"--hosts: {self.hosts!r} must be a whole number of hosts, 1 or more")
        if self.cache not in CACHES:
            raise ServingError(f"--cache: '{self.cache}' must be one of {', '.join(CACHES)}")
        if self.routing not in ROUTINGS:
            raise ServingError(f"--routing: '{self.routing}' must be one of {', '.join(ROUTINGS)}")
        if not self.capacity_blocks >= 1:
            raise ServingError(f"KV capacity: {self.capacity_blocks!r} blocks per host must be 1 or more")
        if self.window_ms < 0:
            raise ServingError(f"--window: {self.window_ms} must not be negative")


@dataclass
class HostsResult:
    setup: HostsSetup
    host_of: list[int]                      # per request
    hits: list[int]                         # per request: blocks of its prefix found
    hosts: list[dict] = field(default_factory=list)    # per host: COUNTS

    def summary(self) -> dict:
        overall = {k: sum(h[k] for h in self.hosts) for k in COUNTS}
        tokens = overall["input_tokens"]
        s = self.setup
        return {"mode": f"{s.hosts} hosts, {s.cache} caches" if s.cache == "local" else
                f"{s.hosts} hosts, one shared tier", "routing": s.routing,
                "capacity_blocks_per_host": None if s.capacity_blocks == UNBOUNDED else s.capacity_blocks,
                "hit_rate": overall["hit_tokens"] / tokens if tokens else 0.0,
                "overall": overall, "hosts": self.hosts}


def replay_hosts(setup: HostsSetup) -> HostsResult:
    trace = setup.trace
    requests = counted(trace.requests, trace.block_tokens)      # routed and served on the blocks they count
    if not requests:
        raise ServingError(f"{trace.name}: the trace has no requests")
    local = setup.cache == "local"
    n = setup.hosts
    caches = [LruTier(f"host {h}", setup.capacity_blocks) for h in range(n)] if local else \
        [LruTier("shared", setup.capacity_blocks * n)]
    owner: dict[int, int] = {}              # shared: block -> the host that stored it

    def cache_of(h: int) -> LruTier:
        return caches[h if local else 0]

    def holders(block: int) -> set[int]:
        if local:
            return {h for h in range(n) if block in caches[h]}
        return {owner[block]} if block in caches[0] else set()

    router = Router(setup.routing, n, requests, held_depths(holders))
    rows = [dict.fromkeys(COUNTS, 0) for _ in range(n)]
    host_of, hits = [0] * len(requests), [0] * len(requests)
    live = list(range(n))
    for batch in batches(requests, setup.window_ms):
        for i in batch:
            host_of[i] = router.pick(requests[i], live)
        for i in batch:
            h, r = host_of[i], requests[i]
            blocks = list(r.hash_ids)
            row, tier = rows[h], cache_of(h)
            found = 0
            for block in blocks:
                if not tier.touch(block):
                    break
                found += 1
                row["own" if local or owner[block] == h else "other"] += 1
            new = [b for b in blocks[found:] if b not in tier]
            row["present"] += len(blocks) - found - len(new)
            before = len(tier)
            tier.put(blocks)
            if not local:
                for b in new:
                    owner[b] = h
            row["stored"] += len(new)
            row["evictions"] += before + len(new) - len(tier)
            row["requests"] += 1
            row["blocks"] += len(blocks)
            row["hits"] += found
            row["input_tokens"] += r.input_length
            row["hit_tokens"] += trace.prefix_tokens(r, found)
            hits[i] = found
    return HostsResult(setup, host_of, hits, [{"host": h, **row} for h, row in enumerate(rows)])
