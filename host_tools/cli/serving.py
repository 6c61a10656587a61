"""`pfcxl serving`: the serving-level model (pfcxl.serving) from the command line. The simulator,
its calibration and report are imported when the command runs: the parser stays light (host_tools/cli/main.py)."""

from __future__ import annotations

import argparse
import re
from dataclasses import replace
from pathlib import Path

from rich.markup import escape

from pfcxl.errors import ServingError
from pfcxl.serving import inputs

from pfcxl.host_tools.cli import serving_trace as cli_serving_trace
from pfcxl.host_tools.results_dir import results_dir
from pfcxl.host_tools.ui import err, out

DESCRIPTION = """\
Simulate multi-turn LLM serving with a tiered KV cache and compare two KV tiers: the photonic-fabric
appliance (default 32 TB) and host DRAM (default 2 TB), each behind the GPUs' own HBM. Sessions take
turns; each turn looks its conversation's KV up in 256-token chunks, loads the chunks it finds (the
appliance's load times come from pfcxl's fabric model), prefills the rest on the GPUs and stores its
prompt's KV; every tier evicts least recently used chunks; the GPU prefill engine and each tier's link
are FIFO queues. Prints mean TTFT and prefix hit rate per tier and session count, beside the paper's
figures with the ratio model / paper when the setup is the paper's; writes results.json, ttft.png and
hit_rate.png.

Nothing is fitted to the paper by default: the KV load path and the prefill come from mechanisms with
published constants (serving/data/constants.toml, each with its source). --calibrate is an explicit
opt-in that fits the dense prefill throughput to the paper's 50-session TTFT (2,690 ms) for that run.
Inputs are TOML files (models, GPUs, tiers, workloads) shipped in serving/data, or paths to your own.

Examples:
  pfcxl serving                                  # the paper's table: 50, 100, 300 sessions
  pfcxl serving --model llama-70b --sessions 10..500 --appliance-tb 8
  pfcxl serving --sessions 100 --appliance-bw-scale 2 --tiers appliance
  pfcxl serving --sweep call_overhead_us         # how the table moves with one constant
  pfcxl serving --calibrate                      # opt in: fit the prefill throughput to the paper
See docs/serving.md for the model, its sources and its assumptions."""

_SERIES = (1, 2, 3, 5)


def parse_sessions(text: str) -> list[int]:
    """'50,100,300', 'A..B' (1-2-3-5 steps per decade between A and B, both included) or 'A..B:STEP';
    each count at most bounds.MAX_SESSIONS, at most bounds.MAX_POINTS of them (checked before listing)."""
    from pfcxl.serving import bounds
    rule = (f"use N, N,N,..., A..B or A..B:STEP with whole numbers from 1 to {bounds.MAX_SESSIONS:,}, A <= B, "
            f"at most {bounds.MAX_POINTS} counts")
    m = re.fullmatch(r"\s*(\d{1,9})\s*\.\.\s*(\d{1,9})\s*(?::\s*(\d{1,9}))?\s*", text)
    if m:
        lo, hi, step = int(m[1]), int(m[2]), int(m[3]) if m[3] else None
        too_many = step and (hi - lo) // step + 2 > bounds.MAX_POINTS
        if lo < 1 or hi < lo or step == 0 or hi > bounds.MAX_SESSIONS or too_many:
            raise ServingError(f"--sessions: '{text}': {rule}")
        if step:
            return list(range(lo, hi + 1, step)) + ([] if (hi - lo) % step == 0 else [hi])
        values, decade = {lo, hi}, 1
        while decade <= hi:
            values.update(v * decade for v in _SERIES if lo <= v * decade <= hi)
            decade *= 10
        return sorted(values)
    parts = [p.strip() for p in text.split(",", bounds.MAX_POINTS)]
    if len(parts) > bounds.MAX_POINTS or not all(p.isdigit() and len(p) <= 9 and 1 <= int(p) <= bounds.MAX_SESSIONS
                                                 for p in parts):
        raise ServingError(f"--sessions: '{text}': {rule}")
    return sorted({int(p) for p in parts})


def _setup(args):
    """Workload, model, GPU and tiers after the command-line overrides; and whether that is the
    paper's setup (then the table shows the paper's figures beside ours)."""
    for flag, spec in (("qps", inputs.WORKLOAD_FIELDS["qps"]), ("gpus", inputs.DEPLOYMENT_FIELDS["gpus"]),
                       ("appliance_tb", inputs.TIER_FIELDS["capacity_tb"]), ("host_tb", inputs.TIER_FIELDS["capacity_tb"]),
                       ("appliance_bw_scale", inputs.TIER_OPTIONAL_FIELDS["bandwidth_scale"])):
        inputs.check_option("--" + flag.replace("_", "-"), spec, getattr(args, flag))
    if not 0 <= args.seed < 1 << 63:
        raise ServingError(f"--seed: {args.seed} must be a whole number from 0 to 2^63-1 (a numpy seed)")
    base = inputs.load_workload(args.workload)
    w = replace(base, qps=(args.qps or base.qps) / (args.time_scale or 1.0), gaps=args.gaps or base.gaps, gpus=args.gpus or base.gpus,
                model=args.model or base.model, gpu=args.gpu or base.gpu,
                appliance=args.appliance or base.appliance, host=args.host or base.host)
    appliance = inputs.load_tier(w.appliance)
    appliance = replace(appliance, capacity_tb=args.appliance_tb or appliance.capacity_tb,
                        bandwidth_scale=args.appliance_bw_scale or appliance.bandwidth_scale)
    host = inputs.load_tier(w.host)
    host = replace(host, capacity_tb=args.host_tb or host.capacity_tb)
    model, gpu = inputs.load_model(w.model), inputs.load_gpu(w.gpu)
    inputs.check_option("--prefill-tflops", (float, *inputs.within(0, gpu.bf16_dense_tflops, f"{gpu.name}'s dense BF16 "
                                                                   "peak: what prefill can reach")), args.prefill_tflops)
    paper = (w == base and appliance == inputs.load_tier(base.appliance) and host == inputs.load_tier(base.host)
             and args.prefill_tflops is None and args.seed == 1 and not args.time_scale)
    return w, model, gpu, {"appliance": appliance, "host": host}, paper


def cmd_serving(args) -> int:
    from rich.progress import Progress

    from pfcxl.serving import bounds, calibrate, mechanisms, report, sim
    sessions = parse_sessions(args.sessions)
    roles = [r.strip() for r in args.tiers.split(",")]
    if not roles or any(r not in report.ROLES for r in roles):
        raise ServingError(f"--tiers: '{args.tiers}' must list appliance and/or host, comma-separated")
    w, model, gpu, tiers, paper = _setup(args)
    if args.calibrate and not paper:
        raise ServingError("--calibrate fits the paper's figure, on the paper's setup only: drop the options "
                           "that change it")
    if args.time_scale is not None and not 0 < args.time_scale < float("inf"):
        raise ServingError(f"--time-scale: {args.time_scale!r} must be a positive number")
    mech = constants(args)
    if args.calibrate:
        with err.status("fitting the prefill throughput to the paper's 50-session TTFT") as status:
            cal = calibrate.fit(w, seed=args.seed, constants=mech, progress=lambda m: status.update(m))
        err.print(f"[yellow]--calibrate: fitted to the paper's {cal.target_ms:,.0f} ms TTFT at {cal.sessions} "
                  f"sessions, not measured: {cal.prefill_tflops_per_gpu:.1f} TFLOP/s per GPU "
                  f"({cal.prefill_tflops_per_gpu / gpu.bf16_dense_tflops:.1%} of {gpu.name} dense BF16; published: "
                  f"{mech.dense_fraction:.0%}) in {cal.runs} runs[/yellow]")
        tflops = cal.prefill_tflops_per_gpu
    else:
        tflops = args.prefill_tflops or mechanisms.published_prefill_tflops(gpu, mech)
    cli_serving_trace.check_trace_only(args)
    if args.table == "retrieval":
        return cli_serving_trace.cmd_retrieval(args, tiers["host"], mech)
    if args.trace:
        return cli_serving_trace.cmd_trace(args, roles, tiers, w, gpu, tflops, mech)
    bounds.check(w, model, gpu, [tiers[r] for r in roles], sessions, tflops, mech)
    calibration = {"prefill_tflops_per_gpu": tflops, "source": "--prefill-tflops" if args.prefill_tflops
                   else ("fitted to the paper now (--calibrate)" if args.calibrate else
                         f"published: prefill.dense_fraction in {mechanisms.CONSTANTS}"),
                   "constants": vars(mech)}
    policy = cli_serving_trace.policy(args)
    if args.sweep:
        return _cmd_sweep(args, w, model, gpu, tiers, roles, sessions, tflops, mech, policy, paper)

    results: dict[str, list[sim.SimResult]] = {r: [] for r in roles}
    points = [(r, n) for r in roles for n in sessions]
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task("simulating", total=len(points))
        for role, n in points:
            progress.update(task, description=f"{report.ROLES[role]}, {n} sessions")
            setup = sim.ServingSetup(w, model, gpu, tiers[role], n, tflops * 1e12, args.seed, policy, mech)
            results[role].append(sim.simulate(setup))
            progress.advance(task)

    title = (f"{model.name} on {w.gpus} x {gpu.name}, {w.name} ({w.turns} turns, {w.input_tokens}+{w.output_tokens} "
             f"tokens, {w.system_prefix_tokens}-token prefix, {w.qps:g} req/s); appliance "
             f"{tiers['appliance'].capacity_tb:g} TB, host DRAM {tiers['host'].capacity_tb:g} TB; prefill "
             f"{tflops:.1f} TFLOP/s per GPU; KV policy {policy.label}; load path {mech.engine}"
             f"{'' if mech.pinned else ', pageable'}")
    rows = report.comparison(results, w, paper)
    out.print(report.table(rows, title))
    cli_serving_trace.overload_notice(max(r.summary()["offered_prefill"] for rs in results.values() for r in rs),
                                      "the measured window")
    if not paper:
        err.print("[dim]not the paper's setup: its figures are not shown[/dim]")
    out_dir = results_dir(args.out, model.name, kind="serving")
    out_dir.mkdir(parents=True, exist_ok=True)
    report.write_json(out_dir / "results.json", results, rows, calibration)
    written = report.plots(rows, out_dir, title)
    err.print(f"results in {escape(str(out_dir / 'results.json'))}; plots: {', '.join(p.name for p in written)}")
    return 0


def constants(args):
    """The mechanism constants with the command line's switches (serving/mechanisms.py)."""
    from pfcxl.serving import mechanisms
    return mechanisms.load(engine=args.engine or "lmcache", pinned=not args.pageable,
                           shared_host_memory=not args.private_host_memory)


def _cmd_sweep(args, w, model, gpu, tiers, roles, sessions, tflops, mech, policy, paper) -> int:
    """`pfcxl serving --sweep PARAM`: the table's model / paper ratios (or the figures themselves,
    off the paper's setup) against one constant."""
    from pfcxl.serving import bounds, mechanisms, report, sim, sweep
    name, xs = sweep.values(args.sweep, mech)
    for x in xs:                                    # every swept value keeps the simulator's bounds
        bounds.check(w, model, gpu, [tiers[r] for r in roles], sessions, tflops, mech.with_value(name, x))
    series: dict[str, list[float]] = {}
    with err.status("sweeping") as status:
        for x in xs:
            c = mech.with_value(name, x)
            flops = (args.prefill_tflops or mechanisms.published_prefill_tflops(gpu, c)) if name == "dense_fraction" \
                else tflops
            for role in roles:
                for n in sessions:
                    status.update(f"{name} = {x:g}: {report.ROLES[role]}, {n} sessions")
                    run = sim.simulate(sim.ServingSetup(w, model, gpu, tiers[role], n, flops * 1e12, args.seed,
                                                        policy, c))
                    row = report.comparison({role: [run]}, w, paper)[0]
                    for metric in ("ttft_ms", "hit_rate"):
                        value = row[f"{metric}_ratio"] if paper else row[metric]
                        if value is not None:
                            series.setdefault(f"{report.ROLES[role]} {n} {metric}", []).append(value)
    title = (f"{model.name} on {w.gpus} x {gpu.name}: " + ("model / paper" if paper else "figures") +
             f" against {name} (published {getattr(mech, name):g}); load path {mech.engine}")
    band = (0.75, 1.25) if paper else (0.0, float("inf"))
    out.print(sweep.table(name, xs, series, title, band))
    out_dir = results_dir(args.out, name, kind="serving-sweep")
    out_dir.mkdir(parents=True, exist_ok=True)
    import json
    (out_dir / "sweep.json").write_text(json.dumps({"param": name, "values": xs, "series": series}, indent=1))
    png = sweep.plot(name, xs, series, out_dir / "sweep.png", title, "model / paper" if paper else "figure",
                     (0.75, 1.25) if paper else (1.0, 1.0))
    err.print(f"results in {escape(str(out_dir / 'sweep.json'))}; plot: {png.name}")
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("serving", help="serving-level model: TTFT and prefix hit rate with the appliance vs "
                       "host DRAM as KV tier", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", default="50,100,300",
                   help="concurrent sessions: N, a list N,N,..., A..B (1-2-3-5 steps) or A..B:STEP "
                   "(default 50,100,300)")
    p.add_argument("--tiers", default="appliance,host", help="KV tiers to simulate: appliance, host or both")
    p.add_argument("--workload", default="paper-chat", help="workload name or TOML path (default paper-chat)")
    p.add_argument("--model", help=f"model name or TOML path ({', '.join(inputs.shipped_names('models'))}; "
                   "default: the workload's)")
    p.add_argument("--gpu", help="GPU name or TOML path (default: the workload's, h200)")
    p.add_argument("--gpus", type=int, help="GPUs serving the model (default: the workload's, 8)")
    p.add_argument("--appliance", help="appliance tier name or TOML path (default appliance-32tb)")
    p.add_argument("--appliance-tb", type=float, help="appliance capacity in TB (decimal)")
    p.add_argument("--appliance-bw-scale", type=float,
                   help="multiply every appliance fabric bandwidth by this (what-if; default 1)")
    p.add_argument("--host", help="host-DRAM tier name or TOML path (default host-dram-2tb)")
    p.add_argument("--host-tb", type=float, help="host DRAM capacity in TB (decimal)")
    p.add_argument("--qps", type=float, help="requests per second over all sessions (default: the workload's)")
    p.add_argument("--gaps", choices=("fixed", "exponential"),
                   help="a session's gaps between requests: fixed (sessions / qps) or exponential, same mean")
    p.add_argument("--prefill-tflops", type=float,
                   help="dense prefill TFLOP/s per GPU instead of the published one (prefill.dense_fraction of the "
                   "GPU's dense BF16 peak)")
    p.add_argument("--seed", type=int, default=1, help="seed of the session start times (default 1)")
    p.add_argument("--calibrate", action="store_true",
                   help="opt in: fit the dense prefill throughput to the paper's 50-session TTFT and use it for "
                   "this run (a fit to the paper, not a measurement; never stored)")
    p.add_argument("--out", help="results directory (default results/serving-<time>-<model>)")
    cli_serving_trace.add_options(p)
    p.set_defaults(func=cmd_serving)
