"""What virtual time costs, measured in one run (the machine is shared: ratios and CPU seconds):

    python -m pfcxl.host_tools.experiments.virtual_time [-t TOPOLOGY] [-n N] [--json FILE]

1. Boot to PFCXL-READY, the timed QEMU under icount (--clock virtual) against plain TCG, N of
   each, interleaved: wall seconds and QEMU's CPU seconds, and their ratios (the goal: 1.5 or less).
2. The slowdown: guest virtual seconds per host CPU second of QEMU, for a cold chase (every load
   a fabric miss) and a sequential read (one load a line), on the PF fabric. CXLMemSim's figure
   for its own slowdown on real hardware is 4.41x.
3. The cost per charged access: QEMU's CPU seconds per fabric request for the cold chase, timed
   against the same chase in a plain TCG guest whose plugin only counts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from pfcxl.guest.tool_output import tool_json
from pfcxl.machine import Machine
from pfcxl.process import cpu_seconds

CHASE = "chase --cold --lines 20000 --span 64M --loads 20000"
STREAM = "chase --stream --cold --span 64M --loads 400000"


def boot(topology: str, clock: str, run_dir: Path) -> tuple[Machine, dict]:
    started = time.monotonic()
    machine = Machine(topology, clock=clock, timing="count", run_dir=run_dir, name=clock)
    machine.start()
    assert machine.pid is not None
    return machine, {"clock": clock, "ready_s": time.monotonic() - started, "qemu_cpu_s": cpu_seconds(machine.pid)}


def timed_command(machine: Machine, command: str) -> dict:
    assert machine.pid is not None
    cpu0, wall0 = cpu_seconds(machine.pid), time.monotonic()
    traced = machine.traced_run(command, timeout=1800)
    cpu, wall = cpu_seconds(machine.pid) - cpu0, time.monotonic() - wall0
    row = tool_json(traced.result.output, "chase", what=command)
    phase = traced.phases[-1] if traced.phases else {}
    requests = int(phase.get("reads", 0)) + int(phase.get("writes", 0))
    return {"command": command, "guest_s": row["ns"] / 1e9, "qemu_cpu_s": cpu, "wall_s": wall,
            "requests": requests, "cpu_us_per_request": cpu / requests * 1e6 if requests else None,
            "guest_s_per_host_cpu_s": row["ns"] / 1e9 / cpu if cpu else None,
            "slowdown": cpu / (row["ns"] / 1e9) if row["ns"] else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pfcxl.host_tools.experiments.virtual_time",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--topology", default="pf-nic")
    ap.add_argument("-n", type=int, default=3, help="boots of each kind (default 3)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    result: dict = {"topology": args.topology, "boots": []}
    with tempfile.TemporaryDirectory(prefix="pfcxl-vt-") as tmp:
        for i in range(args.n):
            for clock in ("emulator", "virtual"):
                machine, row = boot(args.topology, clock, Path(tmp) / f"{clock}-{i}")
                try:
                    if i == 0:      # the commands once, on the first pair of boots
                        row["chase"] = timed_command(machine, CHASE)
                        if clock == "virtual":
                            row["stream"] = timed_command(machine, STREAM)
                finally:
                    machine.close()
                result["boots"].append(row)
                print(json.dumps(row), flush=True)
    by = {c: [b for b in result["boots"] if b["clock"] == c] for c in ("emulator", "virtual")}
    med = {c: {k: statistics.median(b[k] for b in by[c]) for k in ("ready_s", "qemu_cpu_s")} for c in by}
    timed, plain = by["virtual"][0], by["emulator"][0]
    result["summary"] = {
        "ready_wall_ratio": med["virtual"]["ready_s"] / med["emulator"]["ready_s"],
        "ready_cpu_ratio": med["virtual"]["qemu_cpu_s"] / med["emulator"]["qemu_cpu_s"],
        "median_ready_s": {c: med[c]["ready_s"] for c in med},
        "median_ready_qemu_cpu_s": {c: med[c]["qemu_cpu_s"] for c in med},
        "chase_slowdown": timed["chase"]["slowdown"], "stream_slowdown": timed["stream"]["slowdown"],
        "chase_cpu_us_per_request": {"virtual": timed["chase"]["cpu_us_per_request"],
                                     "emulator": plain["chase"]["cpu_us_per_request"]},
        "charge_cost_us": (timed["chase"]["cpu_us_per_request"] or 0) - (plain["chase"]["cpu_us_per_request"] or 0),
    }
    s = result["summary"]
    print(f"boot to READY, timed / plain TCG: {s['ready_wall_ratio']:.2f}x wall, {s['ready_cpu_ratio']:.2f}x QEMU CPU "
          f"(medians of {args.n}: {med['virtual']['ready_s']:.1f} s vs {med['emulator']['ready_s']:.1f} s wall)")
    print(f"slowdown (QEMU CPU s per guest virtual s): cold chase {s['chase_slowdown']:.0f}x, sequential read "
          f"{s['stream_slowdown']:.0f}x (CXLMemSim on real hardware: 4.41x)")
    print(f"cold chase, QEMU CPU per fabric request: {s['chase_cpu_us_per_request']['virtual']:.2f} us timed, "
          f"{s['chase_cpu_us_per_request']['emulator']:.2f} us plain (count plugin): the charge costs "
          f"{s['charge_cost_us']:.2f} us")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
