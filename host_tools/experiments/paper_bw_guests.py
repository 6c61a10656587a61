"""The paper's per-port bandwidth from timed guests' own clocks, in one timeline:

    python -m pfcxl.host_tools.experiments.paper_bw_guests [-n 8] [--fabric-param port_mbs=4000] [--json F]

N guests boot with --clock virtual on one temporary pf-appliance that keeps a timeline, so their
requests queue behind each other's in the fabric model, and each guest reads its bandwidth in its
own clock (virtual time carrying the model's charges: not emulator time). Each guest streams
sequential 8-byte loads, one a 64-byte line (`chase --stream`), over one module's granules of the
shared pool (`--stripe G,M,K`: the pool's interleave, so every load goes to module K):
  alone   host 0 on module 0: one host's rate;
  own     every host h on module h;
  shared  every host on module 0.
The paper's figure is 25.6 GB/s per port at 100% utilisation, 32 B - 1 KB transfers, linear and
random. The model's port is each host-module optical path of the full mesh (constants.py): hosts
on one module each have their own path to it, and share only the module's DDR5 (16 ports' worth),
so the shared round is as fast as the own one. One guest's single vCPU keeps at most its miss
registers' lines in flight (48 x 64 B over the 283-330 ns they take: about 9.3 GB/s), so at the
paper's constants a guest fills 36% of its port. Scaled to show a port at 100%: the port's
bandwidth cut to what one guest offers or less (`--fabric-param port_mbs=4000`), every other figure
the paper's; each guest then reads at its port's bandwidth. N hosts (the machine holds 8 timed
guests well; 16 need twice the CPU). Only sequential 64-byte lines: `bandwidth`'s 32 B - 1 KB
transfers are 8-byte loads too, and at one instruction a nanosecond in virtual time each guest's
own loop, not the fabric, bounds them (about 0.8 GB/s).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from pfcxl.device.appliance import timeline
from pfcxl.device.fabric.model import Params
from pfcxl.device import topology
from pfcxl.guest.tool_output import tool_json
from pfcxl.host_tools.vm import boot_options
from pfcxl.host_tools.vm.boot_options import BootOptions
from pfcxl.host_tools.fleet.timed import TOPOLOGY, timed_fleet
from pfcxl.machine import Machine

TARGET = "/dev/dax0.0"          # the shared pool region, interleaved over every module


def command(app, module: int, *, loads: int, span: str) -> str:
    """One guest's stream on one module's granules, in a phase that starts on a 20 ms mark of its
    clock (every host joins the round at the same point of its tick)."""
    return (f"pfcxl_mark start --align 20 >/dev/null; chase --dax {TARGET} --stream --no-mark --span {span} "
            f"--loads {loads} --stripe {app.granularity},{app.modules},{module}; rc=$?; pfcxl_mark stop >/dev/null; "
            "exit $rc")


def run_round(machines: list[Machine], path: Path, commands: list[str]) -> list[float]:
    """commands[i] on machines[i], all at once in one timeline; each host's GB/s (64 B a line over
    its mean ns a line)."""
    timeline.expect(path, len(machines))
    started = [(m, m.start_traced(c, 3600, bracket=False)) for m, c in zip(machines, commands)]
    rates = []
    for m, s in started:
        run = m.finish_traced(s, 3600)
        if run.result.status != 0:
            raise SystemExit(f"{m.name}: the stream failed (exit {run.result.status}): {run.result.output[-500:]}")
        row = tool_json(run.result.output.splitlines()[0], "chase")
        rates.append(64 * row["loads"] / row["ns"])
    return rates


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pfcxl.host_tools.experiments.paper_bw_guests",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--hosts", type=int, default=8, help="timed guests (default 8)")
    ap.add_argument("--loads", type=int, default=400_000, help="lines each guest reads (default 400000: "
                    "25.6 MB, about 7 ms of virtual time alone)")
    ap.add_argument("--span", default="32M", help="bytes of its module's granules each guest walks (default 32M, "
                    "beyond the modelled caches)")
    ap.add_argument("--quantum", type=int, default=timeline.DEFAULT_QUANTUM_NS,
                    help=f"the timeline's quantum in ns (default {timeline.DEFAULT_QUANTUM_NS})")
    boot_options.add_arguments(ap, ("fabric_params",))
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    app_shape = topology.load(topology.resolve(TOPOLOGY)).appliance
    assert app_shape is not None
    if not 1 <= args.hosts <= app_shape.modules:
        ap.error(f"--hosts: 1 to {app_shape.modules} (one module each in the own round)")
    options = BootOptions(clock="virtual", fabric="pf", timing="count", fabric_params=tuple(args.fabric_params))
    port = Params.parse(options.fabric_params).port_mbs / 1000
    result: dict = {"hosts": args.hosts, "cpus": len(os.sched_getaffinity(0)), "port_GBps": port,
                    "fabric_params": list(options.fabric_params),
                    "clock": "guest virtual time (fabric model's charges)"}
    cmd = lambda module: command(app_shape, module, loads=args.loads, span=args.span)  # noqa: E731
    with timed_fleet(args.hosts, options, args.quantum, name="bw") as (machines, path):
        for name, hosts, modules in (("alone", 1, [0]), ("own", args.hosts, list(range(args.hosts))),
                                     ("shared", args.hosts, [0] * args.hosts)):
            t0 = time.monotonic()
            rates = run_round(machines[:hosts], path, [cmd(m) for m in modules])
            result[name] = {"GBps_per_host": rates, "GBps_sum": sum(rates), "wall_s": time.monotonic() - t0}
            print(f"{name}: {json.dumps(result[name])}", flush=True)
    what_if = f", what-if {' '.join(options.fabric_params)}" if options.fabric_params else ""
    print(f"\nsequential 64-byte lines, in the guests' own clocks: {args.hosts} timed guests in one timeline "
          f"(a port, each host's path to a module: {port:g} GB/s{what_if})")
    for name, what in (("alone", "host 0 on module 0"), ("own", "host h on module h"),
                       ("shared", f"all {args.hosts} on module 0")):
        r = result[name]["GBps_per_host"]
        print(f"  {name:7} {what:22} per host {min(r):6.2f}-{max(r):<6.2f} GB/s ({min(r) / port:.0%}-"
              f"{max(r) / port:.0%} of its port)   sum {sum(r):6.2f} GB/s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
