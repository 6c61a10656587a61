"""`pfcxl kv replay`: a request trace replayed through the real KV block store by N hosts
(docs/kvstore.md, "Replay"). This module routes the requests, runs them on a crew of hosts (host
processes on the pool file, host_tools/kv/replay_host.py; or kvreplay in guests,
host_tools/kv/replay_guest.py) and gathers what they did; host_tools/kv/replay_report.py prints it.

Requests run in batches: the requests whose arrival lies within `window_ms` of the batch's first
are routed at once, each host serving its share in trace order. Hosts do not wait for each other
at a batch's end: a host goes on with its next request unless that one needs a block whose first
holder (a request of an earlier batch) has not finished yet, and no host runs more than `ahead`
batches past the oldest unfinished one (drive). Prefix routing reads the store, so there a batch
is routed once the one before it has finished.

Each mode starts from an empty store: the replay formats the existing store anew (its host count
kept; an arena that holds `capacity` blocks, and two index slots per block, so that each host's
hash table is at most half full and a key's window rarely forces an eviction of its own), after
checking every input, so bad input leaves the store as it was.
"""

from __future__ import annotations

import collections
import math
import multiprocessing
import multiprocessing.connection
import os
import time
from dataclasses import dataclass
from typing import Any

from pfcxl.errors import PfcxlError
from pfcxl.serving.routing import ROUTINGS, Router, batches, held_depths
from pfcxl.serving.traces import Request, counted

from pfcxl.host_tools.kv import replay_host as kv_replay_host
from pfcxl.host_tools.kv.replay_host import COUNTS, WIDTH, block_key, kv, payload

MODES = ("local", "shared")
AHEAD = 16                 # batches a host may run ahead of the oldest unfinished one (--ahead)
DEFAULT_STORE_HOSTS = 16   # hosts of the store a pool without one gets (kv format's default)
IN_FLIGHT = 32             # requests sent to a host and not yet answered, at most
LONGEST_WAIT_S = 60.0      # one wait for answers, at most, while a --kill-host is due


@dataclass(frozen=True)
class ReplaySetup:
    path: str
    base: int | None
    hosts: int
    capacity: int                   # blocks per host
    block_bytes: int                # scaled payload per block
    block_tokens: int = 512
    routing: str = "round-robin"
    window_ms: int = 0
    stale_s: float = 1.0
    kill_host: int | None = None
    kill_at: float = 0.0
    ahead: int = AHEAD


def slots_for(capacity: int) -> int:
    return min(2 * capacity, kv.MAX_SLOTS)


def region_bytes(store_hosts: int, capacity: int, block_bytes: int) -> int:
    """Bytes from the store's base for `store_hosts` arenas of `capacity` blocks."""
    arena_off = kv.geometry(1 << 62, store_hosts, slots_for(capacity))["arena_off"]
    return arena_off + store_hosts * kv.up(capacity * kv.up(block_bytes, kv.LINE), kv.PAGE)


def check_inputs(setup: ReplaySetup, requests: list[Request]) -> None:
    """Every input that does not need the store: before a pool is opened or a guest booted."""
    if setup.routing not in ROUTINGS:
        raise PfcxlError(f"routing {setup.routing!r} is not one of {', '.join(ROUTINGS)}")
    if not requests:
        raise PfcxlError("the trace has no requests")
    if setup.kill_host is not None and not 0 <= setup.kill_host < setup.hosts:
        raise PfcxlError(f"--kill-host {setup.kill_host} is not one of the replay's hosts 0..{setup.hosts - 1}")
    if setup.kill_host is not None and setup.hosts < 2:
        raise PfcxlError(f"--kill-host {setup.kill_host} with --hosts {setup.hosts}: give 2 or more hosts, so that "
                         "others go on after the kill")
    if setup.window_ms < 0:
        raise PfcxlError(f"--window {setup.window_ms} must not be negative")
    if not (math.isfinite(setup.kill_at) and setup.kill_at >= 0):
        raise PfcxlError(f"--at {setup.kill_at} must be a finite number of seconds, 0 or more")
    if setup.ahead < 0:
        raise PfcxlError(f"--ahead {setup.ahead} must not be negative")


def check(setup: ReplaySetup, requests: list[Request], room: int = 0) -> int:
    """Every input against the store that is there (with `room` more bytes after the store: the
    guests' mailboxes), and no live writer in it; the region size to format. Writes nothing."""
    check_inputs(setup, requests)
    try:
        with kv.Store.open(setup.path, base=setup.base) as s:
            store_hosts, size = s.hosts, s.m.size
    except kv.KVError as exc:
        raise PfcxlError(str(exc)) from exc
    if setup.hosts > store_hosts:
        raise PfcxlError(f"--hosts {setup.hosts} is more than the store's {store_hosts} hosts "
                         f"(pfcxl kv format --hosts {setup.hosts})")
    need = region_bytes(store_hosts, setup.capacity, setup.block_bytes)
    if need + room > size:
        raise PfcxlError(f"--capacity {setup.capacity} blocks of {setup.block_bytes} bytes for the store's "
                         f"{store_hosts} hosts needs {need + room} bytes; {setup.path} has {size} from the store's base")
    if live := live_writers(setup.path, setup.base, setup.stale_s):
        raise PfcxlError(f"{setup.path}: host {live[0]} of its store is open for writing by another process (its lease "
                         f"is held and its heartbeat moves): close it before kv replay formats the store anew")
    return need


def live_writers(path: str, base: int | None, watch_s: float) -> list[int]:
    """The hosts of the store whose lease is held by a live process: their heartbeat moves within
    watch_s, or within kv.WATCH_S if that is longer (a lease left by a dead process stands still; a
    live Python holder beats every 0.1 s, so a shorter watch would take it for dead)."""
    watch_s = max(watch_s, kv.WATCH_S)
    with kv.Store.open(path, base=base) as s:
        held = {h: hdr["heartbeat"] for h in range(s.hosts) if (hdr := s.header(h))["lease"]}
        live: list[int] = []
        since = time.monotonic()
        while held and time.monotonic() - since < watch_s:
            time.sleep(0.01)
            for h, beat in list(held.items()):
                hdr = s.header(h)
                if not hdr["lease"]:
                    del held[h]                  # closed meanwhile
                elif hdr["heartbeat"] != beat:
                    live.append(h)
                    del held[h]
    return sorted(live)


def held_prefixes(reader):
    """For prefix routing: the hosts whose arena holds a block, as the store's index says."""
    return held_depths(lambda block: {h for h, _, _ in reader.find(block_key(block))})


def final_check(reader, requests: list[Request], size: int) -> dict:
    """Every published block in the store read back and compared with the bytes its id defines."""
    name = {kv.key_digest(block_key(b)): b for b in {b for r in requests for b in r.hash_ids}}
    good, bad, claims = 0, 0, 0
    for h, slot, rec, state in reader.scan():
        if state & 1:
            claims += 1
        elif state:
            data = rec and reader.read_block(h, slot, rec)
            block = rec and name.get(rec["key"])
            ok = data is not None and block is not None and data == payload(block, size)
            good += ok
            bad += not ok
    return dict(good=good, bad=bad, claims=claims)


class Processes:
    """The hosts as processes on the pool file (kv_replay_host.main): lists of requests go down a
    pipe, each request's counts come back in a shared table and the indices of each list served
    up the pipe. A host leaves when this process dies, however it dies (leave_with_parent)."""

    def __init__(self, setup: ReplaySetup, requests: int, local: bool) -> None:
        ctx = multiprocessing.get_context("fork")
        self.conns: list[multiprocessing.connection.Connection] = []
        self.procs: list = []
        self.busy: dict[int, int] = {}          # host -> lists sent and not yet answered
        self.table = ctx.RawArray("q", requests * WIDTH)
        me = os.getpid()
        for h in range(setup.hosts):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=kv_replay_host.main, daemon=True, args=(
                child, self.table, setup.path, setup.base, h, local, setup.block_bytes, setup.stale_s, me,
                [*self.conns, parent]))
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        try:
            for h, c in enumerate(self.conns):
                try:
                    msg = c.recv()
                except EOFError as exc:
                    raise PfcxlError(f"replay host {h} died before it started (exit code {self.procs[h].exitcode})") from exc
                if msg[0] == "error":
                    raise PfcxlError(f"replay host {h}: {msg[1]}")
        except BaseException:
            self.close()
            raise

    def post(self, h: int, work: list) -> None:
        self.conns[h].send(work)
        self.busy[h] = self.busy.get(h, 0) + 1

    def ready(self, timeout: float | None) -> list[int]:
        """The requests whose hosts answered, waiting at most `timeout` seconds for one."""
        done: list[int] = []
        if not self.busy:
            return done
        waited = multiprocessing.connection.wait([self.conns[h] for h in self.busy], timeout)
        for h in [h for h in list(self.busy) if self.conns[h] in waited]:
            c = self.conns[h]
            try:
                _, indices = c.recv()
            except EOFError as exc:
                raise PfcxlError(f"replay host {h} died unexpectedly (exit code {self.procs[h].exitcode})") from exc
            done += indices
            self.busy[h] -= 1
            if not self.busy[h]:
                del self.busy[h]
        return done

    def kill(self, h: int) -> None:
        self.procs[h].kill()                     # SIGKILL
        self.procs[h].join()
        self.busy.pop(h, None)

    def results(self) -> list[dict | None]:
        rows = [self.table[i * WIDTH:(i + 1) * WIDTH] for i in range(len(self.table) // WIDTH)]
        return [dict(zip(COUNTS, row)) if row[-1] else None for row in rows]

    def close(self) -> None:
        for c, p in zip(self.conns, self.procs):
            if p.is_alive():
                try:
                    c.send(None)
                except OSError:
                    pass
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()


def fresh_store(setup: ReplaySetup, requests: list[Request], room: int = 0) -> int:
    """Every input checked, then the store formatted anew for `setup` (`room` bytes kept free
    after it): the store's region size."""
    need = check(setup, requests, room)
    with kv.Store.open(setup.path, base=setup.base) as s:
        store_hosts = s.hosts
    kv.format(setup.path, hosts=store_hosts, slots=slots_for(setup.capacity), chunk_tokens=setup.block_tokens,
              size=need, base=setup.base)
    return need


def served(setup: ReplaySetup, requests: list[Request]) -> list[Request]:
    """The requests as the replay serves them: each on the ceil(input_length / block_tokens) blocks
    its input fills (the trace format's count, and the serving model's), not every id it carries."""
    return counted(requests, setup.block_tokens)


def run(setup: ReplaySetup, requests: list[Request], mode: str) -> dict:
    """One mode's replay by host processes on a freshly formatted store: per-request results and
    per-host totals."""
    requests = served(setup, requests)
    fresh_store(setup, requests)
    crew = None
    reader = kv.Store.open(setup.path, base=setup.base)
    try:
        crew = Processes(setup, len(requests), mode == "local")
        return drive(setup, requests, mode, reader, crew)
    finally:
        if crew is not None:
            crew.close()
        reader.close()


def first_holders(requests: list[Request], groups: list[list[int]]) -> list[list[int]]:
    """Per request, the requests of earlier batches that first hold one of its blocks: the ones that
    store (or race to store) those blocks, and so the ones whose end it must see in shared mode."""
    first: dict[int, tuple[int, list[int]]] = {}         # block -> (its first batch, that batch's requests with it)
    needs: list[list[int]] = [[] for _ in requests]
    for k, group in enumerate(groups):
        for i in group:
            want: set[int] = set()
            for b in requests[i].hash_ids:
                at = first.get(b)
                if at is None:
                    first[b] = (k, [i])
                elif at[0] == k:
                    if at[1][-1] != i:
                        at[1].append(i)
                else:
                    want.update(at[1])
            needs[i] = sorted(want)
    return needs


def drive(setup: ReplaySetup, requests, mode, reader, crew) -> dict:
    """The batches routed and served by `crew` (Processes, or replay_mailbox.Mailboxes for
    guests), then the per-host totals.

    A host gets its requests in trace order, without waiting for the other hosts at each batch's
    end: a batch is routed once every batch more than `setup.ahead` before it has finished, and a
    request is sent to its host once the requests of earlier batches that first hold one of its
    blocks (first_holders) have finished on theirs (shared mode; a local cache reads only its own
    arena, which only its own host writes, in order). `prefix` routing asks the store who holds
    what, so there each batch waits for the one before (ahead 0: lockstep). Per host, `waited_s`:
    the time it had no request to serve while the replay ran."""
    n = len(requests)
    live = list(range(setup.hosts))
    router = Router(setup.routing, setup.hosts, requests, held_prefixes(reader))
    groups = list(batches(requests, setup.window_ms))
    batch_of = [k for k, g in enumerate(groups) for _ in g]
    ahead = 0 if setup.routing == "prefix" else setup.ahead
    needs = first_holders(requests, groups) if mode == "shared" else [[] for _ in requests]
    host_of: list[int | None] = [None] * n
    over = [False] * n                           # served, or lost with a killed host
    left = [len(g) for g in groups]              # per batch: requests not over
    queue: dict[int, collections.deque[int]] = {h: collections.deque() for h in live}
    sent: dict[int, set[int]] = {h: set() for h in live}
    killed: dict[str, Any] | None = None
    t0 = time.monotonic()
    idle_since = dict.fromkeys(live, t0)
    waited = [0.0] * setup.hosts
    oldest = routed = 0

    def end(i: int) -> None:
        over[i] = True
        left[batch_of[i]] -= 1

    def startable(i: int, h: int) -> bool:
        needs[i] = [j for j in needs[i] if not over[j] and host_of[j] != h]     # its own host serves in order
        return not needs[i]

    while True:
        while oldest < len(groups) and not left[oldest]:
            oldest += 1
        if oldest == len(groups):
            break
        while routed < len(groups) and routed - oldest <= ahead:
            for i in groups[routed]:
                host_of[i] = h = router.pick(requests[i], live)
                queue[h].append(i)
            routed += 1
        now = time.monotonic()
        for h in live:
            work: list[tuple[int, list[int]]] = []
            while queue[h] and len(sent[h]) + len(work) < IN_FLIGHT and startable(queue[h][0], h):
                i = queue[h].popleft()
                work.append((i, list(requests[i].hash_ids)))
            if work:
                if not sent[h]:
                    waited[h] += now - idle_since[h]
                sent[h].update(i for i, _ in work)
                crew.post(h, work)
        strike = None if killed or setup.kill_host is None else t0 + setup.kill_at
        timeout = None if strike is None else min(max(strike - time.monotonic(), 0), LONGEST_WAIT_S)
        for i in crew.ready(timeout):
            h = host_of[i]
            sent[h].discard(i)
            end(i)
            if not sent[h]:
                idle_since[h] = time.monotonic()
        if strike is not None and setup.kill_host is not None and strike <= time.monotonic():
            h = setup.kill_host
            crew.kill(h)
            killed = dict(host=h, at_s=round(time.monotonic() - t0, 3))
            live.remove(h)
            for i in [*sent.pop(h), *queue.pop(h)]:
                end(i)
    seconds = time.monotonic() - t0
    for h in live:
        if not sent[h]:
            waited[h] += t0 + seconds - idle_since[h]
    results = crew.results()
    stats = reader.stats()["hosts"]
    hosts = []
    for h in range(setup.hosts):
        mine = [i for i in range(len(requests)) if host_of[i] == h]
        row = dict(host=h, requests=sum(results[i] is not None for i in mine),
                   **{k: sum(r[k] for i in mine if (r := results[i]) is not None) for k in COUNTS},
                   evictions=stats[h]["evictions"])
        hosts.append(row)
    if killed is not None:
        killed["unfinished"] = [i for i in range(len(requests)) if host_of[i] == killed["host"] and results[i] is None]
    elif setup.kill_host is not None:
        killed = dict(host=setup.kill_host, at_s=None, unfinished=[])     # the replay ended first
    never = [i for i in range(len(requests)) if host_of[i] is None]
    overall = {k: sum(r[k] for r in hosts) for k in hosts[0] if k != "host"}
    return dict(mode=mode, routing=setup.routing, hosts=hosts, overall=overall, host_of=host_of, results=results,
                killed=killed, never_routed=never, seconds=seconds, ahead=ahead,
                waits=dict(batches=len(groups), host_s=[round(w, 3) for w in waited], total_s=round(sum(waited), 3)),
                check=final_check(reader, requests, setup.block_bytes))
