"""A stress run of the KV block store (docs/kvstore.md) as hosts use it: one process per host on one
pool file, each getting random keys and putting the ones it misses (arenas or index segments too
small for the keys, so evictions never stop), while random hosts are SIGKILLed and started again
(the new process takes the host over once the dead one's lease has expired). Every value read is
checked against the one written for its key: a key's value is its index and its digest repeated,
so a wrong read also says whose bytes it returned. Prints gets, hits, puts, evictions, kills, wrong
reads (and when the first one came) and the store's verify at the end; exit 1 on a wrong read or a
bad block.

    python -m pfcxl.host_tools.experiments.kv_stress                  # 8 hosts, 64 keys of 4 KiB, 4 slots each, 60 s
    python -m pfcxl.host_tools.experiments.kv_stress --keys 2000 --size 128K --pool-size 64M --slots 256

The defaults reuse a slot for another key at once (4 records per host): the race of a reader with
the owner's eviction and publication in the same slot comes up often. The second command is the
shape of a KV cache: room for 64 blocks per host, evictions by size.

Counters live in shared memory written by each host process as it goes, so a killed process's
counts stay. `--until-wrong` stops at the first wrong read (to measure how long one takes to show).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import random
import signal
import struct
import sys
import tempfile
import time
from pathlib import Path

from pfcxl.device.topology.units import human, parse_size

from pfcxl.guest.python import pfcxl_kvstore as kv

FIELDS = ("gets", "hits", "puts", "stored", "wrong", "opens", "refused_opens", "lease_lost")


def key(k: int) -> str:
    return f"stress/{k}"


def value(k: int, size: int) -> bytes:
    """Key k's block: k (8 bytes) then its digest, repeated to `size` bytes."""
    unit = struct.pack("<Q", k) + kv.key_digest(key(k))[:8]
    return (unit * (size // len(unit) + 1))[:size]


def whose(data: bytes) -> int:
    """The key index a block says it belongs to (-1: too short to say)."""
    return struct.unpack_from("<Q", data)[0] if len(data) >= 8 else -1


def _host(path: str, host: int, keys: int, size: int, stale_s: float, seed: int, stop_at: float,
          counts, wrong_at, sample) -> None:
    """One host process: open (retrying while a killed predecessor's lease stands), then get a
    random key, check it, put it if missing, until stop_at (time.monotonic, shared by processes)."""
    row = host * len(FIELDS)
    col = {f: row + i for i, f in enumerate(FIELDS)}
    rng = random.Random(seed)
    while True:
        try:
            s = kv.Store.open(path, host=host, stale_s=stale_s)
            break
        except kv.KVError:
            counts[col["refused_opens"]] += 1
            if time.monotonic() > stop_at:
                return
            time.sleep(0.05)
    counts[col["opens"]] += 1
    try:
        while time.monotonic() < stop_at:
            k = rng.randrange(keys)
            data = s.get(key(k))
            if data is None:
                counts[col["puts"]] += 1
                counts[col["stored"]] += bool(s.put(key(k), value(k, size)))
            elif data == value(k, size):
                counts[col["hits"]] += 1
            else:
                counts[col["wrong"]] += 1
                if wrong_at[host] == 0.0:
                    wrong_at[host] = time.monotonic()
                    sample[2 * host], sample[2 * host + 1] = k, whose(data)
            # after the outcome: a SIGKILL between the two leaves a get uncounted, never a wrong read
            counts[col["gets"]] += 1
    except kv.KVError:           # another process took our lease (a stall longer than stale_s)
        counts[col["lease_lost"]] += 1
    finally:
        s.close()


def run(pool: str | None = None, hosts: int = 8, keys: int = 64, size: int = 4096,
        pool_size: int = 8 << 20, slots: int = 4, seconds: float = 60.0, kill_every: float = 1.0,
        stale_s: float = 1.0, seed: int = 1, until_wrong: bool = False) -> dict:
    """Format a store of `pool_size` bytes in `pool` (a temporary file if None), run the hosts for
    `seconds`, SIGKILL one at random every `kill_every` seconds on average (0: never), and return
    the figures."""
    ctx = multiprocessing.get_context("fork")
    tmp = None
    if pool is None:
        tmp = tempfile.TemporaryDirectory(prefix="pfcxl-kvstress-")
        pool = str(Path(tmp.name) / "pool")
    try:
        with open(pool, "wb") as f:
            f.truncate(kv.HOME + pool_size)
        kv.format(pool, hosts=hosts, slots=slots, chunk_tokens=256)
        counts = ctx.RawArray(ctypes.c_uint64, hosts * len(FIELDS))
        wrong_at = ctx.RawArray(ctypes.c_double, hosts)
        sample = ctx.RawArray(ctypes.c_int64, 2 * hosts)
        rng = random.Random(seed)
        start = time.monotonic()
        stop_at = start + seconds

        def spawn(h: int):
            p = ctx.Process(target=_host, args=(pool, h, keys, size, stale_s, rng.getrandbits(32), stop_at,
                                                counts, wrong_at, sample), daemon=True)
            p.start()
            return p
        procs = {h: spawn(h) for h in range(hosts)}
        kills = restarts = 0
        next_kill = start + (rng.expovariate(1 / kill_every) if kill_every > 0 else seconds + 1)
        while (now := time.monotonic()) < stop_at and not (until_wrong and any(wrong_at)):
            time.sleep(max(0.0, min(0.05, next_kill - now, stop_at - now)))
            if time.monotonic() >= next_kill:
                h = rng.randrange(hosts)
                if procs[h].is_alive():
                    os.kill(procs[h].pid, signal.SIGKILL)
                    kills += 1
                procs[h].join()
                procs[h] = spawn(h)
                next_kill += rng.expovariate(1 / kill_every)
            for h, p in procs.items():           # a process that lost its lease ends: start another
                if not p.is_alive() and time.monotonic() < stop_at:
                    p.join()
                    procs[h] = spawn(h)
                    restarts += 1
        elapsed = time.monotonic() - start
        for p in procs.values():
            if until_wrong:
                p.kill()
            p.join(timeout=stale_s + 30)
            if p.is_alive():
                p.kill()
                p.join()
        with kv.Store.open(pool) as s:
            report = s.verify()
            evictions = sum(h["evictions"] for h in s.stats()["hosts"])
        total = {f: sum(counts[h * len(FIELDS) + i] for h in range(hosts)) for i, f in enumerate(FIELDS)}
        firsts = [t for t in wrong_at if t]
        return dict(module=kv.__file__, hosts=hosts, keys=keys, size=size, pool_size=pool_size, slots=slots,
                    seconds=elapsed, kills=kills, restarts=restarts, evictions=evictions, **total,
                    first_wrong_s=min(firsts) - start if firsts else None,
                    wrong_samples=[dict(host=h, asked=sample[2 * h], got=sample[2 * h + 1])
                                   for h in range(hosts) if wrong_at[h]],
                    verify_good=report["good"], verify_bad=len(report["bad"]), claims=report["claims"])
    finally:
        if tmp is not None:
            tmp.cleanup()


def _size(text: str) -> int:
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1 byte")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pfcxl.host_tools.experiments.kv_stress", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=8, choices=range(1, 257), metavar="N", help="host processes (default 8)")
    ap.add_argument("--keys", type=int, default=64, help="distinct keys (default 64)")
    ap.add_argument("--size", type=_size, default=4096, help="bytes per block (default 4K)")
    ap.add_argument("--pool-size", type=_size, default=8 << 20, help="the store's bytes (default 8M)")
    ap.add_argument("--slots", type=int, default=4, help="index records per host (default 4)")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long (default 60)")
    ap.add_argument("--kill-every", type=float, default=1.0,
                    help="mean seconds between SIGKILLs of a random host (default 1; 0: none)")
    ap.add_argument("--stale", type=float, default=1.0, help="stale_s: a dead host's lease and claims expire after "
                    "this many seconds without a heartbeat (default 1)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pool", help="pool file to use (default: a temporary file)")
    ap.add_argument("--until-wrong", action="store_true", help="stop at the first wrong read")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    for name in ("keys", "slots", "seconds"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name} must be positive")
    if args.kill_every < 0 or args.stale <= 0:
        ap.error("--kill-every must be >= 0 and --stale > 0")
    try:
        r = run(args.pool, args.hosts, args.keys, args.size, args.pool_size, args.slots, args.seconds,
                args.kill_every, args.stale, args.seed, args.until_wrong)
    except kv.KVError as exc:
        print(f"bench_kv_stress: {exc}", file=sys.stderr)
        return 2
    print(f"store code: {r['module']}")
    print(f"{r['hosts']} hosts, {r['keys']} keys of {human(r['size'])}, a {human(r['pool_size'])} store with "
          f"{r['slots']} slots per host, {r['seconds']:.1f} s")
    print(f"gets {r['gets']:,} (hits {r['hits']:,}, wrong {r['wrong']}), puts {r['puts']:,} (stored "
          f"{r['stored']:,}), evictions {r['evictions']:,}, kills {r['kills']}, opens {r['opens']} "
          f"(refused while a lease stood: {r['refused_opens']}), leases lost {r['lease_lost']}")
    if r["first_wrong_s"] is not None:
        print(f"first wrong read after {r['first_wrong_s']:.1f} s; samples (asked key -> bytes of key): "
              + ", ".join(f"{w['asked']} -> {w['got']}" for w in r["wrong_samples"]))
    print(f"verify at the end: {r['verify_good']} good, {r['verify_bad']} bad, {r['claims']} claims")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    return 1 if r["wrong"] or r["verify_bad"] else 0


if __name__ == "__main__":
    sys.exit(main())
