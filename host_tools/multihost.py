"""Several emulated hosts on one appliance at once: `pfcxl multihost -n N -- CMD`.

Every host is a QEMU guest attached to the appliance under its own host id. All guests boot at
the same time, the command runs in all of them at the same time (with {host} and {hosts}
replaced), and the outputs come back per host. Everything started here is torn down here, and
a temporary appliance dies with this process however it ends (even by SIGKILL), taking its run
directory, with the hosts' logs in it, along.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from pfcxl.device.topology import Topology
from pfcxl.errors import PfcxlError

from pfcxl.machine import Machine

from . import appliance
from .console import shell_command


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
    """(run directory, temporary?) of a running appliance for `topo`: the given or default one
    if it is up, else a temporary one started here and stopped afterwards."""
    where = appliance_dir or appliance.default_dir(topo)
    if appliance.running_pid(where) is not None:
        yield where, False
        return
    if appliance_dir is not None:
        raise PfcxlError(f"no appliance is running in {appliance_dir}")
    tmp = Path(tempfile.mkdtemp(prefix="pfcxl-appliance-"))
    say(f"starting a temporary appliance in {tmp}")
    try:
        appliance.start(topo, topo_path, tmp, temporary=True)      # it removes tmp as it exits
        yield tmp, True
    finally:
        appliance.stop(tmp)
        shutil.rmtree(tmp, ignore_errors=True)                     # if it never started


def check_incarnation(where: Path, att: appliance.Attachment, say: Callable[[str], None]) -> str | None:
    """Whether the appliance restarted while the hosts ran: said if it kept the pool, an error if
    the hosts' memory is not its pool any more."""
    try:
        with appliance.Client(where, timeout=10) as c:
            now = c.call("hello")["appliance"]
    except PfcxlError as exc:
        return f"the appliance is gone after the run: {exc}"
    if now["incarnation"] == att.incarnation:
        return None
    change = f"the appliance restarted during the run (incarnation {att.incarnation} -> {now['incarnation']})"
    if now["pool_id"] == att.pool_id:
        say(f"{change}; it re-attached the same pool memory")
        return None
    return f"{change} with new memory: the hosts' writes are not in its pool"


def run(topo: Topology, topo_path: Path, hosts: int, command: str | Sequence[str], *, run_dir: Path | None = None,
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
    results: dict[int, HostResult] = {}
    with contextlib.ExitStack() as stack:
        where, temporary = stack.enter_context(appliance_for(topo, topo_path, appliance_dir, say))
        if run_dir is None:       # the hosts' logs: where a temporary appliance removes them as it dies
            run_dir = where / "hosts" if temporary else Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="pfcxl-multihost-")))
        vms: list[tuple[int, Machine, float, int]] = []
        prebuilt = None
        for h in range(hosts):
            vm = Machine(topo, host=h, appliance=where, run_dir=run_dir / f"host{h}", name=f"host{h}",
                         ready_timeout=ready_timeout, prebuilt=prebuilt)
            stack.callback(vm.close)
            vm.launch()
            prebuilt = vm.boot_image()
            vms.append((h, vm, time.monotonic(), vm.attachment.port))
        say(f"{hosts} guests launched; waiting for them to be ready")
        ready: list[tuple[int, Machine, int]] = []
        for h, vm, started, port in vms:
            try:
                vm.wait_ready()
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
        if hosts:
            lost = check_incarnation(where, vms[-1][1].attachment, say)
            for r in results.values():
                r.error = r.error or lost
    return [results[h] for h in sorted(results)]
