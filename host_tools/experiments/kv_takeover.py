"""Takeover stress of the KV block store (docs/kvstore.md, "A holder that resumes"): the holder of a
host is stopped (SIGSTOP) at a random moment of its work for longer than stale_s, another process
takes the host over and acknowledges puts, then the first one resumes (SIGCONT) or is killed.
Holders and takers are Python processes (pfcxl_kvstore) and the C tool (`kvstore bench` as a
holder, `kvstore put` processes as a taker), in every pairing. Every block read is compared with
the bytes of its key (the C tool's pattern: SplitMix64 of the key's digest), every acknowledged
block is read back after each takeover, and a lower host puts the key the stopped holder was
storing (its put must not wait for ever on a claim the stopped holder left). Prints gets,
takeovers, kills, wrong reads, destroyed acknowledged blocks and hangs; exit 1 if any of the last
three is not 0.

    python -m pfcxl.host_tools.experiments.kv_takeover --seconds 20

The arena and index are sized so that nothing is evicted: an acknowledged block that is gone was
destroyed, not evicted (the run reports the evictions, and says so if there were any).
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
from typing import Any

from pfcxl import cache, process
from pfcxl.guest.python import pfcxl_kvstore as kv
from pfcxl.host_tools.image import initramfs

HOST = 1                 # the host taken over; host 0 is the lower host that puts the stopped holder's key
SIZE = 1024              # bytes per block
SLOTS = 32768            # index records per host: the run stops before a quarter of them are used
ARENA = 16 << 20         # per host: room for every block the run stores
BENCH_BLOCKS = 1000      # a C holder's puts (about 7 ms of them)
HANG_S = 5.0             # a put that takes longer than this waits for ever
FIELDS = ("gets", "wrong", "acked", "pending", "lost", "refused")
M64 = (1 << 64) - 1


def pattern(key: str, size: int = SIZE, salt: int = 0) -> bytes:
    """The C tool's block for `key` (kvstore.c, fill; its --help): 8-byte SplitMix64 words seeded
    with the key's first 8 digest bytes (little-endian) xor salt * 0x9E3779B97F4A7C15."""
    seed = struct.unpack_from("<Q", kv.key_digest(key))[0] ^ (salt * 0x9E3779B97F4A7C15 & M64)
    words = []
    for _ in range(size // 8):
        seed = (seed + 0x9E3779B97F4A7C15) & M64
        z = seed
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        words.append(z ^ (z >> 31))
    return struct.pack(f"<{len(words)}Q", *words)


def _py_holder(path: str, prefix: str, stale_s: float, known: list[str], counts, stop, seed: int,
               throttle_s: float) -> None:
    """Open HOST (taking it over if its holder is stopped), put PREFIX/0, PREFIX/1, ... and get a
    random acknowledged key after each, every read checked, until `stop` or the lease is lost."""
    col = {f: i for i, f in enumerate(FIELDS)}
    rng = random.Random(seed)
    try:
        s = kv.Store.open(path, host=HOST, stale_s=stale_s)
    except kv.KVError:
        counts[col["refused"]] = 1
        return
    mine: list[str] = []
    try:
        i = 0
        while not stop.is_set():
            key = f"{prefix}/{i}"
            counts[col["pending"]] = i
            if s.put(key, pattern(key)):
                mine.append(key)
                counts[col["acked"]] = i + 1
            i += 1
            pick = rng.choice(mine + known) if mine or known else None
            if pick is not None:
                got = s.get(pick)
                counts[col["wrong"]] += got is not None and got != pattern(pick)
                counts[col["gets"]] += 1
            if throttle_s:
                time.sleep(throttle_s)
    except kv.KVError:             # our lease was taken while we were stopped: we write nothing more
        counts[col["lost"]] = 1
    finally:
        s.close()


def _lower_put(path: str, key: str, stale_s: float) -> None:
    with kv.Store.open(path, host=0, stale_s=stale_s) as s:
        s.put(key, pattern(key))


def _ended(proc, wait_s: float, fig: dict) -> None:
    """Wait `wait_s` for a process to end; one that does not is a hang (counted), and killed."""
    proc.join(wait_s)
    if proc.is_alive():
        fig["hangs"] += 1
        proc.kill()
        proc.join()


def _wait(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def run(seconds: float = 20.0, stale_s: float = 0.5, seed: int = 1, pool: str | None = None,
        cycles: int | None = None) -> dict:
    """Takeover cycles for `seconds` (or `cycles` of them; every fourth cycle has each holder ->
    taker pairing once) on a fresh store (`pool`, a temporary file if None), while the store has
    room for them without evicting."""
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(seed)
    tool = str(initramfs.build_tool("kvstore", cache.images_dir() / "tools"))
    stale = ["--stale-ms", str(round(stale_s * 1000))] \
        if "--stale-ms" in process.capture([tool, "--help"], text=True).stdout else []
    tmp = None
    if pool is None:
        tmp = tempfile.TemporaryDirectory(prefix="pfcxl-kvtakeover-")
        pool = str(Path(tmp.name) / "pool")
    fig: dict[str, Any] = dict(gets=0, takeovers=0, kills=0, wrong=0, destroyed=0, hangs=0, acked=0, cycles=0,
                               lost_noticed=0, pairs={})
    acked: list[str] = []
    try:
        with open(pool, "wb") as f:
            f.truncate(2 * kv.HOME + 2 * ARENA + 2 * SLOTS * kv.LINE)     # room past HOME, as a DAX device has
        kv.format(pool, hosts=2, slots=SLOTS, chunk_tokens=256)
        reader = kv.Store.open(pool)

        def kvstore(action: str, *args: str):
            return process.capture([tool, action, pool, *args], text=True, timeout=60)

        start = time.monotonic()
        cycle = 0
        c_holders = 0
        while (cycle < cycles if cycles is not None else time.monotonic() - start < seconds) and \
                len(acked) + c_holders * BENCH_BLOCKS < SLOTS // 4:
            kind_x, kind_y = ("py", "c")[cycle % 2], ("py", "c")[cycle // 2 % 2]
            gen, seq0 = f"g{cycle}", reader.header(HOST)["next_seq"]
            # --- the holder, stopped at a random moment of its work
            x: Any
            if kind_x == "py":
                cx = ctx.RawArray(ctypes.c_uint64, len(FIELDS))
                stop_x = ctx.Event()
                x = ctx.Process(target=_py_holder, args=(pool, f"{gen}x", stale_s, [], cx, stop_x,
                                                         rng.getrandbits(32), 0.0))
                x.start()
            else:
                c_holders += 1
                x = process.start([tool, "bench", pool, "--host", str(HOST), "--blocks", str(BENCH_BLOCKS),
                                   "--size", str(SIZE), *stale], stdout=process.PIPE, stderr=process.PIPE,
                                  text=True)
            pid: int = x.pid
            if not _wait(lambda: reader.header(HOST)["next_seq"] >= seq0 + 2, 30):     # it has begun to put
                raise RuntimeError(f"the holder ({kind_x}) stored nothing" + ("" if kind_x == "py" else
                                                                            f": {x.communicate()[1].strip()}"))
            time.sleep(rng.uniform(0, 0.008))
            os.kill(pid, signal.SIGSTOP)
            # --- another process takes the host over and acknowledges puts
            y_acked: list[str] = []
            if kind_y == "py":
                cy = ctx.RawArray(ctypes.c_uint64, len(FIELDS))
                stop_y = ctx.Event()
                y = ctx.Process(target=_py_holder, args=(pool, f"{gen}y", stale_s, rng.sample(acked, min(50, len(acked))),
                                                         cy, stop_y, rng.getrandbits(32), 0.002))
                y.start()
                if not _wait(lambda: cy[2] >= 5 or cy[5] or not y.is_alive(), 30 + stale_s):
                    raise RuntimeError("the taker stored nothing")
            else:
                for i in range(5):
                    key = f"{gen}c/{i}"
                    done = kvstore("put", "--host", str(HOST), "--key", key, "--size", str(SIZE), *stale)
                    if done.returncode == 0 and '"stored":1' in done.stdout:
                        y_acked.append(key)
            fig["takeovers"] += 1
            # --- the stopped holder resumes (or is killed), and must write nothing of the taker's
            if rng.random() < 0.25:
                os.kill(pid, signal.SIGKILL)
                fig["kills"] += 1
            else:
                os.kill(pid, signal.SIGCONT)
            try:
                if kind_x == "py":
                    x.join(HANG_S)
                    stop_x.set()
                    _ended(x, HANG_S, fig)
                    fig["lost_noticed"] += bool(cx[4])
                    fig["gets"] += cx[0]
                    fig["wrong"] += cx[1]
                    acked += [f"{gen}x/{i}" for i in range(cx[2])]
                    pending = [f"{gen}x/{cx[3]}", f"{gen}x/{cx[3] + 1}"]
                else:
                    _, err = x.communicate(timeout=HANG_S)
                    fig["lost_noticed"] += "lease was taken" in err
                    pending = []
            except process.TimeoutExpired:
                fig["hangs"] += 1
                x.kill()
                x.communicate()
                pending = []
            # --- the lower host stores what the stopped holder was storing, while the taker lives
            names = {kv.key_digest(k): k for k in pending}
            if kind_x == "c":
                names.update({kv.key_digest(f"bench/{pid}/{i}"): f"bench/{pid}/{i}"
                              for i in range(BENCH_BLOCKS)})
            claimed = [names[rec["key"]] for h, s, rec, st in _claims(reader, HOST) if rec["key"] in names]
            for key in dict.fromkeys(claimed + pending):
                lower = ctx.Process(target=_lower_put, args=(pool, key, stale_s))
                lower.start()
                _ended(lower, HANG_S + stale_s, fig)
            if kind_y == "py":
                time.sleep(0.05)
                stop_y.set()
                _ended(y, HANG_S, fig)
                fig["gets"] += cy[0]
                fig["wrong"] += cy[1]
                y_acked = [f"{gen}y/{i}" for i in range(cy[2])]
            acked += y_acked
            # --- every acknowledged block, the taker's included, reads back
            for key in list(acked):
                got = reader.get(key)
                fig["gets"] += 1
                if got != pattern(key):
                    fig["wrong"] += got is not None
                    fig["destroyed"] += 1
                    acked.remove(key)
            pair = f"{kind_x}->{kind_y}"
            fig["pairs"][pair] = fig["pairs"].get(pair, 0) + 1
            cycle += 1
        fig["cycles"] = cycle
        fig["acked"] = len(acked) + fig["destroyed"]
        fig["seconds"] = time.monotonic() - start
        report = reader.verify()
        fig["verify_bad"] = len(report["bad"])
        fig["evictions"] = sum(h["evictions"] for h in reader.stats()["hosts"])
        reader.close()
        return fig
    finally:
        if tmp is not None:
            tmp.cleanup()


def _claims(reader, host: int):
    """Host `host`'s claims: (host, slot, record as written, state)."""
    for s in range(reader.slots):
        st = reader._state(host, s)
        if st & 1:
            yield host, s, kv.RECORD.unpack(reader.m.mem, reader._slot_at(host, s)), st


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pfcxl.host_tools.experiments.kv_takeover", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="how long (default 20)")
    ap.add_argument("--stale", type=float, default=0.5, help="stale_s of every opener (default 0.5)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.stale <= 0:
        ap.error("--seconds and --stale must be positive")
    r = run(args.seconds, args.stale, args.seed)
    print(f"store code: {kv.__file__}")
    print(f"{r['cycles']} cycles in {r['seconds']:.1f} s (holder->taker: "
          + ", ".join(f"{k} {v}" for k, v in sorted(r["pairs"].items())) + ")")
    print(f"gets {r['gets']:,}, takeovers {r['takeovers']}, kills {r['kills']}, wrong reads {r['wrong']}, "
          f"destroyed acknowledged blocks {r['destroyed']} of {r['acked']:,}, hangs {r['hangs']}")
    print(f"resumed holders that noticed the loss: {r['lost_noticed']}; verify at the end: {r['verify_bad']} bad; "
          f"evictions {r['evictions']}" + (" (so a missing block may have been evicted)" if r["evictions"] else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    return 1 if r["wrong"] or r["destroyed"] or r["hangs"] else 0


if __name__ == "__main__":
    sys.exit(main())
