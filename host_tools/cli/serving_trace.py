"""`pfcxl serving --trace FILE`: replay a request trace (pfcxl.serving.trace_sim), one run per KV
tier or a capacity sweep. host_tools/cli/serving.py parses the options and hands over here."""

from __future__ import annotations

import math
import re
from pathlib import Path

from rich.markup import escape

from pfcxl.errors import ServingError
from pfcxl.serving import inputs
from pfcxl.serving.traces import SWEEP_DEFAULT, TRACE_MODEL

from pfcxl.host_tools.results_dir import results_dir
from pfcxl.host_tools.ui import err, out

_BYTES = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30,
          "TIB": 2**40}
TRACE_ONLY = ("block_tokens", "kv_capacity", "capacity_sweep", "sequence_only", "hosts", "routing",
              "cache")


def parse_capacity(flag: str, text: str, kv_bytes_per_token: int) -> float:
    """'6e6' (tokens) or a size with a unit ('2TB', '500GiB'): KV-tier capacity in tokens."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m[2].upper() if m else ""
    if not m or (unit and unit not in _BYTES):
        raise ServingError(f"{flag}: '{text}' must be tokens (e.g. 6e6) or bytes with a unit "
                           f"({', '.join(u if len(u) < 3 else u[0] + 'i' + u[2] for u in _BYTES)})")
    value = float(m[1])
    return value * _BYTES[unit] / kv_bytes_per_token if unit else value


def parse_sweep(text: str | None, kv_bytes_per_token: int) -> list[float]:
    if text in (None, "default"):
        return SWEEP_DEFAULT
    values = sorted({parse_capacity("--capacity-sweep", part, kv_bytes_per_token) for part in text.split(",")})
    if not values:
        raise ServingError(f"--capacity-sweep: '{text}' lists no capacity")
    return values


def load_trace(args):
    from pfcxl.serving import traces
    path = Path(args.trace)
    if not path.exists() and path.suffix != ".jsonl" and "/" not in args.trace:
        path = traces.bundled(args.trace)
    if args.block_tokens is not None and args.block_tokens < 1:
        raise ServingError(f"--block-tokens: {args.block_tokens} must be a positive integer")
    return traces.load(path, args.block_tokens or traces.DEFAULT_BLOCK_TOKENS)


def policy(args):
    from pfcxl.serving.kvpolicy import Policy
    return Policy(args.policy, args.reservation, args.hit_accounting, args.store_answer, args.reservation_scope)


def overload_notice(busy: float, span: str) -> None:
    """One line when the prefill engine is offered more than it can do (above 100% busy)."""
    if busy > 1:
        err.print(f"[yellow]engine overloaded: prefill needs {busy:.0%} of {span}, so requests queue without end and "
                  f"TTFT measures the queue; spread arrivals with --time-scale {math.ceil(busy * 1.25 * 10) / 10:g} "
                  f"or more[/yellow]")


def cmd_trace(args, roles: list[str], tiers: dict, w, gpu, tflops: float, mech) -> int:
    """One replay per KV tier in `roles`, or (--capacity-sweep) a sweep with the first tier."""
    from pfcxl.serving import trace_report, trace_study
    from pfcxl.serving.trace_sim import TraceSetup

    if args.time_scale is not None and not args.time_scale > 0:
        raise ServingError(f"--time-scale: {args.time_scale!r} must be a positive number")
    model = inputs.load_model(args.model or TRACE_MODEL)
    if args.sweep:
        raise ServingError("--sweep runs the session model or the retrieval table: drop --trace")
    policy_ = policy(args)
    sweep = parse_sweep(args.capacity_sweep, model.kv_bytes_per_token) if args.capacity_sweep else None
    fixed = parse_capacity("--kv-capacity", args.kv_capacity, model.kv_bytes_per_token) if args.kv_capacity else None
    if sweep and fixed is not None:
        raise ServingError("--kv-capacity and --capacity-sweep both set the KV tier's capacity: give one")
    trace = load_trace(args)
    if args.hosts is not None:
        if sweep:
            raise ServingError("--hosts replays one capacity per host: give --kv-capacity, not --capacity-sweep")
        capacity = fixed if fixed is not None else tiers[roles[0]].capacity_bytes / model.kv_bytes_per_token
        return _cmd_hosts(args, trace, capacity // trace.block_tokens, model)
    for name in ("routing", "cache"):
        if getattr(args, name) is not None:
            raise ServingError(f"--{name} is an option of the N-host replay: use it with --hosts N")

    def setup(tier, capacity):
        return TraceSetup(trace, model, gpu, w.gpus, tier, capacity, tflops * 1e12, w.gpu_memory_utilization,
                          args.time_scale or 1.0, policy_, args.sequence_only, mech)

    def capacity_of(tier):
        return fixed if fixed is not None else tier.capacity_bytes / model.kv_bytes_per_token

    mode = setup(tiers[roles[0]], 0).mode
    title = (f"{trace.name} trace ({len(trace.requests):,} requests over {trace.span_ms / 1000:,.0f} s, "
             f"{trace.block_tokens}-token blocks), {model.name} on {w.gpus} x {gpu.name}; {mode}; policy "
             f"{policy_.label}; time scale x{args.time_scale or 1:g}")
    out_dir = results_dir(args.out, trace.name, kind="serving-trace")
    doc = {"trace": trace.path, "block_tokens": trace.block_tokens, "model": model.name, "gpu": gpu.name,
           "gpus": w.gpus, "mode": mode, "policy": policy_.label, "time_scale": args.time_scale or 1.0,
           "prefill_tflops_per_gpu": tflops, "kv_bytes_per_token": model.kv_bytes_per_token}
    with err.status("replaying") as status:
        if sweep:
            tier = tiers[roles[0]]
            swept = trace_study.sweep_capacity(lambda capacity: setup(tier, capacity), sweep, status.update)
        else:
            tier_runs = trace_study.replay_tiers({role: setup(tiers[role], capacity_of(tiers[role])) for role in roles},
                                                 status.update)
    if sweep:
        marks = {"host DRAM " + f"{tiers['host'].capacity_tb:g} TB": tiers["host"].capacity_bytes / model.kv_bytes_per_token,
                 "appliance " + f"{tiers['appliance'].capacity_tb:g} TB":
                 tiers["appliance"].capacity_bytes / model.kv_bytes_per_token}
        sweep_title = f"{title}; sweep of " + ("the cache's capacity" if args.sequence_only else
                                               f"the {roles[0]} tier's capacity (its load times)")
        out.print(trace_report.sweep_table(swept.points, swept.ceiling, sweep_title))
        for label, tokens in marks.items():
            out.print(f"{label} holds {tokens:,.0f} tokens of {model.name} KV ({model.kv_bytes_per_token:,} B a token)")
        written = swept.write(out_dir, doc, marks, sweep_title)
    else:
        out.print(trace_report.runs_table(tier_runs.runs, title))
        overload_notice(tier_runs.busiest(), "the trace's span")
        written = tier_runs.write(out_dir, doc, title, plot=not args.sequence_only)
    err.print(f"results in {escape(str(out_dir / 'results.json'))}" +
              (f"; plots: {', '.join(p.name for p in written)}" if written else ""))
    return 0


def _cmd_hosts(args, trace, capacity_blocks: float, model) -> int:
    """`--hosts N`: the sequence-only N-host replay (serving/hosts_sim.py), each cache mode asked
    for (both by default), as `pfcxl kv replay` routes and counts on the real store."""
    import json

    from pfcxl.serving import trace_report
    from pfcxl.serving.hosts_sim import CACHES, HostsSetup, replay_hosts
    caches = [args.cache] if args.cache else list(CACHES)
    setups = [HostsSetup(trace, args.hosts, c, args.routing or "round-robin", capacity_blocks) for c in caches]
    with err.status("replaying"):
        results = [replay_hosts(s) for s in setups]
    title = (f"{trace.name} trace ({len(trace.requests):,} requests, {trace.block_tokens}-token blocks) on "
             f"{args.hosts} hosts, routing {setups[0].routing}; {capacity_blocks:,.0f} blocks of {model.name} KV "
             f"per host ({capacity_blocks * trace.block_tokens * model.kv_bytes_per_token / 1e12:,.2f} TB); "
             f"sequence-only (chunk-lru, trace order, no GPU tier, no timing)")
    out.print(trace_report.hosts_table(results, title))
    out_dir = results_dir(args.out, trace.name, kind="serving-hosts")
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"trace": trace.path, "block_tokens": trace.block_tokens, "model": model.name,
           "runs": [{**r.summary(), "host_of": r.host_of, "hits": r.hits} for r in results]}
    (out_dir / "results.json").write_text(json.dumps(doc, indent=1))
    err.print(f"results in {escape(str(out_dir / 'results.json'))}")
    return 0


def add_options(p) -> None:
    """The trace options of `pfcxl serving` (added to its parser)."""
    g = p.add_argument_group("trace replay (see docs/serving.md)")
    g.add_argument("--trace", help="replay a request trace: a JSON-lines file (Mooncake's format) or a shipped "
                   "trace's name (conversation, synthetic); the model defaults to llama-70b")
    g.add_argument("--block-tokens", type=int, help="tokens per hash block in the trace (default 512)")
    p.add_argument("--time-scale", type=float, help="multiply the arrival times by this (the trace's timestamps, or "
                   "the session model's gaps: its request rate divided by it; default 1)")
    g.add_argument("--kv-capacity", help="KV-tier capacity: tokens (e.g. 6e6) or bytes with a unit (2TB, "
                   "500GiB); default: the tier files'")
    g.add_argument("--capacity-sweep", nargs="?", const="default", metavar="LIST",
                   help="hit rate against KV-tier capacity: 10^4..10^9 tokens per half decade, or a list "
                   "(tokens or sizes, comma-separated)")
    g.add_argument("--sequence-only", action="store_true",
                   help="one cache, requests in trace order, no GPU tier, no timing (how published hit-rate "
                   "curves are drawn)")
    h = p.add_argument_group("several hosts (the model side of `pfcxl kv replay`, docs/kvstore.md)")
    h.add_argument("--hosts", type=int, metavar="N",
                   help="N inference hosts, sequence-only: each request routed to one host, its prefix looked up "
                   "in that host's cache (local) or one tier all hosts share (shared); capacity per host from "
                   "--kv-capacity or the host tier's file")
    h.add_argument("--routing", help="with --hosts: round-robin (default), session or prefix, as kv replay routes")
    h.add_argument("--cache", help="with --hosts: local or shared (default: both, one after the other)")
    g.add_argument("--policy", default="chunk-lru", help="KV policy: chunk-lru (default) or radix-lru "
                   "(LLMServingSim's radix tree); also for the session model")
    g.add_argument("--reservation", action="store_true",
                   help="radix-lru: the KV tier first reserves room for every running request's full KV")
    llmservingsim: dict[str, dict] = {   # LLMServingSim's two further KV mechanisms (serving/kvpolicy.py), session model only
        "--reservation-scope": dict(default="request", choices=("request", "session"), help=(
            "with --reservation: request (arrival to answer, default) or session (held while the session is "
            "admitted, across its think time: every admitted request's KV)")),
        "--store-answer": dict(action="store_true", help=(
            "a finished request stores its input and output KV (LLMServingSim's cache_finished_req), not "
            "only its prompt's"))}
    for flag, spec in llmservingsim.items():
        g.add_argument(flag, **spec)
    m = p.add_argument_group("mechanisms (serving/data/constants.toml, docs/serving.md)")
    m.add_argument("--engine", choices=("lmcache", "vllm"),
                   help="how KV is moved: lmcache (one transfer per 256-token chunk per layer; the default, and "
                   "the retrieval table shows both) or vllm (one cudaMemcpyAsync per 16-token block per layer, K and "
                   "V apart)")
    m.add_argument("--pageable", action="store_true", help="host KV buffers are pageable, not pinned")
    m.add_argument("--private-host-memory", action="store_true",
                   help="each GPU's copies get the whole host DRAM bandwidth (default: the GPUs share it)")
    m.add_argument("--sweep", metavar="PARAM[=V,...]",
                   help="sensitivity: the table against one mechanism constant (its value x 0.25..4, or a list); "
                   "a table and sweep.png")
    p.add_argument("table", nargs="?", choices=("retrieval",),
                   help="retrieval: the paper's Table I, loading KV from host memory or disk vs recomputing it")
    r = p.add_argument_group("retrieval table")
    r.add_argument("--disk", default="nvme-gen4", help="disk tier: a name in serving/data/disks or a TOML path "
                   "(read_gbs and its source; default nvme-gen4)")
    r.add_argument("--disk-gbs", type=float, help="disk read bandwidth in GB/s instead of the file's")
    g.add_argument("--hit-accounting", default="any-tier",
                   help="what the hit rate counts: any-tier (default) or kv-beyond-gpu (LLMServingSim's "
                   "second-tier count)")


def check_trace_only(args) -> None:
    """Trace options given without --trace are a mistake, not silently ignored."""
    if args.trace:
        return
    for name in TRACE_ONLY:
        value = getattr(args, name)
        if value not in (None, False):
            raise ServingError(f"--{name.replace('_', '-')} is a trace-replay option: use it with --trace FILE")


DOCS_OFF = "docs/serving.md, \"Table I: where the model is still off\""


def cmd_retrieval(args, host, mech) -> int:
    """`pfcxl serving retrieval`: the paper's Table I from the serving model (serving/retrieval.py),
    each end beside the paper's with the ratio; both engines' load paths unless --engine picks one."""
    from dataclasses import replace

    from pfcxl.serving import retrieval
    disk = retrieval.load_disk(args.disk)
    if args.disk_gbs is not None:
        if not args.disk_gbs > 0:
            raise ServingError(f"--disk-gbs: {args.disk_gbs!r} must be a positive number")
        disk = retrieval.Disk(disk.name, args.disk_gbs, "--disk-gbs")
    engines = [args.engine] if args.engine else ["lmcache", "vllm"]
    if args.sweep:
        return _retrieval_sweep(args, host, disk, [replace(mech, engine=e) for e in engines])
    rows = [retrieval.row(name, g, n, host, disk, replace(mech, engine=e))
            for e in engines for (name, g, n) in retrieval.PAPER]
    for r, e in zip(rows, [e for e in engines for _ in retrieval.PAPER]):
        r["engine"] = e
    title = (f"Loading KV vs recomputing it, from mechanisms (serving/data/constants.toml), nothing fitted: speedup "
             f"ranges over batch {list(retrieval.BATCHES)} and contexts 1K..4M tokens that fit the GPUs; prefill at "
             f"{mech.dense_fraction:.0%} of dense BF16 peak; host DRAM {host.dram_bandwidth_gbs:g} GB/s "
             f"{'shared by' if mech.shared_host_memory else 'for each of'} the GPUs, "
             f"{'pinned' if mech.pinned else 'pageable'}; disk {disk.name} {disk.read_gbs:g} GB/s ({disk.source})")
    out.print(retrieval_table(rows, title))
    off = sum(retrieval.outside(r["host_ratio"]) + retrieval.outside(r["disk_ratio"]) for r in rows)
    if off:
        out.print(f"{off} of {len(rows) * 2 - sum(r['paper_disk'] is None for r in rows)} cells (marked !) have an end "
                  f"outside 2x of the paper: why, in {DOCS_OFF}")
    if args.out:
        import json
        Path(args.out).mkdir(parents=True, exist_ok=True)
        doc = {"disk": vars(disk), "constants": vars(mech), "rows": rows}
        (Path(args.out) / "retrieval.json").write_text(json.dumps(doc, indent=1))
        err.print(f"results in {escape(str(Path(args.out) / 'retrieval.json'))}")
    return 0


def retrieval_table(rows: list[dict], title: str):
    from rich.table import Table

    from pfcxl.serving import retrieval
    t = Table(title=title, title_justify="left")
    for col in ("model", "GPUs", "engine", "contexts", "host: model", "paper", "ratio lo / hi", "disk: model",
                "paper", "ratio lo / hi"):
        t.add_column(col, justify="left" if col in ("model", "engine") else "right")

    def cells(mine, paper, ratios):
        if not paper:
            return [f"{mine[0]:.2f}x-{mine[1]:.1f}x", "-", "-"]
        marked = [f"[red]{r:.2f}![/red]" if not 0.5 <= r <= 2 else f"[green]{r:.2f}[/green]" for r in ratios]
        return [f"{mine[0]:.2f}x-{mine[1]:.1f}x", f"{paper[0]:g}x-{paper[1]:g}x", " / ".join(marked)]
    for r in rows:
        t.add_row(r["model"], f"{r['gpus']} x {r['gpu']}", r["engine"], f"1K-{r['max_context'] // 1024:,}K",
                  *cells(r["host"], r["paper_host"], r["host_ratio"]), *cells(r["disk"], r["paper_disk"], r["disk_ratio"]))
    return t


def _retrieval_sweep(args, host, disk, mechs) -> int:
    """`pfcxl serving retrieval --sweep PARAM`: each row end's model / paper against one constant."""
    import json

    from pfcxl.serving import retrieval, sweep
    name, xs = sweep.values(args.sweep, mechs[0])
    series: dict[str, list[float]] = {}
    for mech in mechs:
        for x in xs:
            c = mech.with_value(name, x)
            for (model, g, n) in retrieval.PAPER:
                r = retrieval.row(model, g, n, host, disk, c)
                for what in ("host", "disk"):
                    if r[f"{what}_ratio"]:
                        for end, value in zip(("lo", "hi"), r[f"{what}_ratio"]):
                            series.setdefault(f"{model} {n}x{g} {what} {end} ({mech.engine})", []).append(value)
    title = f"Table I, model / paper at each row end, against {name} (published {getattr(mechs[0], name):g})"
    out.print(sweep.table(name, xs, series, title))
    out_dir = results_dir(args.out, name, kind="retrieval-sweep")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sweep.json").write_text(json.dumps({"param": name, "values": xs, "series": series}, indent=1))
    png = sweep.plot(name, xs, series, out_dir / "sweep.png", title)
    err.print(f"results in {escape(str(out_dir / 'sweep.json'))}; plot: {png.name}")
    return 0
