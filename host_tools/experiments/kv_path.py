"""The KV block store's store and load throughput on each data path, measured in one run:

    python -m pfcxl.host_tools.experiments.kv_path [--blocks 16] [--size 1M] [--out kv-path-bench.json]

One pf-appliance whose shared pool holds a store formatted on the host with `pfcxl kv format`'s
defaults (16 hosts x 1024 slots, at the pool's byte 2 MiB), one Debian guest (host 0) booted with
`--data-path both`. In it, the C tool (`kvstore bench`) and the Python binding (pfcxl_kvstore)
each store then load B blocks of S bytes in host 0's arena, through the CXL region (/dev/dax0.0,
the store at its byte 2 MiB) and through the pool's direct device (the store at its byte 0); then
`pfcxl kv bench` does the same on the host, through the pool file, in host 1's arena. Every
bench removes its blocks; `pfcxl kv verify` must find the store clean at the end.

Guest figures are the guest's wall clock under QEMU TCG on this machine: emulator speed, not
fabric speed. The host row is this machine's memory through Python.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pfcxl
from pfcxl import process
from pfcxl.device.appliance import rundir as appliance_rundir
from pfcxl.device.topology.units import human, parse_size
from pfcxl.guest.tool_output import json_lines, tool_json


GUEST_PY = r'''
import json, sys, time, pfcxl_kvstore as kv
dev, blocks, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
with kv.Store.open(dev, host=0) as s:
    keys = [f"pybench/{i}" for i in range(blocks)]
    t0 = time.perf_counter(); stored = sum(s.put(k, payload) for k in keys)
    t1 = time.perf_counter(); loaded = sum(s.get(k) == payload for k in keys)
    t2 = time.perf_counter()
    for k in keys:
        s.remove(k)
    base = s.m.base
print("KVPY " + json.dumps(dict(base=base, stored=stored, loaded=loaded, store_s=t1 - t0, load_s=t2 - t1)))
'''


def row(path: str, tool: str, blocks: int, size: int, store_s: float, load_s: float, base: int | None) -> dict:
    return dict(path=path, tool=tool, base=base, blocks=blocks, block_bytes=size,
                store_blocks_s=blocks / store_s, store_GBps=blocks * size / store_s / 1e9,
                load_blocks_s=blocks / load_s, load_GBps=blocks * size / load_s / 1e9)


def _cli(*args: str) -> process.CompletedProcess:
    return process.capture([sys.executable, "-m", "pfcxl.host_tools.cli.main", *args], text=True)


def measure(blocks: int, size: int, say) -> dict:
    rows = []
    with pfcxl.Appliance("pf-appliance") as app:
        assert app.run_dir is not None      # started by `with`
        pool = str(appliance_rundir.shm_dir(app.run_dir) / "shared.pool")
        formatted = _cli("kv", "format", "--pool", pool)
        if formatted.returncode:
            raise SystemExit(formatted.stderr.strip())
        say("booting a Debian guest with --data-path both")
        with app.machine(host=0, image="debian", data_path="both", ready_timeout=1800, progress=say) as vm:
            paths = {"cxl": next(d["path"] for d in vm.ready["dax"] if d.get("region") == "region0"),
                     "direct": next(d["path"] for d in vm.ready["dax"] if d.get("device") == "pool")}
            for path, dev in paths.items():
                say(f"C kvstore bench on {path} ({dev})")
                done = vm.run(f"kvstore bench {dev} --host 0 --blocks {blocks} --size {size}", timeout=3600)
                got = tool_json(done.output, "kvstore")
                if done.status or got["stored"] != blocks or got["loaded"] != blocks:
                    raise SystemExit(f"kvstore bench on {dev} failed: {done.output[-1000:]}")
                rows.append(row(path, "guest C", blocks, size, got["store_ns"] / 1e9, got["load_ns"] / 1e9,
                                got["base"]))
            for path, dev in paths.items():
                say(f"Python binding on {path} ({dev})")
                done = vm.run(["python3", "-c", GUEST_PY, dev, str(blocks), str(size)], timeout=3600)
                found = json_lines(done.output, "KVPY ", tagged=True, what=f"the Python bench on {dev}")
                if done.status or not found:
                    raise SystemExit(f"the Python bench on {dev} failed: {done.output[-1000:]}")
                got = found[0]
                if got["stored"] != blocks or got["loaded"] != blocks:
                    raise SystemExit(f"the Python bench on {dev} stored {got['stored']}, loaded {got['loaded']}")
                rows.append(row(path, "guest Python", blocks, size, got["store_s"], got["load_s"], got["base"]))
        say("pfcxl kv bench on the host (pool file)")
        benched = _cli("kv", "bench", "--pool", pool, "--host", "1", "--blocks", str(blocks), "--size", str(size),
                       "--json")
        if benched.returncode:
            raise SystemExit(benched.stderr.strip())
        m = json.loads(benched.stdout)["measured"]
        rows.append(dict(path="host pool file", tool="host Python", base=None, blocks=blocks, block_bytes=size,
                         store_blocks_s=m["store_blocks_s"], store_GBps=m["store_gbs"],
                         load_blocks_s=m["load_blocks_s"], load_GBps=m["load_gbs"]))
        verify = _cli("kv", "verify", "--pool", pool, "--json")
        report = json.loads(verify.stdout) if verify.stdout else None
        if verify.returncode or report != {"good": 0, "bad": [], "claims": 0}:
            raise SystemExit(f"the store is not clean after the benches: {verify.stdout or verify.stderr}")
    return {"blocks": blocks, "block_bytes": size, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pfcxl.host_tools.experiments.kv_path", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=16, help="blocks per bench (default 16)")
    ap.add_argument("--size", default="1M", help="bytes per block (default 1M; a multiple of 8)")
    ap.add_argument("--out", default="kv-path-bench.json", help="results file (default kv-path-bench.json)")
    args = ap.parse_args(argv)
    try:
        size = parse_size(args.size)
    except ValueError as exc:
        ap.error(str(exc))
    if size < 8 or size % 8 or args.blocks < 1:
        ap.error(f"--size {args.size} must be a positive multiple of 8 and --blocks {args.blocks} at least 1")
    out = measure(args.blocks, size, lambda m: print(f"# {m}", flush=True))
    Path(args.out).write_text(json.dumps(out, indent=1))
    print("\n".join(["", *table(out), "", f"results: {args.out}"]))
    return 0


def table(out: dict) -> list[str]:
    head = f"{out['blocks']} blocks x {human(out['block_bytes'])}"
    return [f"{head:<28} store blocks/s  store GB/s  load blocks/s  load GB/s"] + [
        f"{r['path']:>14} {r['tool']:<13} {r['store_blocks_s']:>12.1f} {r['store_GBps']:>11.4f} "
        f"{r['load_blocks_s']:>14.1f} {r['load_GBps']:>10.4f}" for r in out["rows"]]


if __name__ == "__main__":
    raise SystemExit(main())
