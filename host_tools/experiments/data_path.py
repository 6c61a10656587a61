"""The direct path against the CXL path and local memory, measured in one run:

    python -m pfcxl.host_tools.experiments.data_path [--out results.json] [--skip-hosts]

1. bandwidth (sequential and random, 64 B and 1 KiB, read and write) on one pf-nic guest with
   `--data-path both`: through the CXL region, the direct device and anonymous guest memory,
   with the ratios direct/CXL and direct/local; then the same on a 2-vCPU guest with 2 threads;
2. four hosts on one appliance each write 256 MiB of the shared pool and verify the other three
   hosts' slices (guest tool `slices`), once through the CXL region and once through the direct
   device: the host's wall time from the command's start in every guest to the last host done,
   and the slowest guest's own fill + wait + verify time.

Figures are guest wall-clock under QEMU TCG on this machine: emulator speed, not fabric speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

from pfcxl.host_tools.vm.boot_options import BootOptions
from pfcxl.device.topology import address_map
from pfcxl.device.topology import data_path
from pfcxl.device import topology
from pfcxl.device.topology.units import MiB
from pfcxl.machine import Machine
from pfcxl.guest.tool_output import tool_json

from pfcxl.host_tools.fleet import multihost

BANDWIDTH = "bandwidth --target {target} --pattern seq,random --op read,write --sizes 64,1024 " \
            "--threads {threads} --bytes {bytes} --span 64M"
# bytes per row: the CXL path moves ~20 MB/s under TCG, the others 10 to 100 times more
ROW_BYTES = {"cxl": "2M", "direct": "64M", "local": "64M"}
HOSTS, SLICE = 4, 256 * MiB       # what each host writes and the others verify
# pf-appliance with a shared pool that holds 4 slices of 256 MiB after the direct device's
# info block and the slices' flag area: 1280 MiB (and the hotplug room for it)
POOL_EDITS = (('shared = "1G"', 'shared = "1280M"'), ('volatile = "1G"', 'volatile = "1280M"'))


def bandwidth(cpus: int, say) -> dict:
    topo = data_path.with_data_path(topology.load(topology.resolve("pf-nic")), "both")
    topo = dataclasses.replace(topo, guest=dataclasses.replace(topo.guest, cpus=cpus))
    with Machine(topo, name=f"bw{cpus}", progress=say) as vm:
        targets = {"local": "anon"} | {d["kind"]: d["path"] for d in reversed(vm.ready["dax"])}
        rows: dict[str, list] = {}
        for path in ("cxl", "direct", "local"):
            say(f"{cpus} vCPU(s): bandwidth on {path} ({targets[path]})")
            done = vm.run(BANDWIDTH.format(target=targets[path], threads=cpus, bytes=ROW_BYTES[path]), timeout=3600)
            rows[path] = tool_json(done.output, "bandwidth")["results"]
    table = []
    for i, row in enumerate(rows["cxl"]):
        mbps = {path: rows[path][i]["MBps"] for path in rows}
        table.append({"pattern": row["pattern"], "op": row["op"], "size": row["size"], "threads": row["threads"],
                      **{f"{p}_MBps": v for p, v in mbps.items()},
                      "direct_over_cxl": mbps["direct"] / mbps["cxl"], "direct_over_local": mbps["direct"] / mbps["local"]})
    return {"cpus": cpus, "rows": table}


def cross_verify(path: str, say) -> dict:
    """4 hosts write and cross-verify 256 MiB each through `path` (cxl or direct)."""
    text = topology.resolve("pf-appliance").read_text()
    for old, new in POOL_EDITS:
        text = text.replace(old, new)
    with tempfile.TemporaryDirectory(prefix="pfcxl-dpbench-") as tmp:
        topo_file = Path(tmp) / "pf-appliance-1280.toml"
        topo_file.write_text(text)
        topo = data_path.with_data_path(topology.load(topo_file), path)
        if path == "cxl":
            device = "/dev/dax0.0"        # region0, the pool
        else:                             # the pool's direct device: the DAX device at its base
            base = address_map.direct_placements(topo)[0].base + data_path.DIRECT_OFFSET
            device = (f"$(for d in /sys/bus/dax/devices/dax*; do [ $(($(cat $d/resource))) -eq {base} ] "
                      "&& echo /dev/${d##*/}; done)")
        marks: dict[str, float] = {}

        def said(message: str) -> None:
            if "running the command" in message:
                marks["start"] = time.monotonic()
            say(f"{path}: {message}")

        def done(result) -> None:
            marks["end"] = time.monotonic()

        results = multihost.run(topo, topo_file, HOSTS, f"slices {device} --host {{host}} --hosts {{hosts}} "
                                f"--slice {SLICE} --timeout 3000", options=BootOptions(run_dir=str(Path(tmp) / "hosts")),
                                ready_timeout=1800, command_timeout=3600, say=said, host_done=done)
    bad = [r for r in results if r.error or r.status]
    if bad:
        raise SystemExit(f"{path}: hosts {[r.host for r in bad]} failed: {bad[0].error or bad[0].output[-500:]}")
    guests = [tool_json(r.output, "slices") for r in results]
    assert all(g["mismatches"] == 0 for g in guests)
    return {"path": path, "hosts": HOSTS, "slice_bytes": SLICE, "wall_seconds": marks["end"] - marks["start"],
            "slowest_guest_seconds": max(g["fill_ns"] + g["wait_ns"] + g["verify_ns"] for g in guests) / 1e9,
            "guests": [{k: g[k] for k in ("host", "fill_ns", "wait_ns", "verify_ns", "mismatches")} for g in guests]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pfcxl.host_tools.experiments.data_path", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data-path-bench.json", help="results file (default data-path-bench.json)")
    ap.add_argument("--skip-hosts", action="store_true", help="bandwidth only, no 4-host run")
    args = ap.parse_args(argv)
    say = lambda m: print(f"# {m}", flush=True)   # noqa: E731
    out: dict = {"bandwidth": [bandwidth(cpus, say) for cpus in (1, 2)], "hosts": []}
    if not args.skip_hosts:
        out["hosts"] = [cross_verify(path, say) for path in ("cxl", "direct")]
    Path(args.out).write_text(json.dumps(out, indent=1))
    for run in out["bandwidth"]:
        print(f"\n{run['cpus']} vCPU(s), MB/s       cxl     direct      local  direct/cxl  direct/local")
        for r in run["rows"]:
            print(f"{r['pattern']:>6} {r['op']:>5} {r['size']:>5} B {r['cxl_MBps']:>8.1f} {r['direct_MBps']:>10.1f} "
                  f"{r['local_MBps']:>10.1f} {r['direct_over_cxl']:>10.1f}x {r['direct_over_local']:>12.0%}")
    for h in out["hosts"]:
        print(f"\n{h['hosts']} hosts x {h['slice_bytes'] >> 20} MiB write + cross-verify via {h['path']}: "
              f"{h['wall_seconds']:.1f} s wall (slowest guest {h['slowest_guest_seconds']:.1f} s)")
    print(f"\nresults: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
