"""Multi-host KV reuse measured with LMCache itself (docs/kvstore.md, "Serving engines"):
N LMCacheEngines, one per host process, replay a slice of Mooncake's conversation trace through
LMCache's own `retrieve` (its lookup and load) and `store`, in two modes:

* `local`: each engine's own LocalCPUBackend as its cache, `--capacity` chunks per host;
* `shared`: LMCache's LocalCPUBackend only allocates, and the pfcxl storage plugin
  (pfcxl.engines.lmcache.PfcxlStoragePlugin) is the cache: one host each of one store whose
  arenas hold `--capacity` chunks, so an engine hits what any engine stored.

Then `pfcxl kv replay` runs on the same requests, hosts, routing and capacity (host_tools/kv/
replay.py), for comparison. Run it with the engines' interpreter:

    .venv-engines/bin/python -m pfcxl.host_tools.experiments.engines_reuse --hosts 4 --requests 1000

A trace block (512 tokens, Mooncake's) is one LMCache chunk of 512 tokens whose token ids come from
the block's id (so equal ids are equal prefixes, as in the trace), a request's last partial block
taken whole (as kv replay counts it); its KV is a pure function of the block's id, one layer and
hidden size 2 in float16: 4 KiB per chunk, kv replay's default block. Every retrieved chunk is
compared with the bytes its id defines (`checked`; `bad` counts those that differ). Requests run
in batches of equal timestamps, each host serving its share in trace order, routed round-robin at
a batch's start, as kv replay does; the GPU connector is pfcxl.engines.lmcache_cpu's CPU stand-in.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

from pfcxl.host_tools.kv import replay as kv_replay
from pfcxl.host_tools.kv.replay_host import kv
from pfcxl.serving import traces
from pfcxl.serving.routing import Router, batches

BLOCK_TOKENS = 512
LAYERS, HIDDEN = 1, 2
CHUNK_BYTES = 2 * LAYERS * BLOCK_TOKENS * HIDDEN * 2          # 4096: K and V, float16
NAMED_BYTES = CHUNK_BYTES + 256                                  # a stored chunk: key, LMCache's metadata


def tokens_and_kv(blocks: list[int]):
    """A request's token ids and KV ([2, layers, tokens, hidden]), block by block from the ids."""
    import torch
    tokens = torch.cat([torch.arange(BLOCK_TOKENS, dtype=torch.int64) + b * BLOCK_TOKENS for b in blocks])
    parts = [((torch.arange(CHUNK_BYTES // 2, dtype=torch.int32) * 7 + b * 131) % 30011).to(torch.int16)
             .view(torch.float16).reshape(2, LAYERS, BLOCK_TOKENS, HIDDEN) for b in blocks]
    return tokens, torch.cat(parts, dim=2)


def host_main(conn, mode: str, host: int, pool: str, capacity: int, request_blocks: int) -> None:
    """One host: an LMCacheEngine serving the (request index, blocks) batches it is sent."""
    import torch

    from pfcxl.engines import lmcache_cpu as cpu
    if mode == "local":
        engine = cpu.engine(f"{mode}-{host}", BLOCK_TOKENS, LAYERS, HIDDEN, cpu_bytes=capacity * CHUNK_BYTES)
    else:
        engine = cpu.engine(f"{mode}-{host}", BLOCK_TOKENS, LAYERS, HIDDEN, hot=False,
                            cpu_bytes=4 * request_blocks * CHUNK_BYTES, **cpu.plugin_config("storage", pool, host))
    conn.send(("ready",))
    while (batch := conn.recv()) is not None:
        rows = []
        for index, blocks in batch:
            tokens, want = tokens_and_kv(blocks)
            got = torch.zeros_like(want)
            n = int(engine.retrieve(tokens, kv=got).sum()) // BLOCK_TOKENS
            good = 0
            for i in range(n):
                span = slice(i * BLOCK_TOKENS, (i + 1) * BLOCK_TOKENS)
                if not torch.equal(got[:, :, span].view(torch.int16), want[:, :, span].view(torch.int16)):
                    break
                good += 1
            engine.store(tokens, kv=want)
            rows.append(dict(index=index, blocks=len(blocks), hits=good, checked=n, bad=n - good))
        conn.send(("batch", rows))
    cpu.close(f"{mode}-{host}")
    conn.send(("closed",))


def lmcache_mode(mode: str, requests, hosts: int, capacity: int, pool: str) -> dict:
    most = max(len(r.hash_ids) for r in requests)
    if mode == "shared":
        need = kv_replay.region_bytes(hosts, capacity, NAMED_BYTES)
        kv.format(pool, hosts=hosts, slots=kv_replay.slots_for(capacity), chunk_tokens=BLOCK_TOKENS, size=need)
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    for h in range(hosts):
        ours, theirs = ctx.Pipe()
        p = ctx.Process(target=host_main, args=(theirs, mode, h, pool, capacity, most), daemon=True)
        p.start()
        pipes.append(ours)
        procs.append(p)
    for c in pipes:
        assert c.recv() == ("ready",)
    router = Router("round-robin", hosts, requests, lambda blocks, live: {})
    rows: list[dict] = []
    t0 = time.monotonic()
    for batch in batches(requests, 0):
        share: dict[int, list] = {}
        for i in batch:
            share.setdefault(router.pick(requests[i], list(range(hosts))), []).append((i, list(requests[i].hash_ids)))
        for h, work in share.items():
            pipes[h].send(work)
        for h in share:
            kind, done = pipes[h].recv()
            rows += [dict(r, host=h) for r in done]
    seconds = time.monotonic() - t0
    evictions = 0
    if mode == "shared":
        with kv.Store.open(pool) as reader:
            evictions = sum(reader.header(h)["evictions"] for h in range(hosts))
    for c, p in zip(pipes, procs):
        c.send(None)
        c.recv()
        p.join(30)
    total = {k: sum(r[k] for r in rows) for k in ("blocks", "hits", "checked", "bad")}
    return dict(system="LMCache", mode=mode, requests=len(rows), **total, evictions=evictions if mode == "shared"
                else None, checked_bytes=total["checked"] * CHUNK_BYTES, seconds=seconds)


def replay_mode(mode: str, requests, hosts: int, capacity: int, pool: str) -> dict:
    setup = kv_replay.ReplaySetup(pool, None, hosts, capacity, CHUNK_BYTES)
    out = kv_replay.run(setup, requests, mode)["overall"]
    return dict(system="pfcxl kv replay", mode=mode, requests=out["requests"], blocks=out["blocks"],
                hits=out["hits"], checked=out["checked"], bad=out["bad"], evictions=out["evictions"],
                checked_bytes=out["read"], seconds=None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="engines_reuse", description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--requests", type=int, default=1000, help="the trace's first N requests")
    parser.add_argument("--capacity", type=int, default=1000, help="chunks per host")
    parser.add_argument("--trace", default="conversation")
    parser.add_argument("--dir", default="/dev/shm", help="where the pool file goes")
    args = parser.parse_args(argv)
    os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")      # the host processes' engines: warnings only
    requests = list(traces.load(traces.bundled(args.trace), BLOCK_TOKENS).requests[:args.requests])
    # every block taken whole, as kv replay counts a request's blocks
    requests = [traces.Request(r.timestamp_ms, r.input_length, r.output_length,
                               r.hash_ids[:traces.blocks_for(r.input_length, BLOCK_TOKENS)]) for r in requests]
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        pool = str(Path(tmp) / "reuse.pool")
        size = kv.HOME + kv_replay.region_bytes(args.hosts, args.capacity, NAMED_BYTES)
        with open(pool, "wb") as f:
            f.truncate(size)
        kv.format(pool, hosts=args.hosts, slots=kv_replay.slots_for(args.capacity), chunk_tokens=BLOCK_TOKENS)
        for mode in ("local", "shared"):
            rows.append(lmcache_mode(mode, requests, args.hosts, args.capacity, pool))
        for mode in ("local", "shared"):
            rows.append(replay_mode(mode, requests, args.hosts, args.capacity, pool))
    print(f"{args.trace} trace, first {len(requests)} requests, {args.hosts} hosts, round-robin, "
          f"{args.capacity} chunks of 512 tokens ({CHUNK_BYTES} B) per host; measured, pid {os.getpid()}")
    print("| system | mode | requests | blocks | hit rate | hits | checked | bytes checked | bad | evictions | s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ev = "n/a" if r["evictions"] is None else f"{r['evictions']:,}"
        s = "" if r["seconds"] is None else f"{r['seconds']:.0f}"
        print(f"| {r['system']} | {r['mode']} | {r['requests']:,} | {r['blocks']:,} | "
              f"{100 * r['hits'] / max(r['blocks'], 1):.1f}% | {r['hits']:,} | {r['checked']:,} | "
              f"{r['checked_bytes']:,} | {r['bad']} | {ev} | {s} |")


if __name__ == "__main__":
    main()
