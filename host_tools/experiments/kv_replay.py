"""Speed of the KV store's lookups and of `pfcxl kv replay` on the host (docs/kvstore.md, "Replay").

    python -m pfcxl.host_tools.experiments.kv_replay lookup      # lookup cost against slots per host
    python -m pfcxl.host_tools.experiments.kv_replay replay      # the conversation trace, 10 hosts, both modes
    python -m pfcxl.host_tools.experiments.kv_replay guests --hosts 4 --requests 1000 --data-path direct

`lookup`: for 1K, 16K and 128K slots per host (4 hosts, 500 blocks stored), the index bytes a
lookup reads and its time, two ways in one run: the store's lookup (each host's WINDOW lines from
the key's bucket) and a byte search over each host's whole segment, which is how lookups worked
before the store's version 3 (mmap.find over slots x 64 bytes per host), on the same store.

`replay`: the whole trace replayed by N host processes on a pool file in /dev/shm or --dir, both
modes, once per `--ahead` value (default 0, hosts meeting at every batch's end as the replay once
did, then the default): wall seconds, CPU seconds (this process and its hosts, getrusage), requests
per second, and the seconds the hosts waited for work (the replay's own count), per mode and for
both modes together. The machine's other load inflates wall time: compare CPU seconds between runs.

`guests`: the trace's first --requests requests replayed by kvreplay in --hosts guests of a
temporary pf-appliance (`kv replay --on guests`), both modes: wall seconds from the appliance's
start to the last reply (boots included), each mode's seconds and requests per second (guest
wall clock under TCG: the emulator's speed, not the fabric's), and the guests' lookup cost
(index bytes kvreplay read per lookup).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

from pfcxl.host_tools.kv import replay as kv_replay
from pfcxl.host_tools.kv.replay_host import kv


def _pool(where: str, size: int, hosts: int, slots: int) -> str:
    path = Path(where) / f"bench_kv_replay.{os.getpid()}.pool"
    path.write_bytes(b"")
    os.truncate(path, size)
    kv.format(str(path), hosts=hosts, slots=slots, chunk_tokens=512)
    return str(path)


def lookup(where: str, lookups: int = 2000) -> list[dict]:
    rows = []
    for slots in (1 << 10, 1 << 14, 1 << 17):
        hosts = 4
        path = _pool(where, (8 << 20) + hosts * slots * kv.LINE + hosts * (4 << 20), hosts, slots)
        try:
            with kv.Store.open(path, host=0) as w:
                for i in range(500):
                    w.put(b"b%d" % i, bytes(4096))
            with kv.Store.open(path) as r:
                keys = [b"b%d" % (i % 1000) for i in range(lookups)]       # half of them absent
                t0 = time.perf_counter()
                for k in keys:
                    r.find(k)
                window_s = (time.perf_counter() - t0) / lookups
                window_bytes = r.index_bytes / lookups
                seg = r.slots * kv.LINE
                t0 = time.perf_counter()
                for k in keys:                                   # the old lookup: search every segment
                    d = kv.key_digest(k)
                    for h in range(r.hosts):
                        start = r.m.base + r._slot_at(h, 0)
                        r.m.map.find(d, start, start + seg)
                scan_s = (time.perf_counter() - t0) / lookups
            rows.append(dict(slots=slots, hosts=hosts, window_bytes=window_bytes, window_us=window_s * 1e6,
                             scan_bytes=hosts * seg, scan_us=scan_s * 1e6, speedup=scan_s / window_s))
        finally:
            os.unlink(path)
    return rows


def replay(where: str, trace: str, hosts: int, capacity: int, routing: str, block_bytes: int,
           aheads: tuple[int, ...] = (0, kv_replay.AHEAD)) -> list[dict]:
    from pfcxl.serving import traces
    requests = list(traces.load(traces.bundled(trace)).requests)
    store_hosts = max(hosts, 16)
    size = kv_replay.region_bytes(store_hosts, capacity, block_bytes) + (4 << 20)
    path = _pool(where, size, store_hosts, 64)
    rows = []
    try:
        for ahead, mode in [(a, m) for a in aheads for m in kv_replay.MODES]:
            setup = kv_replay.ReplaySetup(path, None, hosts, capacity, block_bytes, routing=routing, ahead=ahead)
            cpu0 = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
            t0 = time.perf_counter()
            out = kv_replay.run(setup, requests, mode)
            wall = time.perf_counter() - t0
            cpu1 = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
            cpu = sum(b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime for a, b in zip(cpu0, cpu1))
            o = out["overall"]
            rows.append(dict(trace=trace, mode=mode, routing=routing, hosts=hosts, capacity=capacity, ahead=ahead,
                             requests=o["requests"], blocks=o["blocks"], hit_rate=o["hits"] / o["blocks"],
                             wall_s=wall, cpu_s=cpu, requests_per_s=o["requests"] / wall,
                             hosts_waited_s=out["waits"]["total_s"], batches=out["waits"]["batches"],
                             bad=o["bad"] + out["check"]["bad"]))
    finally:
        os.unlink(path)
    return rows


def guests(trace: str, hosts: int, requests: int, capacity: int, routing: str, block_bytes: int,
           data_path: str) -> list[dict]:
    import pfcxl
    from pfcxl.device import topology
    from pfcxl.serving import traces

    from pfcxl.host_tools.kv.replay_guest import run_on_guests
    reqs = list(traces.load(traces.bundled(trace)).requests[:requests])
    path = topology.resolve("pf-appliance")
    t0 = time.perf_counter()
    with pfcxl.Appliance("pf-appliance") as app:
        out = run_on_guests(topology.load(path), path, kv_replay.ReplaySetup("", None, hosts, capacity, block_bytes,
                                                                             routing=routing),
                            reqs, kv_replay.MODES, data_path=data_path, fabric=None,
                            say=lambda m: print(f"# {m}", flush=True), appliance_dir=app.run_dir)
    wall = time.perf_counter() - t0
    rows = []
    for r in out:
        o, n = r["overall"], sum(h["lookups"] for h in r["lookups"])
        lines = sum(h["index_lines"] for h in r["lookups"])
        rows.append(dict(trace=trace, on="guests", data_path=data_path, mode=r["mode"], routing=routing, hosts=hosts,
                         capacity=capacity, requests=o["requests"], blocks=o["blocks"], hit_rate=o["hits"] / o["blocks"],
                         evictions=o["evictions"], lost=o["lost"], mode_s=r["seconds"],
                         requests_per_s=o["requests"] / r["seconds"], wall_s_with_boots=wall, lookups=n,
                         index_bytes_per_lookup=64 * lines / n, bad=o["bad"] + r["check"]["bad"]))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=("lookup", "replay", "guests"))
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir(),
                    help="where the pool file goes (default /dev/shm)")
    ap.add_argument("--trace", default="conversation")
    ap.add_argument("--hosts", type=int, default=10)
    ap.add_argument("--capacity", type=int, default=10000, help="blocks per host (default 10000)")
    ap.add_argument("--routing", default="round-robin", choices=kv_replay.ROUTINGS)
    ap.add_argument("--block-bytes", type=int, default=4096)
    ap.add_argument("--ahead", default=f"0,{kv_replay.AHEAD}",
                    help=f"replay: the --ahead values to run, each with both modes (default 0,{kv_replay.AHEAD}: "
                    "each batch after the one before, against the default)")
    ap.add_argument("--requests", type=int, default=1000, help="guests: the trace's first N requests")
    ap.add_argument("--data-path", default="direct", choices=("cxl", "direct"), help="guests: the data path")
    args = ap.parse_args(argv)
    if args.part == "guests":
        rows = guests(args.trace, args.hosts, args.requests, args.capacity, args.routing, args.block_bytes,
                      args.data_path)
        for row in rows:
            print(json.dumps(row))
        return 1 if any(r["bad"] for r in rows) else 0
    if args.part == "lookup":
        for row in lookup(args.dir):
            print(json.dumps(row))
        return 0
    aheads = tuple(int(a) for a in args.ahead.split(","))
    rows = replay(args.dir, args.trace, args.hosts, args.capacity, args.routing, args.block_bytes, aheads)
    for row in rows:
        print(json.dumps(row))
    for a in aheads:                       # both modes together: what `kv replay --compare` takes
        both = [r for r in rows if r["ahead"] == a]
        print(json.dumps(dict(ahead=a, modes="+".join(r["mode"] for r in both),
                              wall_s=round(sum(r["wall_s"] for r in both), 1),
                              cpu_s=round(sum(r["cpu_s"] for r in both), 1),
                              hosts_waited_s=round(sum(r["hosts_waited_s"] for r in both), 1))))
    return 1 if any(r["bad"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
