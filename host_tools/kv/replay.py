"""`pfcxl kv replay`: a request trace replayed through the real KV block store by N hosts
(docs/kvstore.md, "Replay"). This module routes the requests, runs them on a crew of hosts (host
processes on the pool file, host_tools/kv/replay_host.py; or kvreplay in guests,
host_tools/kv/replay_guest.py) and gathers what they did; host_tools/kv/replay_report.py prints it.

Requests run in batches: the requests whose arrival lies within `window_ms` of the batch's first
run at once (each host serves its share in trace order), batches one after the other. Routing is
decided at a batch's start, from the store as the earlier batches left it.

Each mode starts from an empty store: the replay formats the existing store anew (its host count
kept; an arena that holds `capacity` blocks, and two index slots per block, so that each host's
hash table is at most half full and a key's window rarely forces an eviction of its own), after
checking every input, so bad input leaves the store as it was.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import time
from dataclasses import dataclass
from typing import Any

from pfcxl.errors import PfcxlError
from pfcxl.serving.routing import ROUTINGS, Router, batches, held_depths
from pfcxl.serving.traces import Request

from pfcxl.host_tools.kv import replay_host as kv_replay_host
from pfcxl.host_tools.kv.replay_host import COUNTS, WIDTH, block_key, kv, payload

MODES = ("local", "shared")


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


def slots_for(capacity: int) -> int:
    return min(2 * capacity, kv.MAX_SLOTS)


def region_bytes(store_hosts: int, capacity: int, block_bytes: int) -> int:
    """Bytes from the store's base for `store_hosts` arenas of `capacity` blocks."""
    arena_off = kv.geometry(1 << 62, store_hosts, slots_for(capacity))["arena_off"]
    return arena_off + store_hosts * kv.up(capacity * kv.up(block_bytes, kv.LINE), kv.PAGE)


def check(setup: ReplaySetup, requests: list[Request], room: int = 0) -> int:
    """Every input against the store that is there (with `room` more bytes after the store: the
    guests' mailboxes), and no live writer in it; the region size to format. Writes nothing."""
    if setup.routing not in ROUTINGS:
        raise PfcxlError(f"routing {setup.routing!r} is not one of {', '.join(ROUTINGS)}")
    if not requests:
        raise PfcxlError("the trace has no requests")
    if setup.kill_host is not None and not 0 <= setup.kill_host < setup.hosts:
        raise PfcxlError(f"--kill-host {setup.kill_host} is not one of the replay's hosts 0..{setup.hosts - 1}")
    if setup.window_ms < 0:
        raise PfcxlError(f"--window {setup.window_ms} must not be negative")
    if setup.kill_at < 0:
        raise PfcxlError(f"--at {setup.kill_at} must not be negative")
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
    """The hosts as processes on the pool file (kv_replay_host.main): batches go down a pipe, each
    request's counts come back in a shared table."""

    def __init__(self, setup: ReplaySetup, requests: int, local: bool) -> None:
        ctx = multiprocessing.get_context("fork")
        self.conns, self.procs = [], []
        self.table = ctx.RawArray("q", requests * WIDTH)
        for h in range(setup.hosts):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=kv_replay_host.main, daemon=True, args=(
                child, self.table, setup.path, setup.base, h, local, setup.block_bytes, setup.stale_s))
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

    def ready(self, pending: set[int], timeout: float | None) -> list[int]:
        """The pending hosts that finished their batch, waiting at most `timeout` seconds."""
        done = []
        waited = multiprocessing.connection.wait([self.conns[h] for h in pending], timeout)
        for h in [h for h in pending if self.conns[h] in waited]:
            c = self.conns[h]
            try:
                c.recv()
            except EOFError as exc:
                raise PfcxlError(f"replay host {h} died unexpectedly (exit code {self.procs[h].exitcode})") from exc
            done.append(h)
        return done

    def kill(self, h: int) -> None:
        self.procs[h].kill()                     # SIGKILL
        self.procs[h].join()

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


def run(setup: ReplaySetup, requests: list[Request], mode: str) -> dict:
    """One mode's replay by host processes on a freshly formatted store: per-request results and
    per-host totals."""
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


def drive(setup: ReplaySetup, requests, mode, reader, crew) -> dict:
    """The batches routed and served by `crew` (Processes, or replay_mailbox.Mailboxes for
    guests), then the per-host totals."""
    live = list(range(setup.hosts))
    router = Router(setup.routing, setup.hosts, requests, held_prefixes(reader))
    host_of: list[int | None] = [None] * len(requests)
    killed: dict[str, Any] | None = None
    t0 = time.monotonic()
    for batch in batches(requests, setup.window_ms):
        if not live:
            break
        share: dict[int, list] = {}
        for i in batch:
            host_of[i] = h = router.pick(requests[i], live)
            share.setdefault(h, []).append((i, list(requests[i].hash_ids)))
        for h, work in share.items():
            crew.post(h, work)
        pending = set(share)
        while pending:
            due = None if killed or setup.kill_host is None else t0 + setup.kill_at - time.monotonic()
            done = crew.ready(pending, None if due is None else max(due, 0))
            if due is not None and setup.kill_host is not None and t0 + setup.kill_at <= time.monotonic():
                h = setup.kill_host
                crew.kill(h)
                killed = dict(host=h, at_s=round(time.monotonic() - t0, 3))
                live.remove(h)
                pending.discard(h)
            pending -= set(done)
    seconds = time.monotonic() - t0
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
                killed=killed, never_routed=never, seconds=seconds,
                check=final_check(reader, requests, setup.block_bytes))
