"""Timed guests in one timeline: N of them booted on one temporary pf-appliance that keeps it
(timed_fleet), a round of commands started together (run_round), and the offline engine's replay
of a round's traced requests, every host's together (offline_latency_ns). The experiments that
measure the timeline with real guests (timeline_overhead.py, paper_bw_guests.py), the guests'
loaded-latency curve (host_tools/bench/virtual_loaded.py) and tests/integration/test_timeline.py
use them."""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from pfcxl.appliance import Appliance
from pfcxl.device.appliance import timeline
from pfcxl.device.fabric import engine
from pfcxl.device.fabric import systems as fabric_systems
from pfcxl.device.topology import address_map
from pfcxl.errors import PfcxlError
from pfcxl.host_tools.timing import vtime
from pfcxl.host_tools.timing.config import plugin_events, plugin_log
from pfcxl.host_tools.timing.traced_run import TracedRun
from pfcxl.host_tools.vm.boot_options import BootOptions
from pfcxl.machine import Machine

TOPOLOGY = "pf-appliance"


@contextlib.contextmanager
def timed_fleet(hosts: int, options: BootOptions, quantum_ns: int, name: str = "t",
                say: Callable[[str], None] = print,
                topology: str = TOPOLOGY) -> Iterator[tuple[list[Machine], Path]]:
    """Hosts 0..hosts-1 booted side by side with `options` (clock virtual), each with its own run
    directory; (the ready machines, the timeline file). Everything is gone afterwards."""
    with tempfile.TemporaryDirectory(prefix="pfcxl-fleet-") as tmp, \
            Appliance(topology, quantum_ns=quantum_ns, temporary=True) as app, contextlib.ExitStack() as stack:
        machines = []
        started = time.monotonic()
        for h in range(hosts):
            m = Machine(topology, name=f"{name}{h}", options=dataclasses.replace(
                options, host=h, appliance=str(app.directory), run_dir=str(Path(tmp) / f"{name}{h}")))
            stack.callback(m.close)
            m.launch()
            machines.append(m)
        for m in machines:
            m.wait_ready()
        say(f"{hosts} timed guests ready in {time.monotonic() - started:.1f} s wall")
        yield machines, timeline.path_in(app.directory)


def bracketed(command: str, align_ms: int = 20) -> str:
    """`command` in a phase that starts on an `align_ms` mark of the guest's clock: on the same point
    of its tick (pfcxl_mark --align), wherever the host's speed put the typed command."""
    return (f"pfcxl_mark start --align {align_ms} >/dev/null; {command}; rc=$?; pfcxl_mark stop >/dev/null; "
            "exit $rc")


def run_round(machines: list[Machine], path: Path, commands: list[str], timeout: float = 600) -> list[TracedRun]:
    """One round of the timeline: commands[h] on machines[h], all started together, each in a phase
    of its own (bracketed), the round waiting for all of them to join; their traced runs. A command
    that fails is a PfcxlError naming it."""
    timeline.expect(path, len(commands))
    started = [(m, m.start_traced(bracketed(c), timeout, bracket=False)) for m, c in zip(machines, commands)]
    runs = [m.finish_traced(s, timeout) for m, s in started]
    for m, c, run in zip(machines, commands, runs):
        if run.result.status != 0:
            raise PfcxlError(f"{m.name}: `{c}` exited {run.result.status}: {run.result.output.strip()[-300:]}")
    return runs


def offline_latency_ns(machines: list[Machine], runs: list[TracedRun], fabric: str,
                       what_if: tuple[str, ...] = (), host: int = 0, last: int | None = None) -> float:
    """The offline engine's mean read latency (ns) for `host`'s last `last` reads of a round (all of
    them when None), replaying every host's traced requests of the round together on the timeline's
    clock (each host's own clock less the offset it joined at, from its plugin's log)."""
    parts = []
    for m, run in zip(machines, runs):
        if run.records is None or m.run_dir is None:
            raise PfcxlError(f"{m.name}: the round has no records to replay (boot with timing='trace')")
        joined = [e for e in plugin_events(plugin_log(m.run_dir, m.name)) if e.get("event") == "timeline"]
        if not joined:
            raise PfcxlError(f"{m.name}: its plugin never joined the timeline (booted with clock='virtual'?)")
        records = run.records.copy()
        records["insn"] = (records["insn"].astype(np.int64) - round(joined[-1]["offset_ns"])).astype(np.uint64)
        records["host"] = m.host
        parts.append(records)
    trace = np.concatenate(parts)
    trace = trace[np.argsort(trace["insn"], kind="stable")]
    topo = machines[0].topology
    model = vtime.fabric_for(topo, fabric, vtime.params(what_if))
    result = engine.run(model, trace, base_hpa=address_map.dax_placements(topo)[0].base,
                        granularity=fabric_systems.appliance_for(topo).granularity)
    reads = np.flatnonzero((trace["host"] == host) & (trace["write"] == 0))
    chosen = reads if last is None else reads[-last:]
    return float(result.latency_ns[chosen].mean())
