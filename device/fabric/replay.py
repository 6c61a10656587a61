"""Replay a captured trace (one guest or many) on a fabric model at a chosen offered load.

A stream is one host's records. Replay keeps every stream's addresses, sizes, reads and writes
and order, and changes only when its accesses issue:

* `dilate=X` multiplies every stream's issue times (from its first access) by X.
* `load=L` rescales each stream on its own so that it offers L x the photonic fabric's port
  bandwidth (fabric_constants.PF_PORT_BANDWIDTH_MBS, 25.6 GB/s) on average: its issue gaps keep
  their proportions and its last access issues when the bytes before it would have left at that
  rate. A stream issued all at once (equal stamps) is spread evenly by bytes. The same offered
  load is replayed on every system, so the PF appliance, the electrical pool and DRAM are compared
  on one scale: load 1.0 is what fills one PF port.

The result is an EngineResult of the chosen model plus the offered rate; per-port (per queue)
achieved bandwidth and utilisation come from its stage statistics.
"""

from __future__ import annotations

import numpy as np

from pfcxl.device.fabric import constants as fc
from pfcxl.device.fabric import engine as fabric_engine
from pfcxl.device.fabric.model import FabricModel
from pfcxl.device.trace.records import LINE

PS_PER_STAMP = 0.001        # replayed records carry picosecond stamps (ns_per_insn for the engine)
MAX_SPAN_PS = 1 << 62       # the engine times in int64 ps: a replayed stream spans at most 2^62 ps (53 days)


def check_captured(records: np.ndarray, base_hpa: int, end_hpa: int) -> None:
    """ValueError naming the first record a capture cannot hold: the plugin writes one record per
    64-byte line it saw touched, inside the CXL window [base_hpa, end_hpa), of 1 to 64 bytes
    (device/plugin/pfcxl_plugin.c), a load (0) or a store (1)."""
    rules = (((records["size"] < 1) | (records["size"] > LINE), "size", "1 to 64 bytes (the bytes touched in one line)"),
             (records["hpa"] % LINE != 0, "hpa", "a 64-byte line's address"),
             ((records["hpa"] < base_hpa) | (records["hpa"] >= end_hpa), "hpa",
              f"inside the CXL window [{base_hpa:#x}, {end_hpa:#x})"),
             (records["write"] > 1, "write", "0 (load) or 1 (store)"))
    for bad, field, rule in rules:
        if bad.any():
            i = int(np.argmax(bad))
            value = records[field][i]
            shown = f"{int(value):#x}" if field == "hpa" else str(int(value))
            raise ValueError(f"record {i}: {field} {shown} is not {rule}, as a captured trace holds")


@np.errstate(over="ignore", invalid="ignore")        # an overflow is refused at the end
def respace(records: np.ndarray, *, ns_per_insn: float = 1.0, load: float | None = None,
            dilate: float | None = None) -> np.ndarray:
    """A copy of `records` with picosecond issue stamps for the offered `load` or the `dilate`
    factor (exactly one of them; see the module docstring). Order is kept."""
    if (load is None) == (dilate is None):
        raise ValueError("give exactly one of load and dilate")
    factor = load if load is not None else dilate
    if not factor > 0:
        raise ValueError(f"{'load' if load is not None else 'dilate'} {factor}: must be positive")
    out = records.copy()
    t = records["insn"].astype(np.float64) * (ns_per_insn * 1000)
    new = np.empty(len(records), np.float64)
    for h in np.unique(records["host"]):
        idx = np.flatnonzero(records["host"] == h)
        ts = t[idx] - t[idx].min()
        if dilate is not None:
            new[idx] = ts * dilate
            continue
        ps_per_byte = 1e6 / (load * fc.PF_PORT_BANDWIDTH_MBS)
        size = np.maximum(records["size"][idx], 1).astype(np.float64)
        before_last = float(size.sum() - size[-1]) * ps_per_byte     # when the last one issues
        span = float(ts.max()) if len(ts) else 0.0
        if span > 0:
            new[idx] = ts * (before_last / span)
        else:                                                          # all at once: evenly by bytes
            new[idx] = (np.cumsum(size) - size) * ps_per_byte
    if len(new) and not new.max() < MAX_SPAN_PS:            # also NaN (infinite stamps)
        what = f"load {load:g}" if load is not None else f"dilate {dilate:g}"
        raise ValueError(f"{what} (ns per instruction {ns_per_insn:g}) stretches a stream past the 2^62 ps "
                         "(53 days) the model can time: use a larger load or a smaller dilation")
    out["insn"] = np.rint(new).astype(np.uint64)
    return out


def replay(model: FabricModel, records: np.ndarray, *, base_hpa: int, granularity: int,
           ns_per_insn: float = 1.0, load: float | None = None, dilate: float | None = None,
           seed: int = 1) -> fabric_engine.EngineResult:
    """Time `records` on `model` at the offered load (independent issue: a stream at a fixed load
    does not wait for its own accesses)."""
    timed = respace(records, ns_per_insn=ns_per_insn, load=load, dilate=dilate)
    order = np.argsort(timed["insn"], kind="stable")
    return fabric_engine.run(model, timed[order], ns_per_insn=PS_PER_STAMP, base_hpa=base_hpa,
                             granularity=granularity, seed=seed)


def port_rates(result: fabric_engine.EngineResult) -> dict[str, dict]:
    """Per stage: achieved GB/s and utilisation of every queue that carried bytes, over the run's
    window (first issue to last completion)."""
    out = {}
    for name, st in result.stages.items():
        used = np.flatnonzero(st.bytes > 0)
        out[name] = {"queues": used.tolist(), "gbs": st.achieved_gbs[used].tolist(),
                     "utilisation": st.utilisation[used].tolist(), "bandwidth_gbs": st.bandwidth_mbs / 1000}
    return out


def curve(model: FabricModel, records: np.ndarray, loads, *, base_hpa: int, granularity: int,
          ns_per_insn: float = 1.0) -> list[dict]:
    """Latency against bandwidth, Intel MLC / Mess style: per offered load, the offered and the
    achieved GB/s over all hosts and the read (else write) latency p50 and p99 in ns."""
    hosts = len(np.unique(records["host"]))
    total = int(np.maximum(records["size"], 1).sum())
    points = []
    for load in loads:
        r = replay(model, records, base_hpa=base_hpa, granularity=granularity, ns_per_insn=ns_per_insn, load=load)
        p = r.percentiles("read") if np.count_nonzero(~r.write) else r.percentiles("write")
        points.append({"load": load, "offered_gbs": hosts * load * fc.PF_PORT_BANDWIDTH_MBS / 1000,
                       "achieved_gbs": total / max(r.window_ps, 1) * 1000, "p50_ns": p["p50"], "p99_ns": p["p99"]})
    return points


def knee(points: list[dict], *, keep: float = 0.95) -> dict | None:
    """The first point whose achieved bandwidth falls below `keep` of what was offered: where the
    system stops carrying its load (None: it carried every load)."""
    return next((p for p in points if p["achieved_gbs"] < keep * p["offered_gbs"]), None)


def as_lines(records: np.ndarray) -> np.ndarray:
    """The records as the fabric carries them: a CPU moves whole 64-byte lines over CXL, whatever
    part of the line the program touched (the plugin's size is the bytes it touched)."""
    lines = records.copy()
    lines["size"] = LINE
    return lines
