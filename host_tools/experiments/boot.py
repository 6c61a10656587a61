"""Cold boot to PFCXL-READY, classic against lean, interleaved in one run so both see the same load:

    python -m pfcxl.host_tools.experiments.boot [-t TOPOLOGY] [-n N] [--json FILE]
                                          [--exec] [--multihost HOSTS] [--plugin]

--exec also times `pfcxl run -- true` against `pfcxl exec` of the same in an up machine (and the
exec request alone, without the CLI's start-up), N times each, interleaved. --multihost H times
`multihost -n H -- true` as it was (all guests booting at once, classic kernel) against now
(one boot per CPU at a time, lean kernel). --plugin times lean boots with the TCG timing plugin
(count mode) as it boots now, dormant until init arms it, against the plugin instrumenting every
access from the first instruction (what doorbell=False still does), and against no plugin.

Each boot is split into phases: the image (build or cache check), QEMU's start (spawn to QMP
connected), firmware and kernel decompression (wall time from spawn to the guest's clock zero),
the kernel up to `Run /init` (and its longest gaps, from dmesg's timestamps), and init up to
PFCXL-READY (modules, devices, regions); qemu_cpu is the CPU time QEMU used up to READY, which
other load on the machine changes far less than the wall times. The ratios lean/classic are what
to compare; absolute figures depend on how busy the machine is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from typing import Any
from pathlib import Path

from pfcxl.host_tools.vm.boot_options import BootOptions
from pfcxl.machine import Machine

from pfcxl.host_tools import argtypes
from pfcxl import process
from pfcxl.process import cpu_seconds

DMESG_RE = re.compile(r"\[\s*(\d+\.\d+)\]\s?(.*)")
RUN_INIT = "Run /init as init process"
PHASES = ("image", "qemu_start", "firmware", "kernel", "init", "ready", "qemu_cpu")


def kernel_gaps(dmesg: str, top: int = 5) -> tuple[float | None, list[tuple[float, str]]]:
    """(kernel time at `Run /init`, the `top` longest silences before it with the line that ended each)."""
    at_init, previous, gaps = None, 0.0, []
    for line in dmesg.splitlines():
        found = DMESG_RE.fullmatch(line.strip())
        if not found:
            continue
        stamp, text = float(found.group(1)), found.group(2)
        gaps.append((round(stamp - previous, 3), text[:80]))
        previous = stamp
        if RUN_INIT in text:
            at_init = stamp
            break
    return at_init, sorted(gaps, reverse=True)[:top]


def boot_once(topology: str, lean: bool, run_dir: Path, timing=None) -> dict:
    """One cold boot, timed phase by phase (`timing`: a TimingConfig, or None for no plugin)."""
    t0 = time.monotonic()
    machine = Machine(topology, lean=lean, run_dir=run_dir, ready_timeout=600, timing=timing)
    machine.boot_image()
    t1 = time.monotonic()
    try:
        machine.launch()
        t2 = time.monotonic()
        machine.wait_ready()
        t3 = time.monotonic()
        pid = machine.pid
        assert pid is not None                  # wait_ready() returned: QEMU runs
        qemu_cpu = cpu_seconds(pid)
        uptime = float(machine.check("cat /proc/uptime").split()[0])
        t4 = time.monotonic()
        dmesg = machine.check("dmesg")
    finally:
        machine.close()
    at_ready = uptime - (t4 - t3)           # the guest's clock when READY arrived
    at_init, gaps = kernel_gaps(dmesg)
    return {"lean": lean, "image": t1 - t0, "qemu_start": t2 - t1, "firmware": (t3 - t1) - at_ready,
            "kernel": at_init, "init": at_ready - at_init if at_init is not None else None,
            "ready": t3 - t1, "qemu_cpu": qemu_cpu, "gaps": gaps}


def median_best(values) -> dict:
    values = list(values)
    return {"median": round(statistics.median(values), 3), "best": round(min(values), 3)}


def summary(boots: list[dict]) -> dict:
    """Per profile the median and best of each phase, and lean/classic ratios of the medians."""
    out: dict = {}
    for name, lean in (("classic", False), ("lean", True)):
        rows = [b for b in boots if b["lean"] is lean]
        out[name] = {p: median_best(b[p] for b in rows) for p in PHASES}
    out["ratio_lean_over_classic"] = {p: round(out["lean"][p]["median"] / out["classic"][p]["median"], 3)
                                      for p in PHASES if out["classic"][p]["median"] > 0}
    return out


def cli_seconds(*args: str) -> float:
    start = time.monotonic()
    done = process.capture([sys.executable, "-m", "pfcxl.host_tools.cli.main", *args], text=True)
    if done.returncode != 0:
        raise SystemExit(f"pfcxl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return time.monotonic() - start


def bench_exec(topology: str, n: int) -> dict:
    """pfcxl run -- true against pfcxl exec NAME -- true (and the bare exec request)."""
    from pfcxl.host_tools.fleet import detached
    name = f"bench-exec-{os.getpid()}"
    cli_seconds("up", "-t", topology, "--name", name)
    rows: dict[str, list[float]] = {"run": [], "exec": [], "exec_request": []}
    try:
        for _ in range(n):
            rows["run"].append(cli_seconds("run", "-t", topology, "--", "true"))
            rows["exec"].append(cli_seconds("exec", name, "--", "true"))
            start = time.monotonic()
            detached.exec_command(name, "true")
            rows["exec_request"].append(time.monotonic() - start)
    finally:
        detached.down(name)
    out = {k: median_best(v) for k, v in rows.items()}
    out["ratio_exec_over_run"] = round(out["exec"]["median"] / out["run"]["median"], 3)
    return out


def bench_multihost(hosts: int) -> dict:
    """multihost -n H -- true: all at once with the classic kernel (before) against now."""
    from pfcxl.device import topology as topology_mod
    from pfcxl.host_tools.fleet import multihost
    path = topology_mod.resolve("pf-appliance")
    topo = topology_mod.load(path)
    seconds: dict = {}
    cpus = len(os.sched_getaffinity(0))
    runs: tuple[tuple[str, dict[str, Any]], ...] = (("before", dict(parallel_boots=hosts, options=BootOptions(lean=False))),
                                                       ("after", {}))
    for label, options in runs:
        start = time.monotonic()
        results = multihost.run(topo, path, hosts, "true", **options)
        seconds[label] = round(time.monotonic() - start, 2)
        failed = [r.host for r in results if r.error or r.status]
        if failed:
            raise SystemExit(f"multihost ({label}): hosts {failed} failed")
        # the QEMU CPU time the boots needed, spread over the CPUs: what the wall time could be
        cpu = sum(r.cpu_seconds or 0 for r in results)
        seconds[f"{label}_qemu_cpu"] = round(cpu, 2)
        seconds[f"{label}_wall_over_cpu_per_core"] = round(seconds[label] / (cpu / cpus), 3) if cpu else None
        print(f"multihost -n {hosts} ({label}): {seconds[label]:.1f}s wall, {cpu:.1f}s QEMU CPU to ready "
              f"on {cpus} CPUs", flush=True)
    seconds["ratio_after_over_before"] = round(seconds["after"] / seconds["before"], 3)
    return seconds


def bench_plugin(topology: str, n: int, tmp: Path) -> dict:
    """Lean boots to READY: no plugin, the plugin dormant until armed, the plugin armed from boot."""
    from pfcxl.host_tools.timing.config import TimingConfig
    profiles = {"no_plugin": None, "plugin_dormant_until_armed": TimingConfig("count"),
                "plugin_armed_from_boot": TimingConfig("count", doorbell=False)}
    rows: dict[str, list[dict]] = {k: [] for k in profiles}
    for i in range(n):
        for label, config in profiles.items():      # interleaved, as the profiles above
            b = boot_once(topology, True, tmp / f"plugin-{i}-{label}", timing=config)
            rows[label].append(b)
            print(f"{label:27} ready={b['ready']:.2f}s qemu_cpu={b['qemu_cpu']:.2f}s", flush=True)
    out: dict = {k: {p: median_best(b[p] for b in v) for p in ("ready", "qemu_cpu")} for k, v in rows.items()}
    for k in ("no_plugin", "plugin_armed_from_boot"):
        out[f"ratio_dormant_over_{k}"] = round(out["plugin_dormant_until_armed"]["ready"]["median"]
                                               / out[k]["ready"]["median"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pfcxl.host_tools.experiments.boot", description=__doc__.split("\n\n")[0])
    parser.add_argument("-t", "--topology", default="pf-nic")
    parser.add_argument("-n", "--boots", type=int, default=3, help="boots per profile (default 3)")
    parser.add_argument("--json", type=Path, help="write every boot and the summary here")
    parser.add_argument("--exec", action="store_true", help="also: pfcxl run against pfcxl exec")
    parser.add_argument("--multihost", type=argtypes.count, metavar="HOSTS", help="also: multihost -n HOSTS before/after")
    parser.add_argument("--plugin", action="store_true", help="also: boots with the timing plugin, dormant until armed "
                        "against armed from boot and no plugin")
    args = parser.parse_args(argv)
    if args.boots < 1:
        parser.error(f"--boots {args.boots}: at least 1")
    boots = []
    load_at_start = os.getloadavg()     # other work on the machine: the wall times depend on it
    with tempfile.TemporaryDirectory(prefix="pfcxl-bench-boot-") as tmp:
        for i in range(args.boots):
            for lean in (False, True):              # interleaved: both profiles see the same load
                b = boot_once(args.topology, lean, Path(tmp) / f"{i}-{int(lean)}")
                boots.append(b)
                print(f"{'lean   ' if lean else 'classic'} " + " ".join(
                    f"{p}={b[p]:.2f}s" for p in PHASES if b[p] is not None), flush=True)
                print("    longest kernel gaps: " + "; ".join(f"{d:.2f}s before '{t}'" for d, t in b["gaps"]))
        result = summary(boots)
        if args.plugin:
            result["plugin"] = bench_plugin(args.topology, args.boots, Path(tmp))
    if args.exec:
        result["exec"] = bench_exec(args.topology, args.boots)
    if args.multihost:
        result["multihost"] = bench_multihost(args.multihost)
    result["load_average_1_5_15min"] = {"start": load_at_start, "end": os.getloadavg()}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"boots": boots, "summary": result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
