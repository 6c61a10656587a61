"""What keeping timed hosts in one timeline costs, measured in one run (the machine is shared:
ratios to one host in the same run, and CPU seconds):

    python -m pfcxl.host_tools.experiments.timeline_overhead [-n 8] [--quantum NS] [--json FILE]

N timed guests (--clock virtual) boot on one temporary pf-appliance that keeps a timeline. Then
rounds of the same cold chase run on hosts 0..k-1 together, for k = 1, 2, 4, ... N; the others sit
idle, outside the barrier (a host joins at its phase start). For each round:
- wall seconds per virtual second the timeline advanced, and its ratio to k = 1;
- QEMU CPU seconds per host-virtual-second (CPU of the k QEMUs over k times the virtual seconds),
  and its ratio to k = 1: what the barrier costs each host, apart from sharing the CPUs;
- the host seconds the hosts waited at barriers (the slowest host makes the others wait), and the
  merge's host seconds (the last host at each barrier merges everyone's requests).
With more hosts than CPUs the wall ratio grows with k / CPUs whatever the barrier costs: the CPU
ratio is the barrier's own cost.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from pfcxl.device.appliance import timeline
from pfcxl.guest.tool_output import tool_json
from pfcxl.host_tools.vm.boot_options import BootOptions
from pfcxl.host_tools.fleet.timed import TOPOLOGY, timed_fleet
from pfcxl.machine import Machine
from pfcxl.process import cpu_seconds



def chase(loads: int) -> str:
    """A cold chase in a phase that starts on a 20 ms mark of the guest's clock, so every host
    joins the round at the same point of its tick, wherever the host's speed put the command. It
    chases in the host's private region (dax1.0): chains that several hosts write at once into the
    shared one would send each host down another's pointers."""
    return (f"pfcxl_mark start --align 20 >/dev/null; chase --dax /dev/dax1.0 --no-mark --cold --lines {loads} "
            f"--span 64M --loads {loads}; rc=$?; pfcxl_mark stop >/dev/null; exit $rc")


def run_round(machines: list[Machine], path: Path, command: str) -> dict:
    """The command on every machine of `machines` at once, in one timeline; what it cost."""
    timeline.expect(path, len(machines))
    before = timeline.read(path)
    pids = [m.pid for m in machines]
    assert all(pids)
    cpu0 = [cpu_seconds(p) for p in pids if p]
    wall0 = time.monotonic()
    started = [(m, m.start_traced(command, 1800, bracket=False)) for m in machines]
    runs = [m.finish_traced(s, 1800) for m, s in started]
    wall = time.monotonic() - wall0
    cpu = sum(cpu_seconds(p) for p in pids if p) - sum(cpu0)
    after = timeline.read(path)
    for run in runs:
        if run.result.status != 0:
            raise SystemExit(f"the chase failed (exit {run.result.status}): {run.result.output[-500:]}")
    waits = {h["host"]: h["wait_s"] for h in before["hosts"]}
    waited = {h["host"]: h["wait_s"] - waits.get(h["host"], 0.0) for h in after["hosts"]}
    virtual_s = (after["virtual_ns"] - before["virtual_ns"]) / 1e9
    k = len(machines)
    return {"hosts": k, "wall_s": wall, "qemu_cpu_s": cpu, "virtual_s": virtual_s,
            "wall_per_virtual_s": wall / virtual_s if virtual_s else None,
            "cpu_per_host_virtual_s": cpu / (k * virtual_s) if virtual_s else None,
            "quanta": after["quanta"] - before["quanta"],
            "merge_s": after["merge_s"] - before["merge_s"],
            "wait_s": {h: round(w, 4) for h, w in sorted(waited.items()) if h < k},
            "chase_ns_per_load": [tool_json(r.result.output.splitlines()[0], "chase")["p50_ns_per_load"] for r in runs]}


def counts(hosts: int) -> list[int]:
    """1, 2, 4, ... up to `hosts`, and `hosts` itself."""
    out, k = [], 1
    while k < hosts:
        out.append(k)
        k *= 2
    return out + [hosts]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pfcxl.host_tools.experiments.timeline_overhead",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--hosts", type=int, default=8, help="timed guests booted (default 8; rounds of "
                    "1, 2, 4, ... of them)")
    ap.add_argument("--quantum", type=int, default=timeline.DEFAULT_QUANTUM_NS,
                    help=f"the timeline's quantum in ns (default {timeline.DEFAULT_QUANTUM_NS})")
    ap.add_argument("--loads", type=int, default=20000, help="loads of each host's cold chase (default 20000: "
                    "about 6 ms of virtual time, so the round's fixed costs, typing the command and collecting "
                    "its trace, weigh little)")
    ap.add_argument("--fabric", choices=("pf", "electrical"), default="pf", help="the fabric (default pf)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    if not 1 <= args.hosts <= timeline.HOSTS:
        ap.error(f"--hosts: 1 to {timeline.HOSTS}")
    options = BootOptions(clock="virtual", fabric=args.fabric, timing="trace")
    result: dict = {"hosts": args.hosts, "quantum_ns": args.quantum, "loads": args.loads, "fabric": args.fabric,
                    "cpus": len(os.sched_getaffinity(0)), "rounds": []}
    with timed_fleet(args.hosts, options, args.quantum, name="t") as (machines, path):
        for k in counts(args.hosts):
            row = run_round(machines[:k], path, chase(args.loads))
            result["rounds"].append(row)
            print(json.dumps(row), flush=True)
    one = result["rounds"][0]
    print(f"\nbarrier overhead, {args.fabric}, quantum {args.quantum} ns, {result['cpus']} CPUs (ratios to 1 host "
          "in this run):")
    print(f"{'hosts':>5} {'wall/virt s':>12} {'ratio':>6} {'CPU/host-virt s':>16} {'ratio':>6} {'max wait s':>10} "
          f"{'merge s':>8} {'p50 ns/load':>12}")
    for r in result["rounds"]:
        r["wall_ratio"] = r["wall_per_virtual_s"] / one["wall_per_virtual_s"]
        r["cpu_ratio"] = r["cpu_per_host_virtual_s"] / one["cpu_per_host_virtual_s"]
        print(f"{r['hosts']:>5} {r['wall_per_virtual_s']:>12.0f} {r['wall_ratio']:>6.2f} "
              f"{r['cpu_per_host_virtual_s']:>16.0f} {r['cpu_ratio']:>6.2f} "
              f"{max(r['wait_s'].values(), default=0):>10.2f} "
              f"{r['merge_s']:>8.3f} {max(r['chase_ns_per_load']):>12.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
