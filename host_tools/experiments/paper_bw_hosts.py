"""The paper's bandwidth experiment from N real guests: `bench_paper_bw --hosts N`.

Capture: `multihost` boots N guests on a temporary pf-appliance whose service times every host
(`--fabric pf`) and keeps what it drains (`--capture`, device/trace/capture.py). Each guest runs
the `bandwidth` benchmark twice on the shared pool's DAX device with `--mark-rows 1` (each row one
plugin phase; the phase events cut each host's records into rows):
  own module  `--stripe G,N,h`: only granule h of every N granules of the pool's interleave (G
              bytes, N modules), so every access of host h lands on module h, as in the paper;
  all-to-all  a contiguous span, the walk started h granules in (`--rotate h*G`): every host
              crosses every module, each on a different one at a time.
The rows are few (seq and random reads at a couple of sizes, a few MiB) so sixteen guests finish
in minutes on two cores. The streams are then replayed at full load with bench_paper_bw's code
(every host offers --load PF ports, evenly by bytes in its captured order), so the figures are
modelled, from the addresses, sizes and order the guests issued; never guest time.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from pfcxl.device.fabric import systems as fabric_systems
from pfcxl.device.trace import capture as trace_capture
from pfcxl.device.topology.address_map import interleave
from pfcxl.errors import PfcxlError
from pfcxl.guest.tool_output import json_lines, tool_prefix

from pfcxl.host_tools.bench import model as bench_model
from pfcxl.host_tools.timing import model_runs
from pfcxl.host_tools.fleet import multihost
from pfcxl.host_tools.timing import config as timing

TARGET = "/dev/dax0.0"          # the shared pool region of pf-appliance (region0)
ROWS_FILE = "hosts_rows.json"
STATS_FILE = "appliance_stats.json"      # the live appliance's own figures: records, unmapped, ring fill


def command(app, *, sizes: str, nbytes: str, span: str) -> str:
    """Each guest's command ({host} is replaced by multihost): own-module rows, then all-to-all."""
    common = (f"bandwidth --target {TARGET} --pattern seq,random --op read --sizes {sizes} --threads 1 "
              f"--bytes {nbytes} --span {span} --mark-rows 1")
    return (f"{common} --stripe {app.granularity},{app.modules},{{host}} && "
            f"{common} --rotate $(({{host}} * {app.granularity}))")


def _rows(output: str, host: int) -> list[dict]:
    """The two bandwidth runs' rows of one host, own-module first."""
    runs = json_lines(output, tool_prefix("bandwidth"), what=f"host {host}'s bandwidth output")
    if len(runs) != 2:
        raise PfcxlError(f"host {host}: {len(runs)} bandwidth outputs, expected 2: {output.strip()[-300:]}")
    return [{k: r[k] for k in ("pattern", "op", "size")} | {"layout": layout}
            for layout, run in zip(("own_module", "all_to_all"), runs) for r in run["results"]]


def check(topo, hosts: int):
    """The topology's appliance, if it gives each of `hosts` guests a module of its own."""
    app = topo.appliance
    if app is None:
        raise PfcxlError(f"topology '{topo.name}' has no [appliance] section: --hosts needs one, e.g. pf-appliance")
    if not 1 <= hosts <= min(app.ports, app.modules):
        raise PfcxlError(f"--hosts {hosts}: 1 to {min(app.ports, app.modules)} (one module per host)")
    return app


def capture(topo, topo_path: Path, hosts: int, out: Path, *, sizes: str, nbytes: str, span: str,
            say=print) -> Path:
    """Boot `hosts` guests, run the rows, keep the capture in out/capture and the rows of every
    host in out/hosts_rows.json; the capture directory."""
    app = check(topo, hosts)
    out.mkdir(parents=True, exist_ok=True)
    folder = out / "capture"
    if (folder / trace_capture.MANIFEST).exists():
        shutil.rmtree(folder)                   # this bench's own earlier capture
    figures: dict = {}
    results = multihost.run(topo, topo_path, hosts, command(app, sizes=sizes, nbytes=nbytes, span=span),
                            fabric="pf", issue="independent", capture=folder, say=say, telemetry=figures.update,
                            host_done=lambda r: say(f"host {r.host}: exit {r.status} {r.error or ''}"))
    bad = [r for r in results if r.error or r.status != 0]
    if bad:
        raise PfcxlError(f"hosts {', '.join(str(r.host) for r in bad)} failed: "
                         f"{(bad[0].error or bad[0].output.strip())[-300:]}")
    rows = {r.host: _rows(r.output, r.host) for r in results}
    (out / STATS_FILE).write_text(json.dumps({k: figures.get(k) for k in ("records", "unmapped", "rings", "error")},
                                             indent=1))
    (out / ROWS_FILE).write_text(json.dumps({"hosts": rows}, indent=1))
    return folder


def load(out: Path) -> tuple[dict, dict]:
    """(capture, rows per host) of an earlier --hosts run in `out`."""
    got = trace_capture.read_capture(out / "capture")
    try:
        rows = {int(h): r for h, r in json.loads((out / ROWS_FILE).read_text())["hosts"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PfcxlError(f"{out / ROWS_FILE}: not a --hosts run's row list ({exc})") from exc
    if sorted(rows) != sorted(got["hosts"]):
        raise PfcxlError(f"{out}: rows for hosts {sorted(rows)} but records for {sorted(got['hosts'])}")
    return got, rows


def appliance_figures(out: Path) -> dict | None:
    """What the live appliance said of the capture run (records modelled, unmapped, ring fill), if kept."""
    try:
        return json.loads((out / STATS_FILE).read_text())
    except (OSError, ValueError):
        return None


def streams(got: dict, rows: dict) -> dict[tuple, dict[str, np.ndarray]]:
    """(pattern, op, size) -> layout -> every host's records of that row (host = its id, one
    common stamp: replay spreads them evenly by bytes in captured order)."""
    out: dict[tuple, dict[str, list]] = {}
    for host, cap in sorted(got["hosts"].items()):
        if cap["phases"] is None:
            raise PfcxlError(f"host {host}: the capture has no phase list, so its rows cannot be cut")
        pieces = timing.split_rows(cap["records"], cap["phases"])
        if len(pieces) != len(rows[host]):
            raise PfcxlError(f"host {host}: {len(pieces)} captured phases for {len(rows[host])} rows")
        for row, piece in zip(rows[host], pieces):
            tr = bench_model.even(piece)
            tr["host"] = host
            out.setdefault((row["pattern"], row["op"], row["size"]), {}).setdefault(row["layout"], []).append(tr)
    return {key: {layout: np.concatenate(parts) for layout, parts in by.items()} for key, by in out.items()}


def on_own_module(tr: np.ndarray, topo) -> float:
    """Share of the records that land on the module numbered as their host."""
    base, _ = model_runs.placement(topo)
    app = fabric_systems.appliance_for(topo)
    module = interleave((tr["hpa"] - np.uint64(base)).astype(np.int64), app.granularity, app.modules)[0]
    return float(np.mean(module == tr["host"])) if len(tr) else 0.0
