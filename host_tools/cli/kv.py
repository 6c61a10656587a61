"""`pfcxl kv format|stats|dump|verify|bench`: the KV block store (docs/kvstore.md) read and written
on the host through the appliance's pool file, without a guest. The store code is the guest's own
file (guest/python/pfcxl_kvstore.py), so host and guests see one store. The serving model is
imported when a kv command runs: the parser stays light (host_tools/cli/main.py)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path

from pfcxl.device.appliance import rundir as appliance_rundir
from pfcxl.device import topology
from pfcxl.device.topology.units import human, parse_size
from pfcxl.errors import ApplianceError, KVStoreError, PfcxlError
from pfcxl.serving.chunks import KV_CHUNK_TOKENS

from pfcxl.guest.python import pfcxl_kvstore as kv
from pfcxl.host_tools import argtypes, bus_error
from pfcxl.host_tools.vm import boot_options
from pfcxl.host_tools.ui import out

DEFAULT_APPLIANCE = "pf-appliance"
BENCH_BLOCKS = 16     # x 1 MiB: fits an arena of the default format (16 hosts) of pf-appliance's pool


def pool_file(args) -> Path:
    """--pool, or the shared partition of the topology's appliance (its run directory)."""
    if args.pool:
        return Path(args.pool)
    topo = topology.load(topology.resolve(args.topology or DEFAULT_APPLIANCE))
    if topo.appliance is None:
        raise PfcxlError(f"topology '{topo.name}' has no [appliance] section: give --pool FILE")
    from pfcxl.host_tools import appliance_client as appliance
    run_dir = Path(args.run_dir) if args.run_dir else appliance.default_dir(topo)
    where = appliance_rundir.pool_dir(run_dir, topo.appliance.backing)
    if where is None:
        raise ApplianceError(f"appliance '{topo.name}' keeps its pool in memfds (backing memfd): the host cannot open "
                         "it; use backing \"shm\" or \"directory\"")
    path = where / "shared.pool"
    if not path.exists():
        raise ApplianceError(f"{path}: no pool there; start the appliance (pfcxl appliance start) or give --pool FILE")
    return path


def open_store(args, host=None):
    path = pool_file(args)
    bus_error.guard(path)                # a page its file system cannot supply: one line, not a core
    return kv.Store.open(str(path), host=host, base=args.base)    # its KVError: _kv_errors


def _kv_errors(command):
    """The guest binding raises its own KVError (it cannot import pfcxl): a kv command's is a
    KVStoreError here, one line and its exit code, not a traceback."""
    def run(args) -> int:
        try:
            return command(args)
        except kv.KVError as exc:
            raise KVStoreError(str(exc)) from exc
    run.__name__ = command.__name__
    return run


def cmd_format(args) -> int:
    path = pool_file(args)
    bus_error.guard(path)
    if not args.force:
        try:
            kv.Store.open(str(path), base=args.base).close()
            raise PfcxlError(f"{path} already holds a store; --force formats it anew (every block is lost)")
        except kv.KVError:
            pass
    sb = kv.format(str(path), hosts=args.hosts, slots=args.slots, chunk_tokens=KV_CHUNK_TOKENS,
                   size=args.size, base=args.base)
    at = kv.HOME if args.base is None else args.base
    out.print(f"{path}: store at byte {at} for {sb['hosts']} hosts x {sb['slots']} slots, arenas of {human(sb['arena_bytes'])}, "
              f"{sb['chunk_tokens']}-token chunks", highlight=False)
    return 0


def cmd_stats(args) -> int:
    with open_store(args) as s:
        st = s.stats()
    if args.json:
        print(json.dumps(st, indent=1))
        return 0
    from rich.table import Table
    t = Table(title=f"KV store: {st['blocks']} blocks, {human(st['bytes'])}")
    for col in ("host", "blocks", "bytes", "evictions", "last sequence"):
        t.add_column(col, justify="right")
    for h in st["hosts"]:
        t.add_row(str(h["host"]), str(h["blocks"]), str(h["bytes"]), str(h["evictions"]), str(h["sequence"]))
    out.print(t)
    return 0


def cmd_dump(args) -> int:
    with open_store(args) as s:
        rows = [dict(host=h, slot=sl, state="claim" if state & 1 else "published", sequence=state >> 1,
                     key=rec["key"].hex() if rec else None, offset=rec and rec["offset"],
                     length=rec and rec["length"], crc=rec and f"{rec['crc']:#010x}")
                for h, sl, rec, state in s.scan() if state]
    for r in rows:
        print(json.dumps(r))
    return 0


def cmd_verify(args) -> int:
    with open_store(args) as s:
        report = s.verify()
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        out.print(f"{report['good']} blocks verified, {len(report['bad'])} bad, {report['claims']} unpublished claims")
        for b in report["bad"]:
            out.print(f"bad: host {b['host']} slot {b['slot']} key {b.get('key', '?')}: {b['why']}", highlight=False)
    return 1 if report["bad"] else 0


def cmd_bench(args) -> int:
    """Store then load `--blocks` blocks of `--size` bytes as `--host`, timed on this machine's
    clock; the blocks are removed afterwards."""
    from rich.table import Table

    from pfcxl.host_tools.kv import model as kv_model
    with open_store(args, host=args.host) as s:
        _check_room(s, args.host, args.blocks, args.size)     # before the payload is allocated (--size 1T)
        payload = os.urandom(args.size)
        keys = [f"bench/{os.getpid()}/{i}" for i in range(args.blocks)]
        t0 = time.perf_counter()
        try:
            stored = sum(s.put(k, payload) for k in keys)
        except kv.KVError as exc:
            raise KVStoreError(f"bench --size {args.size}: {exc}") from exc
        t1 = time.perf_counter()
        loaded = sum(s.get(k) == payload for k in keys)
        t2 = time.perf_counter()
        for k in keys:
            s.remove(k)
    if stored != args.blocks or loaded != args.blocks:
        raise PfcxlError(f"bench stored {stored} and loaded {loaded} of {args.blocks} blocks: the arena of host "
                         f"{args.host} is too small for {args.blocks} x {args.size} bytes")
    measured = dict(path="host (pool file)", blocks=args.blocks, block_bytes=args.size,
                    store_blocks_s=args.blocks / (t1 - t0), store_gbs=args.blocks * args.size / (t1 - t0) / 1e9,
                    load_blocks_s=args.blocks / (t2 - t1), load_gbs=args.blocks * args.size / (t2 - t1) / 1e9)
    rows, assumption = kv_model.chunk_load_rows()
    if args.json:
        print(json.dumps(dict(measured=measured, modelled=rows, assumption=assumption), indent=1))
        return 0
    out.print(f"measured, {measured['path']}: store {measured['store_blocks_s']:.0f} blocks/s "
              f"{measured['store_gbs']:.2f} GB/s, load {measured['load_blocks_s']:.0f} blocks/s "
              f"{measured['load_gbs']:.2f} GB/s ({args.blocks} x {human(args.size)})", highlight=False)
    t = Table(title=f"modelled load time per {KV_CHUNK_TOKENS}-token chunk (ms)")
    for col in ("model", "chunk", "PF appliance", "electrical pool", "host DRAM", "recompute"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["model"], human(r["chunk_bytes"]), f"{r['pf_ms']:.3f}", f"{r['electrical_ms']:.3f}",
                  f"{r['dram_ms']:.3f}", f"{r['recompute_ms']:.1f}")
    out.print(t)
    out.print(f"[dim]{assumption}[/dim]")
    return 0


def _check_room(s, host: int, blocks: int, size: int) -> None:
    """Before anything is written: `blocks` blocks of `size` bytes must fit in `host`'s arena side
    by side (each starts on a cache line) and in its index, or the bench would evict its own."""
    lo, hi = s.arena(host)
    fit = min((hi - lo) // (-(-size // kv.LINE) * kv.LINE), s.slots)
    if blocks > fit:
        raise PfcxlError(f"bench --blocks {blocks} --size {human(size)}: host {host}'s arena ({human(hi - lo)}, "
                         f"{s.slots} slots) holds {fit} such blocks; give fewer or smaller blocks")


def cmd_replay(args) -> int:
    """A trace through the store by --hosts hosts (host_tools/kv/replay.py): processes on the pool
    file, or kvreplay in guests of the appliance (host_tools/kv/replay_guest.py), in one mode or
    both (--compare); every input is checked before the store is formatted anew."""
    from pfcxl.host_tools.kv import replay as kv_replay
    from pfcxl.host_tools.kv import replay_report as kv_replay_report
    from pfcxl.host_tools.cli.serving_trace import load_trace
    requests = list(load_trace(args).requests)
    modes = kv_replay.MODES if args.compare else (args.mode,)
    guests = args.on == "guests"
    if not guests and args.clock == "virtual":
        raise PfcxlError("--clock virtual is for --on guests: host processes run on the host's own clock")
    if not guests and (args.fabric or args.data_path):
        raise PfcxlError(f"--{'fabric' if args.fabric else 'data-path'} is for --on guests: the appliance times and "
                         "reaches guests, not host processes")
    setup = kv_replay.ReplaySetup(path="", base=args.base, hosts=args.hosts,
                                  capacity=args.capacity, block_bytes=args.block_bytes, block_tokens=args.block_tokens,
                                  routing=args.routing, window_ms=args.window, stale_s=args.stale,
                                  kill_host=args.kill_host, kill_at=args.at, ahead=args.ahead)
    kv_replay.check_inputs(setup, requests)
    if guests:
        from pfcxl.host_tools.kv.replay_guest import run_on_guests
        from pfcxl.host_tools.ui import err
        path = topology.resolve(args.topology or DEFAULT_APPLIANCE)
        from pfcxl.host_tools.vm.boot_options import BootOptions
        virtual = args.clock == "virtual"     # each guest in its own virtual clock, charged by --fabric
        options = BootOptions(clock="virtual", fabric=args.fabric or "pf",
                              fabric_params=tuple(args.fabric_params)) if virtual else None
        results = run_on_guests(topology.load(path), path, setup, requests, modes, data_path=args.data_path,
                                fabric=None if virtual else args.fabric,
                                say=lambda m: err.print(f"[dim]{m}[/dim]", highlight=False),
                                appliance_dir=Path(args.run_dir) if args.run_dir else None, options=options)
    else:
        with replay_pool(args, setup) as path:
            setup = dataclasses.replace(setup, path=path)
            kv_replay.check(setup, requests)
            results = [kv_replay.run(setup, requests, m) for m in modes]
    summaries = [kv_replay_report.summary(r, requests, args.model, args.block_tokens) for r in results]
    note = kv_replay_report.assumption(args.model, args.block_tokens, args.block_bytes)
    if args.json:
        print(json.dumps(dict(modes=summaries, note=note), indent=1))
    else:
        kv_replay_report.render(summaries, note)
    return 1 if any(s["check"]["bad"] for s in summaries) else 0


@contextlib.contextmanager
def replay_pool(args, setup):
    """The pool file `kv replay --on host` formats and replays into: --pool; else the shared pool of
    the topology's appliance, the running one (--run-dir, or its default directory) or, if none
    runs, a temporary one started here and stopped afterwards. A pool without a store gets one."""
    if args.pool:
        yield str(pool_file(args))
        return
    from pfcxl.host_tools.fleet import multihost
    from pfcxl.host_tools.kv import replay as kv_replay
    from pfcxl.host_tools.kv.replay_guest import ensure_store
    from pfcxl.host_tools.ui import err
    path = topology.resolve(args.topology or DEFAULT_APPLIANCE)
    topo = topology.load(path)
    if topo.appliance is None:
        raise PfcxlError(f"topology '{topo.name}' has no [appliance] section: give --pool FILE")
    with multihost.appliance_for(topo, path, Path(args.run_dir) if args.run_dir else None,
                                 lambda m: err.print(f"[dim]{m}[/dim]", highlight=False)) as (where, _):
        pool = appliance_rundir.pool_dir(where, topo.appliance.backing)
        if pool is None:
            raise PfcxlError(f"appliance '{topo.name}' keeps its pool in memfds (backing memfd): the host cannot "
                             "open it; use backing \"shm\" or \"directory\", or give --pool FILE")
        file = pool / "shared.pool"
        bus_error.guard(file)
        ensure_store(str(file), max(setup.hosts, kv_replay.DEFAULT_STORE_HOSTS), setup.base)
        yield str(file)


def _size(text: str) -> int:
    value = _bytes(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1 byte")
    return value


def _bytes(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_parsers(sub) -> None:
    kp = sub.add_parser("kv", help="the KV block store in the appliance's pool, from the host",
                        description="Read and write the KV block store (docs/kvstore.md) in the appliance's "
                        "shared pool file, without a guest.")
    ksub = kp.add_subparsers(dest="kv_cmd", metavar="ACTION", required=True)

    def base(p):
        p.add_argument("--pool", help="the store's file (default: the appliance's shared.pool)")
        p.add_argument("--topology", "-t", help=f"appliance topology (default {DEFAULT_APPLIANCE})")
        p.add_argument("--run-dir", help="the appliance's run directory")
        p.add_argument("--base", "--offset", type=_bytes, metavar="BYTES",
                       help=f"the store's first byte in the file (default {human(kv.HOME)}: where guests find it, "
                       f"at byte {human(kv.HOME)} of a CXL /dev/daxN.M and at byte 0 of a direct one; a multiple "
                       f"of {kv.PAGE})")
        return p

    p = base(ksub.add_parser("format", help="write an empty store (hosts, slots, 256-token chunks)",
                             description="Write an empty KV store into the pool file: one arena and one index "
                             "of --slots records per host, the pool shared equally. Refuses to format over a "
                             "store without --force."))
    p.add_argument("--hosts", type=argtypes.count, default=16, help="hosts with an arena (default 16)")
    p.add_argument("--slots", type=argtypes.count, default=1024, help="index records per host (default 1024)")
    p.add_argument("--size", type=_size, help="the store's bytes from its base (default: to the end)")
    p.add_argument("--force", action="store_true", help="format over an existing store")
    p.set_defaults(func=_kv_errors(cmd_format))
    p = base(ksub.add_parser("stats", help="blocks, bytes and evictions per host",
                             description="Count the published blocks and their bytes, evictions and the last "
                             "sequence number of every host's arena."))
    p.add_argument("--json", action="store_true", help="print the counts as one JSON document")
    p.set_defaults(func=_kv_errors(cmd_stats))
    base(ksub.add_parser("dump", help="every record, one JSON line each",
                         description="Print every index record in use (published or claimed) as one JSON "
                         "line: host, slot, state, sequence, key digest, offset, length, crc.")
         ).set_defaults(func=_kv_errors(cmd_dump))
    p = base(ksub.add_parser("verify", help="check every record and block; exit 1 if any is bad",
                             description="Check every published record's own crc and its block's crc; name "
                             "each bad one; exit 1 if there is any."))
    p.add_argument("--json", action="store_true", help="print the report as one JSON document")
    p.set_defaults(func=_kv_errors(cmd_verify))
    p = base(ksub.add_parser("bench", help="store and load blocks from the host (in --host's arena, which may "
                             "evict its oldest blocks); modelled chunk load times",
                             description="Store then load --blocks blocks of --size bytes in --host's arena on "
                             "this machine's clock (evicting that host's oldest blocks if need be), remove them, "
                             "and print the rates beside the modelled time to load one KV chunk from the PF "
                             "appliance, an electrical pool and host DRAM. The blocks must fit in the arena."))
    p.add_argument("--host", type=int, default=0, help="arena to use (default 0)")
    p.add_argument("--blocks", type=argtypes.count, default=BENCH_BLOCKS,
                   help=f"blocks to store then load; they must fit in the arena (default {BENCH_BLOCKS})")
    p.add_argument("--size", type=_size, default=1 << 20, help="bytes per block (default 1M)")
    p.add_argument("--json", action="store_true", help="print measured and modelled figures as one JSON document")
    p.set_defaults(func=_kv_errors(cmd_bench))
    p = base(ksub.add_parser("replay", help="replay a request trace through the store with N host processes, "
                             "local caches against the shared pool (formats the store anew)",
                             description="Replay a request trace (Mooncake's format: timestamps, lengths and "
                             "prefix-block hash ids) through the KV block store with --hosts host processes on "
                             "the pool file. Each request goes to one host, which looks its blocks up as a "
                             "prefix, loads every hit (its bytes checked against the block's id) and stores the "
                             "rest. local: a host reads only its own arena; shared: any host's published block. "
                             "Payloads are scaled to --block-bytes; the modelled TTFT uses the model's real "
                             "block size. Without --pool the store is the appliance's (the running one, else a "
                             "temporary one started here); it is formatted anew, after every input has been "
                             "checked."))
    p.add_argument("trace", help="a trace file in Mooncake's format (serving/traces.py), or a bundled trace's name: "
                   "conversation, synthetic")
    p.add_argument("--hosts", type=argtypes.count, default=4, help="host processes (at most the store's hosts)")
    p.add_argument("--on", choices=("host", "guests"), default="host",
                   help="where the hosts run: processes on the pool file (host), or the C kvreplay tool in one "
                   "guest each of the appliance, booted here (guests; the store in the appliance's pool)")
    boot_options.add_arguments(p, ("data_path",))
    p.add_argument("--fabric", choices=("pf", "electrical"),
                   help="with --on guests: the appliance models every guest's traffic on this fabric system; the "
                   "report adds each host's modelled latency, rate and the requests' TTFT from them")
    argtypes.old_spelling(p, "--timing", "--fabric", choices=("pf", "electrical"))
    # with --clock virtual, --fabric is what each guest is charged by
    boot_options.add_arguments(p, ("clock", "fabric_params"))
    p.add_argument("--routing", choices=("round-robin", "session", "prefix"), default="round-robin",
                   help="which host takes a request: in turn, by session (its first block after the shared "
                   "prefix), or the host holding the longest prefix of its blocks (default round-robin)")
    p.add_argument("--mode", choices=("local", "shared"), default="shared",
                   help="local: a host reads only its own arena; shared: any host's published block")
    p.add_argument("--compare", action="store_true", help="run local, then shared, and compare them")
    p.add_argument("--capacity", type=argtypes.count, default=4096, help="blocks each host's arena holds (default 4096)")
    p.add_argument("--block-bytes", type=_size, default=4096, help="scaled payload per block (default 4K)")
    p.add_argument("--block-tokens", type=argtypes.count, default=512, help="tokens per trace block (default 512)")
    p.add_argument("--model", default="llama-70b", help="model whose real block size times the TTFT (default llama-70b)")
    p.add_argument("--window", type=int, default=0, metavar="MS",
                   help="requests arriving within MS of a batch's first run at once (default 0: equal timestamps)")
    p.add_argument("--ahead", type=int, default=16, metavar="BATCHES",
                   help="batches a host may run past the oldest unfinished one, instead of waiting for the other "
                   "hosts at each batch's end (default 16; 0: every batch after the one before; prefix routing is "
                   "always 0)")
    p.add_argument("--stale", type=argtypes.seconds, default=1.0, help="seconds before a silent claimant is dead")
    p.add_argument("--kill-host", type=int, metavar="H", help="SIGKILL host H mid-replay (with --at)")
    p.add_argument("--at", type=float, default=1.0, metavar="SECONDS", help="when --kill-host strikes (default 1)")
    p.add_argument("--json", action="store_true", help="print every mode's counts as one JSON document")
    p.set_defaults(func=_kv_errors(cmd_replay))
