"""How long trace replays take: Mooncake's conversation trace (12,031 requests) in one configuration
and in the default capacity sweep, in one run:

    python -m pfcxl.host_tools.experiments.trace_replay [--trace NAME|FILE] [--json FILE]

Timed: reading and checking the trace; one event-mode replay (llama-70b on 8 x h200, the 2 TB
host-DRAM tier, chunk-lru), which is `pfcxl serving --trace conversation --tiers host` without its
rendering; the default sweep (11 capacities from 10^4 to 10^9 tokens and the unbounded ceiling) in
event mode and in sequence-only mode. Each figure is wall time and CPU time of this process; on a
shared machine the CPU times are what to compare, and the ratios sweep / one replay hold better
than either absolute figure. Goals: one configuration under 10 s, the sweep under 60 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from pfcxl.serving import inputs, mechanisms, traces
from pfcxl.serving.trace_sim import UNBOUNDED, TraceSetup, replay
from pfcxl.serving.traces import SWEEP_DEFAULT, TRACE_MODEL



def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def run(trace_arg: str) -> dict:
    path = Path(trace_arg) if Path(trace_arg).exists() else traces.bundled(trace_arg)
    trace, read = timed(lambda: traces.load(path))
    model, gpu, host = inputs.load_model(TRACE_MODEL), inputs.load_gpu("h200"), inputs.load_tier("host-dram-2tb")
    flops = mechanisms.published_prefill_tflops(gpu) * 1e12

    def setup(capacity, sequence_only=False):
        return TraceSetup(trace, model, gpu, 8, host, capacity, flops, sequence_only=sequence_only)

    one, one_t = timed(lambda: replay(setup(host.capacity_bytes / model.kv_bytes_per_token)))
    _, sweep_t = timed(lambda: [replay(setup(c)) for c in [*SWEEP_DEFAULT, UNBOUNDED]])
    _, seq_t = timed(lambda: [replay(setup(c, True)) for c in [*SWEEP_DEFAULT, UNBOUNDED]])
    return {"trace": str(path), "requests": len(trace.requests), "load_average": os.getloadavg(),
            "read": read, "one_configuration": one_t, "sweep_event": sweep_t, "sweep_sequence_only": seq_t,
            "points_per_sweep": len(SWEEP_DEFAULT) + 1, "one_configuration_hit_rate": one.summary()["hit_rate"],
            "ratios_cpu": {"sweep_event / one": sweep_t["cpu_s"] / one_t["cpu_s"],
                           "sweep_sequence_only / sweep_event": seq_t["cpu_s"] / sweep_t["cpu_s"]}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pfcxl.host_tools.experiments.trace_replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="conversation", help="a shipped trace's name or a file (default conversation)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    doc = run(args.trace)
    for key in ("read", "one_configuration", "sweep_event", "sweep_sequence_only"):
        print(f"{key:24} {doc[key]['wall_s']:7.2f} s wall {doc[key]['cpu_s']:7.2f} s CPU")
    for key, value in doc["ratios_cpu"].items():
        print(f"{key:40} {value:.2f} (CPU)")
    print(f"{doc['requests']:,} requests; load average {doc['load_average'][0]:.1f} (other work on the machine)")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
