"""Throughput benchmark of the fabric engine: `python -m pfcxl.host_tools.experiments.fabric_engine [--accesses N]`.

Builds a synthetic trace (fabric_workloads.mixed: 16 hosts, 32 B-1 KB transfers, half the hosts
walking linearly and half at random, half reads), runs it through the photonic-fabric appliance
model (with and without its HBM cache) and the electrical pool, and prints the engine's measured
wall time, CPU time, accesses per second and the latency percentiles. Each model runs twice in
the same process on the same trace: the compiled kernel (the default) and the numpy solver that
was the engine before it (fabric_engine.run(kernel=False)); the two must agree exactly, and the
ratio of their CPU times is printed. Only the engine's runs are timed, not the trace generation.
Accesses per CPU second is the one-core figure: the kernel is single-threaded, the numpy solver
uses up to two threads.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pfcxl.device.fabric import engine as fabric_engine
from pfcxl.device.fabric import model as fabric_model
from pfcxl.device.fabric import workloads as fabric_workloads
from pfcxl.device import topology


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accesses", type=int, default=10_000_000)
    ap.add_argument("--host-gbs", type=float, default=40.0, help="offered load per host (GB/s)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    app = topology.load(topology.resolve("pf-appliance")).appliance
    t0 = time.perf_counter()
    trace = fabric_workloads.mixed(app, args.accesses, seed=args.seed, host_gbs=args.host_gbs)
    print(f"trace: {len(trace):,} accesses, 16 hosts, 32 B-1 KB, linear and random, "
          f"{args.host_gbs} GB/s offered per host (generated in {time.perf_counter() - t0:.2f} s, not timed)")
    models = [("PF appliance + HBM cache", fabric_model.pf_appliance(app)),
              ("PF appliance, no cache", fabric_model.pf_appliance(app, cache=False)),
              ("electrical switched pool", fabric_model.electrical_pool(app.ports, app.modules))]
    for label, model in models:
        runs = {}
        for engine, kernel in (("kernel", True), ("numpy", False)):
            t0, c0 = time.perf_counter(), time.process_time()
            r = fabric_engine.run(model, trace, ns_per_insn=fabric_workloads.PS_STAMP,
                                  granularity=app.granularity, seed=args.seed, kernel=kernel)
            runs[engine] = (r, time.perf_counter() - t0, time.process_time() - c0)
        (r, wall, cpu), (old, old_wall, old_cpu) = runs["kernel"], runs["numpy"]
        if not (np.array_equal(r.latency_ps, old.latency_ps) and np.array_equal(r.hit, old.hit)):
            raise SystemExit(f"{label}: the kernel and the numpy solver disagree")
        print(f"\n{label}:")
        for engine, (_, w, c) in runs.items():
            print(f"  {engine:6} engine: wall {w:.2f} s, CPU {c:.2f} s = {len(trace) / c / 1e6:.1f} million "
                  f"accesses per CPU second ({len(trace) / w / 1e6:.1f} per wall second) (measured)")
        print(f"  kernel / numpy: {old_cpu / cpu:.1f}x less CPU, {old_wall / wall:.1f}x less wall time; "
              "identical latencies and hits")
        for op in ("read", "write"):
            p = r.percentiles(op)
            print(f"  {op:5} ns: " + "  ".join(f"{k} {p[k]:.1f}" for k in ("p50", "p90", "p99", "p99.9", "max", "mean")))
        if model.cache_lines:
            print(f"  HBM cache hits: {r.hit.sum() / max((~r.write).sum(), 1):.1%} of reads")
        for name, st in r.stages.items():
            used = st.utilisation[st.bytes > 0]
            print(f"  {name:17} utilisation mean {used.mean():.2f} max {used.max():.2f}; "
                  f"{st.achieved_gbs.sum():.1f} GB/s in total over {len(used)} queues")
            if used.max() > 0.99:
                print(f"  {'':17} ^ saturated: the offered load exceeds these links, queues grow for the whole run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
