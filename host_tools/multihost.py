"""Several emulated hosts on one appliance at once: `pfcxl multihost -n N -- CMD`.

Every host is a QEMU guest attached to the appliance under its own host id. All guests boot at
the same time, the command runs in all of them at the same time (with {host} and {hosts}
replaced), and the outputs come back per host. Everything started here is torn down here.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from pfcxl.device.topology import Topology
from pfcxl.errors import PfcxlError

from . import appliance, image
from .console import shell_command
from .vm import VM


@dataclass
class HostResult:
    host: int
    port: int
    ready_seconds: float
    status: int | None          # None: the host failed before the command finished
    output: str
    error: str | None = None


def expand(command: str | Sequence[str], host: int, hosts: int) -> str:
    """The command for one host: as in `pfcxl run` (a string is shell, a list argv), with {host}
    and {hosts} replaced in each word before it is quoted."""
    return shell_command(command, {"{hosts}": str(hosts), "{host}": str(host)})


@contextlib.contextmanager
def appliance_for(topo: Topology, topo_path: Path, appliance_dir: Path | None, say: Callable[[str], None]):
    """The run directory of a running appliance for `topo`: the given or default one if it is up,
    else a temporary one started here and stopped afterwards."""
    where = appliance_dir or appliance.default_dir(topo)
    if appliance.running_pid(where) is not None:
        yield where
        return
    if appliance_dir is not None:
        raise PfcxlError(f"no appliance is running in {appliance_dir}")
    with tempfile.TemporaryDirectory(prefix="pfcxl-appliance-") as tmp:
        say(f"starting a temporary appliance in {tmp}")
        appliance.start(topo, topo_path, Path(tmp))
        try:
            yield Path(tmp)
        finally:
            appliance.stop(Path(tmp))


def run(topo: Topology, topo_path: Path, hosts: int, command: str | Sequence[str], *, run_dir: Path,
        appliance_dir: Path | None = None, ready_timeout: float = 600, command_timeout: float = 900,
        say: Callable[[str], None] = lambda m: None,
        host_done: Callable[[HostResult], None] = lambda r: None) -> list[HostResult]:
    if not any(d.appliance for d in topo.devices):
        raise PfcxlError(f"topology '{topo.name}' has no devices served by the appliance "
                         "(appliance = \"shared\"/\"private\"); multihost needs one, e.g. pf-appliance")
    if hosts < 1:
        raise PfcxlError(f"{hosts} hosts: multihost needs at least 1")
    if topo.appliance is not None and hosts > topo.appliance.ports:
        raise PfcxlError(f"{hosts} hosts but the appliance has {topo.appliance.ports} ports")
    img = image.build(topo)
    results: dict[int, HostResult] = {}
    with contextlib.ExitStack() as stack:
        where = stack.enter_context(appliance_for(topo, topo_path, appliance_dir, say))
        client = stack.enter_context(appliance.Client(where))
        vms: list[tuple[int, VM, float, int]] = []
        for h in range(hosts):
            att = client.attach(h)
            fds = {d.id: att.region(d.appliance).fd for d in topo.devices if d.appliance}
            vm = VM(topo, img, run_dir / f"host{h}", name=f"host{h}", appliance_fds=fds)
            stack.callback(vm.shutdown)
            vm.launch()
            vms.append((h, vm, time.monotonic(), att.port))
        say(f"{hosts} guests launched; waiting for them to be ready")
        ready: list[tuple[int, VM, int]] = []
        for h, vm, started, port in vms:
            try:
                vm.wait_ready(ready_timeout)
            except PfcxlError as exc:
                results[h] = HostResult(h, port, time.monotonic() - started, None, "", str(exc))
                host_done(results[h])
                continue
            results[h] = HostResult(h, port, time.monotonic() - started, None, "")
            ready.append((h, vm, port))
        say(f"{len(ready)} of {hosts} guests ready; running the command in each")
        started_cmds = [(h, vm, vm.start_command(expand(command, h, hosts))) for h, vm, _ in ready]
        for h, vm, token in started_cmds:
            try:
                done = vm.finish_command(token, command_timeout)
                results[h].status, results[h].output = done.status, done.output
            except PfcxlError as exc:
                results[h].error = str(exc)
            host_done(results[h])
    return [results[h] for h in sorted(results)]
