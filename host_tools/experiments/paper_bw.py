"""The paper's bandwidth experiment from real traffic: python -m pfcxl.host_tools.experiments.paper_bw --help.

Capture (what is real, said plainly). Default: ONE guest runs the `bandwidth` benchmark on its
CXL DAX device under the TCG plugin, one row per pattern (seq, random), op (read, write) and
transfer size (32 B .. 1 KB), each row one plugin phase (--mark-rows 1), and the sixteen hosts
are that one guest's captured row stream, copied sixteen times: each copy keeps the captured
order, sizes and reads/writes, and its addresses are moved, line by line, either onto the host's
own module (host i -> module i, the paper's experiment) or by i interleave granules (all-to-all:
every host crosses every module). --hosts N: N real guests on a timed pf-appliance stream to
their own module and then all-to-all themselves, and the appliance's capture of them is
replayed (host_tools/experiments/paper_bw_hosts.py; a few rows, so sixteen guests take minutes).

Replay (device/fabric/replay.py, as `pfcxl model replay --load`): every host offers `--load`
PF ports (1.0 = 25.6 GB/s), evenly by bytes in captured order, on the PF appliance (DDR5 path,
no HBM cache) and on the electrical switch pool; all-to-all is replayed a second time at
--all-to-all-load (default: the host's PCIe Gen6 link). The report gives per port (PF optical
path, electrical switch link) achieved GB/s and utilisation, and per row the electrical pool's
knee: the first load of --curve-loads it no longer carries. Records keep the sizes the plugin
captured (as `model replay`): a 1 KB transfer is 16 line records, sequential 32 B transfers merge
into 64-B lines, random ones stay 32-B records. Figures are modelled, never guest time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from pfcxl.device.fabric import constants as fc
from pfcxl.device.fabric import model as fabric_model
from pfcxl.device.fabric import replay as fabric_replay
from pfcxl.device import topology
from pfcxl.device.fabric.workloads import module_offsets
from pfcxl.device.trace.records import LINE
from pfcxl.errors import PfcxlError

from pfcxl.device.fabric import systems as fabric_systems

from pfcxl.host_tools.bench import suite as bench
from pfcxl.host_tools.bench import model as bench_model
from pfcxl.host_tools.experiments import paper_bw_hosts as bench_paper_bw_hosts
from pfcxl.host_tools.timing import model_runs
from pfcxl.host_tools import argtypes
from pfcxl.host_tools.vm import boot_options
from pfcxl.host_tools.vm.boot_options import BootOptions

SIZES = "32,64,128,256,512,1024"
HOSTS_SIZES, HOSTS_BYTES, HOSTS_SPAN = "64,1024", "1M", "2M"     # --hosts: few rows, so 16 guests fit minutes
PORT_GBS = fc.PF_PORT_BANDWIDTH_MBS / 1000


def capture(topo, out: Path, *, sizes: str, nbytes: str, span: str,
            options: BootOptions) -> tuple[np.ndarray, list[dict]]:
    """Boot one guest with `options`, run the bandwidth rows with the plugin capturing; (records, rows)."""
    from pfcxl.machine import Machine
    command = (f"bandwidth --target {{dax}} --pattern seq,random --op read,write --sizes {sizes} --threads 1 "
               f"--bytes {nbytes} --span {span} --mark-rows 1")
    with Machine(topo, name="paperbw",
                 options=dataclasses.replace(options, timing="trace", run_dir=str(out / "run"))) as vm:
        command = command.replace("{dax}", bench.devices(vm.ready)["cxl"])
        traced = vm.traced_run(command, timeout=3600)     # marks its rows: each row one phase
        done = traced.result
        data = bench.parse_output(done.output)
        if done.status != 0 or data is None:
            raise PfcxlError(f"{command} exited with status {done.status}: {done.output.strip()[-300:]}")
        records, pieces = traced.records, traced.rows(len(data["results"]))
    assert records is not None                            # timing="trace" keeps them
    rows = [{k: r[k] for k in ("pattern", "op", "size")} | {"records": len(p)} for r, p in zip(data["results"], pieces)]
    return records, rows


def load_capture(folder: Path) -> tuple[np.ndarray, list[dict]]:
    """The records and rows an earlier run saved in `folder` (capture.npy, capture.json)."""
    records = model_runs.read_trace(folder / "capture.npy")
    try:
        rows = json.loads((folder / "capture.json").read_text())["rows"]
        counts = [int(r["records"]) for r in rows]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PfcxlError(f"{folder / 'capture.json'}: not a capture's row list ({exc})") from exc
    if sum(counts) != len(records):
        raise PfcxlError(f"{folder}: capture.json lists {sum(counts)} records, capture.npy holds {len(records)}")
    return records, rows


def hosts(records: np.ndarray, topo, *, all_to_all: bool) -> np.ndarray:
    """The row stream as every host of the appliance issues it: on its own module, or shifted."""
    app = fabric_systems.appliance_for(topo)
    base, _ = model_runs.placement(topo)
    offset = (records["hpa"] - np.uint64(base)).astype(np.int64)
    copies = []
    for h in range(min(app.ports, app.modules)):
        tr = bench_model.even(records)
        tr["host"] = h
        if all_to_all:
            moved = (offset + h * app.granularity) % app.shared
        else:
            moved = module_offsets(app, np.full(len(tr), h), offset // LINE) + offset % LINE
        tr["hpa"] = base + moved.astype(np.uint64)
        copies.append(tr)
    return np.concatenate(copies)


def _ports(report: dict, names: tuple[str, ...]) -> dict:
    got = {}
    for name in names:
        st = report.get(name)
        if st and st["queues"]:
            g, u = np.array(st["gbs"]), np.array(st["utilisation"])
            got[name] = {"queues": len(g), "gbs_min": float(g.min()), "gbs_mean": float(g.mean()),
                         "gbs_max": float(g.max()), "utilisation_min": float(u.min()),
                         "utilisation_mean": float(u.mean()), "bandwidth_gbs": st["bandwidth_gbs"]}
    return got


def replay_row(records: np.ndarray, topo, load: float, full_load: float, curve_loads: list[float]) -> dict:
    """One captured row, copied to every host (hosts()), replayed as replay_streams does."""
    own, spread = hosts(records, topo, all_to_all=False), hosts(records, topo, all_to_all=True)
    return replay_streams({"own_module": own, "all_to_all": spread}, topo, load, full_load, curve_loads)


def replay_streams(streams: dict[str, np.ndarray], topo, load: float, full_load: float,
                   curve_loads: list[float]) -> dict:
    """Every host's records of one row, own-module and all-to-all (`host`: the port), replayed at
    `load` on PF and electrical, all-to-all once more at `full_load`; the electrical knee of own-module."""
    base, granularity = model_runs.placement(topo)
    app = fabric_systems.appliance_for(topo)
    models = {"pf": fabric_model.pf_appliance(app, cache=False),
              "electrical": fabric_model.electrical_pool(app.ports, app.modules)}
    out: dict[str, dict] = {}
    for layout, at in (("own_module", load), ("all_to_all", load), ("all_to_all_full", full_load)):
        tr = streams["own_module" if layout == "own_module" else "all_to_all"]
        out[layout] = {}
        for system, model in models.items():
            r = fabric_replay.replay(model, tr, base_hpa=base, granularity=granularity, load=at)
            rates = fabric_replay.port_rates(r)
            per_host = np.bincount(tr["host"], weights=np.maximum(tr["size"], 1)) / max(r.window_ps, 1) * 1000
            out[layout][system] = {
                "ports": _ports(rates, ("port_up", "port_down", "switch_link_up", "switch_link_down",
                                        "device_link_up", "device_link_down", "host_link_up", "host_link_down")),
                "per_host_gbs_min": float(per_host.min()), "per_host_gbs_max": float(per_host.max())}
    points = fabric_replay.curve(models["electrical"], streams["own_module"], curve_loads, base_hpa=base,
                                 granularity=granularity)
    out["electrical_curve"] = {"points": points, "knee": fabric_replay.knee(points)}
    return out


def run_hosts(args) -> dict:
    """--hosts N: every host a real guest (bench_paper_bw_hosts); the same report."""
    path = topology.resolve(args.topology or "pf-appliance")
    topo = topology.load(path)
    out = Path(args.out)
    if args.capture_dir:
        got, rows = bench_paper_bw_hosts.load(Path(args.capture_dir))
        out.mkdir(parents=True, exist_ok=True)
    else:
        bench_paper_bw_hosts.capture(topo, path, args.hosts, out, sizes=args.sizes or HOSTS_SIZES,
                                     nbytes=args.bytes or HOSTS_BYTES, span=args.span or HOSTS_SPAN)
        got, rows = bench_paper_bw_hosts.load(out)
    report = {"capture": f"{len(got['hosts'])} guests on a timed pf-appliance (multihost, TCG plugin, the "
              "appliance's capture): own module (--stripe) and all-to-all (--rotate) rows of each",
              "hosts": len(got["hosts"]), "captured_records": sum(len(h["records"]) for h in got["hosts"].values()),
              "appliance": bench_paper_bw_hosts.appliance_figures(Path(args.capture_dir or out)), "load": args.load, "offered_gbs_per_host": args.load * PORT_GBS,
              "all_to_all_load": args.all_to_all_load, "rows": []}
    for (pattern, op, size), by in bench_paper_bw_hosts.streams(got, rows).items():
        own = by["own_module"]
        report["rows"].append({"pattern": pattern, "op": op, "size": size, "records": len(own),
                               "all_to_all_records": len(by["all_to_all"]),
                               "mean_record_bytes": float(own["size"].mean()) if len(own) else 0.0,
                               "on_own_module": bench_paper_bw_hosts.on_own_module(own, topo)}
                              | replay_streams(by, topo, args.load, args.all_to_all_load, args.curve_loads))
    (out / "paper_bw.json").write_text(json.dumps(report, indent=1))
    return report


def run(args) -> dict:
    if args.hosts:
        return run_hosts(args)
    topo = topology.load(topology.resolve(args.topology or "pf-nic"))
    out = Path(args.out)
    args.sizes, args.bytes, args.span = args.sizes or SIZES, args.bytes or "1M", args.span or "8M"
    if args.capture_dir:
        records, rows = load_capture(Path(args.capture_dir))
        out.mkdir(parents=True, exist_ok=True)
    else:
        out.mkdir(parents=True, exist_ok=True)
        records, rows = capture(topo, out, sizes=args.sizes, nbytes=args.bytes, span=args.span,
                                options=boot_options.from_args(args))
        model_runs.save_trace(out / "capture.npy", records)
        (out / "capture.json").write_text(json.dumps({"rows": rows}, indent=1))
    pieces = np.split(records, np.cumsum([r["records"] for r in rows])[:-1])
    report = {"capture": "one guest's bandwidth rows (TCG plugin), copied to every host: own module or all-to-all",
              "load": args.load, "offered_gbs_per_host": args.load * PORT_GBS,
              "all_to_all_load": args.all_to_all_load, "rows": []}
    for row, piece in zip(rows, pieces):
        report["rows"].append(row | {"mean_record_bytes": float(piece["size"].mean()) if len(piece) else 0.0}
                              | replay_row(piece, topo, args.load, args.all_to_all_load, args.curve_loads))
    (out / "paper_bw.json").write_text(json.dumps(report, indent=1))
    return report


def tables(report: dict) -> list[Table]:
    t = Table(title=f"own module (host i -> module i), offered {report['offered_gbs_per_host']:.1f} GB/s per host "
              "(modelled)", title_justify="left")
    for col in ("pattern", "op", "size", "records", "B/record", "PF port GB/s min", "max", "PF port util min",
                "electrical switch link util", "electrical GB/s per host", "electrical knee: load",
                "offered GB/s per host"):
        t.add_column(col, justify="right")
    for r in report["rows"]:
        port = _dir(r["own_module"]["pf"]["ports"], "port")
        el = r["own_module"]["electrical"]
        switch = _dir(el["ports"], "switch_link")
        knee = r["electrical_curve"]["knee"]
        t.add_row(r["pattern"], r["op"], str(r["size"]), str(r["records"]), f"{r['mean_record_bytes']:.0f}",
                  f"{port['gbs_min']:.2f}", f"{port['gbs_max']:.2f}", f"{port['utilisation_min']:.3f}",
                  f"{switch['utilisation_min']:.3f}", f"{el['per_host_gbs_min']:.1f}",
                  *((f"{knee['load']:g}", f"{knee['load'] * PORT_GBS:.1f}") if knee else ("none", "-")))
    t.caption = ("PF port = each host's optical path to its module, in the row's direction; electrical knee: the "
                 "first of --curve-loads whose achieved bandwidth is below 95% of offered")
    if report.get("hosts"):
        t.caption += ("; records on own module (host i -> module i): "
                      + ", ".join(f"{r['pattern']} {r['size']} B {r['on_own_module']:.3f}" for r in report["rows"]))
    out = [t]
    for load, key in ((report["load"], "all_to_all"), (report["all_to_all_load"], "all_to_all_full")):
        a = Table(title=f"all-to-all (host i starts i granules on: every host crosses every module), offered "
                  f"{load * PORT_GBS:.1f} GB/s per host (modelled)", title_justify="left")
        for col in ("pattern", "op", "size", "PF GB/s per host (min)", "PF path GB/s (max)", "PF path util (mean)",
                    "electrical GB/s per host (max)", "electrical switch link util (min)"):
            a.add_column(col, justify="right")
        for r in report["rows"]:
            pf, el = r[key]["pf"], r[key]["electrical"]
            port, switch = _dir(pf["ports"], "port"), _dir(el["ports"], "switch_link")
            a.add_row(r["pattern"], r["op"], str(r["size"]), f"{pf['per_host_gbs_min']:.1f}", f"{port['gbs_max']:.2f}",
                      f"{port['utilisation_mean']:.3f}", f"{el['per_host_gbs_max']:.1f}",
                      f"{switch['utilisation_min']:.3f}")
        out.append(a)
    return out


def _dir(ports: dict, stem: str) -> dict:
    """The stage of the row's direction: reads come back up, writes go down."""
    return ports.get(f"{stem}_up") or ports[f"{stem}_down"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pfcxl.host_tools.experiments.paper_bw", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/paper-bw", help="directory for capture.npy/json, paper_bw.json")
    p.add_argument("--capture-dir", help="reuse the capture of an earlier run (its --out, with the same --hosts "
                   "or none) instead of booting")
    p.add_argument("--hosts", type=argtypes.count, help="N real guests on a timed pf-appliance, each streaming to "
                   "its own module then all-to-all (default: one pf-nic guest's rows copied to every host)")
    p.add_argument("--topology", "-t", help="the topology the guest boots (default pf-nic; with --hosts "
                   "pf-appliance)")
    boot_options.add_arguments(p, ("image",))
    p.add_argument("--sizes", help=f"transfer sizes of the captured rows (default {SIZES}; --hosts {HOSTS_SIZES})")
    p.add_argument("--bytes", help=f"bytes per captured row (default 1M; --hosts {HOSTS_BYTES})")
    p.add_argument("--span", help=f"region the captured rows use (default 8M; --hosts {HOSTS_SPAN} per host)")
    p.add_argument("--load", type=argtypes.positive, default=1.0, help="offered load per host in PF ports (default 1.0)")
    p.add_argument("--all-to-all-load", type=argtypes.positive, default=bench_model.HOST_LINK_LOAD,
                   help=f"a second all-to-all load (default {bench_model.HOST_LINK_LOAD:g}: the host's "
                   f"{bench_model.HOST_LINK_GBS:g} GB/s link)")
    p.add_argument("--curve-loads", type=argtypes.loads_list, default=argtypes.loads_list(
        "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0"), help="loads for the electrical knee (default 0.1 to 1.0)")
    args = p.parse_args(argv)
    console = Console(width=200)
    try:
        report = run(args)
    except PfcxlError as exc:
        print(f"bench_paper_bw: {exc}", file=sys.stderr)
        return exc.exit_code
    for t in tables(report):
        console.print(t)
    if report.get("appliance"):
        a = report["appliance"]
        console.print(f"capture: {report['captured_records']} records of {report['hosts']} guests; the live appliance "
                      f"modelled {a['records']} ({a['unmapped']} unmapped), largest ring fill "
                      f"{a['rings']['largest_fill']} of {a['rings']['capacity']}, dropped {a['rings']['dropped']}")
    console.print(f"report: {Path(args.out) / 'paper_bw.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
