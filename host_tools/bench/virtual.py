"""`pfcxl bench --clock virtual`: idle latency and bandwidth measured by the guest in its own
clock, which under the timed QEMU carries the modelled cache and fabric latencies
(host_tools/timing/vtime.py), beside the offline engine's figures for the very requests the plugin
captured. One boot measures every fabric: each chase selects its fabric with --profile K.

Per fabric: a cold dependent chase (each load one line, caches emptied first: the read latency),
non-temporal stores (each waits for its write: the write latency) and a sequential read of one
load per line (bandwidth). Local DRAM: the same cold chase in ordinary guest RAM.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from pfcxl.device.fabric import constants as fc
from pfcxl.device.fabric import engine as fabric_engine
from pfcxl.device.fabric import systems as fabric_systems
from pfcxl.device.topology import Topology, address_map
from pfcxl.errors import PfcxlError
from pfcxl.guest.tool_output import tool_json
from pfcxl.host_tools.timing import vtime

LINES = 5000
SPAN = "64M"
STREAM_LOADS = 80000
COLD = f"chase --cold --lines {LINES} --span {SPAN} --loads {LINES}"
WRITE = f"chase --write --cold --lines {LINES} --span {SPAN} --loads {LINES}"
STREAM = f"chase --stream --cold --span {SPAN} --loads {STREAM_LOADS}"
LABEL = "measured in guest (virtual time)"


def _chase(machine, command: str) -> tuple[dict, np.ndarray | None]:
    traced = machine.traced_run(command, timeout=1800)
    if traced.result.status != 0:
        raise PfcxlError(f"`{command}` in the timed guest exited {traced.result.status}: "
                         f"{traced.result.output.strip()[-300:]}")
    return tool_json(traced.result.output, "chase", what=command), traced.records


def _model(topo: Topology, fabric: str, records: np.ndarray | None, write: bool) -> float | None:
    """The offline engine's median latency (ns) of the run's last LINES requests of one direction (the
    timed accesses: the cold start's write-backs come before them), every captured request issued
    when the plugin issued it."""
    if records is None or not len(records):
        return None
    placements = address_map.dax_placements(topo)
    result = fabric_engine.run(vtime.fabric_for(topo, fabric), records, base_hpa=placements[0].base,
                               granularity=fabric_systems.appliance_for(topo).granularity)
    chosen = result.latency_ns[result.write == write][-LINES:]
    return float(np.median(chosen)) if len(chosen) else None


def run(machine, topo: Topology, say: Callable[[str], None] = lambda m: None) -> dict:
    """Every figure of the virtual-time benchmark, from a Machine booted with clock="virtual" and
    timing="trace"."""
    rows = []
    for k, fabric in enumerate(vtime.FABRICS):
        say(f"{fabric}: cold chase, non-temporal stores, sequential read")
        read, read_records = _chase(machine, f"{COLD} --profile {k}")
        write, write_records = _chase(machine, f"{WRITE} --profile {k}")
        stream, _ = _chase(machine, f"{STREAM} --profile {k}")
        rows.append({"system": fabric, "label": fabric_systems.LABELS[fabric],
                     "read_ns": read["p50_ns_per_load"], "write_ns": write["p50_ns_per_load"],
                     "seq_read_gbs": 64 / stream["p50_ns_per_load"],
                     "model_read_ns": _model(topo, fabric, read_records, False),
                     "model_write_ns": _model(topo, fabric, write_records, True),
                     "idle_read_ns": vtime.expected_idle_ns(topo, fabric),
                     "idle_write_ns": vtime.expected_idle_ns(topo, fabric, write=True),
                     "bound_gbs": vtime.sequential_bound_gbs(topo, fabric)})
    say("local DRAM: cold chase")
    local, _ = _chase(machine, f"{COLD} --local")
    rows.append({"system": "local", "label": fabric_systems.LABELS["local"], "read_ns": local["p50_ns_per_load"],
                 "write_ns": None, "seq_read_gbs": None, "model_read_ns": None, "model_write_ns": None,
                 "idle_read_ns": fc.LOCAL_DDR5_NS, "idle_write_ns": None, "bound_gbs": None})
    return {"clock": "virtual", "label": LABEL, "rows": rows,
            "notes": ["read/write ns: the median per access over 64-access batches of a cold chase (reads) "
                      "and of non-temporal stores (writes), in the guest's own clock; the stores' figure "
                      "includes the loop's few instructions (1 ns each)",
                      "model: the offline engine's median over the timed requests the plugin captured in "
                      "that run; idle: the fabric model's idle 64-byte latency",
                      "seq read: one 8-byte load per line in address order, the median of 1024-load "
                      "batches; bound: "
                      "the narrowest read stage or outstanding misses x 64 B / idle latency (Little's law)"]}


def table(report: dict):
    """The report as a rich table."""
    from rich.table import Table
    t = Table(title=f"Idle latency and bandwidth {LABEL}, beside the model", title_justify="left")
    for col in ("system", "read ns (guest)", "read ns (model)", "idle read", "write ns (guest)",
                "write ns (model)", "idle write", "seq read GB/s (guest)", "bound GB/s"):
        t.add_column(col, justify="left" if col == "system" else "right")

    def f(x, digits=1):
        return "-" if x is None else f"{x:,.{digits}f}"

    for r in report["rows"]:
        t.add_row(r["label"], f(r["read_ns"]), f(r["model_read_ns"]), f(r["idle_read_ns"], 0), f(r["write_ns"]),
                  f(r["model_write_ns"]), f(r["idle_write_ns"], 0), f(r["seq_read_gbs"], 2), f(r["bound_gbs"], 2))
    return t
