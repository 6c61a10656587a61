"""N timed guests on one temporary pf-appliance that keeps a timeline, for the experiments that
measure the timeline with real guests (timeline_overhead.py, paper_bw_guests.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Iterator

from pfcxl.appliance import Appliance
from pfcxl.device.appliance import timeline
from pfcxl.host_tools.vm.boot_options import BootOptions
from pfcxl.machine import Machine

TOPOLOGY = "pf-appliance"


@contextlib.contextmanager
def timed_fleet(hosts: int, options: BootOptions, quantum_ns: int,
                name: str = "t") -> Iterator[tuple[list[Machine], Path]]:
    """Hosts 0..hosts-1 booted side by side with `options` (clock virtual), each with its own run
    directory; (the ready machines, the timeline file). Everything is gone afterwards."""
    with tempfile.TemporaryDirectory(prefix="pfcxl-fleet-") as tmp, \
            Appliance(TOPOLOGY, quantum_ns=quantum_ns, temporary=True) as app, contextlib.ExitStack() as stack:
        machines = []
        started = time.monotonic()
        for h in range(hosts):
            m = Machine(TOPOLOGY, name=f"{name}{h}", options=dataclasses.replace(
                options, host=h, appliance=str(app.directory), run_dir=str(Path(tmp) / f"{name}{h}")))
            stack.callback(m.close)
            m.launch()
            machines.append(m)
        for m in machines:
            m.wait_ready()
        print(f"{hosts} timed guests ready in {time.monotonic() - started:.1f} s wall", flush=True)
        yield machines, timeline.path_in(app.directory)
