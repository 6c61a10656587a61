"""Several emulated hosts on one appliance at once: `pfcxl multihost -n N -- CMD`.

Every host is a QEMU guest attached to the appliance under its own host id. At most two guests
per host CPU boot at a time (TCG boots are mostly CPU-bound: more at once only share the cores
and each takes longer); the next starts as soon as one is ready. A ready guest is paused (QMP
stop) until the last one is ready: an idle TCG guest still takes ~2% of a CPU for its timer ticks,
which the boots need. The command then runs in all of them at the same time (with {host} and
{hosts} replaced), and the outputs come back per host. Everything started here is torn down here, and
a temporary appliance dies with this process however it ends (even by SIGKILL), taking its run
directory, with the hosts' logs in it, along.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from pfcxl.device.appliance import timeline
from pfcxl.renamed import renamed
from pfcxl.device.trace import capture as trace_capture
from pfcxl.device.topology import Topology
from pfcxl.errors import PfcxlError

from pfcxl.appliance import Appliance
from pfcxl.machine import Machine

from pfcxl.host_tools import appliance_client as appliance, timeouts
from pfcxl.host_tools.vm.boot_options import BootOptions
from pfcxl.host_tools.vm.console import shell_command
from pfcxl.process import cpu_seconds
from pfcxl.host_tools.timing.config import plugin_events, plugin_log


@dataclass
class HostResult:
    host: int
    port: int
    ready_seconds: float
    status: int | None          # None: the host failed before the command finished
    data: bytes                 # the command's output, byte for byte
    error: str | None = None
    cpu_seconds: float | None = None    # QEMU's CPU time from launch to ready

    @property
    def output(self) -> str:
        """The output as text (bytes that are not UTF-8 become U+FFFD)."""
        return self.data.decode(errors="replace")


def expand(command: str | Sequence[str], host: int, hosts: int) -> str:
    """The command for one host: as in `pfcxl run` (a string is shell, a list argv), with {host}
    and {hosts} replaced in each word before it is quoted."""
    return shell_command(command, {"{hosts}": str(hosts), "{host}": str(host)})


@contextlib.contextmanager
def appliance_for(topo: Topology, topo_path: Path, appliance_dir: Path | None, say: Callable[[str], None],
                  fabric: str | None = None, issue: str = "dependent", capture: Path | None = None,
                  quantum_ns: int | None = None):
    """(run directory, temporary?) of a running appliance for `topo`: the given or default one
    if it is up, else a temporary one started here and stopped afterwards. With `fabric`, the
    appliance must model the hosts' traffic: a temporary one is started so, a running one must be.
    With `capture` it keeps what it drains there: a running one must already do so. With
    `quantum_ns` a temporary one keeps a timeline for timed hosts (a running one has its own, or none)."""
    running = Appliance(topo_path, run_dir=appliance_dir or appliance.default_dir(topo), fabric=fabric,
                        issue=issue, capture=capture)
    if running.running_pid() is not None:
        running.check_running()               # it times (and captures) as asked; left running
        yield running.directory, False
        return
    if appliance_dir is not None:
        raise PfcxlError(f"no appliance is running in {appliance_dir}")
    tmp = Path(tempfile.mkdtemp(prefix="pfcxl-appliance-"))
    say(f"starting a temporary appliance in {tmp}")
    # temporary: it dies with this process however it ends, and removes tmp as it exits
    with Appliance(topo_path, run_dir=tmp, fabric=fabric, issue=issue, capture=capture, quantum_ns=quantum_ns,
                   temporary=True):
        yield tmp, True


def check_incarnation(topo_path: Path, where: Path, att: appliance.Attachment,
                      say: Callable[[str], None]) -> str | None:
    """Whether the appliance restarted while the hosts ran: said if it kept the pool, an error if
    the hosts' memory is not its pool any more."""
    try:
        now = Appliance(topo_path, run_dir=where).call("hello", timeout=10)["appliance"]
    except PfcxlError as exc:
        return f"the appliance is gone after the run: {exc}"
    if now["incarnation"] == att.incarnation:
        return None
    change = f"the appliance restarted during the run (incarnation {att.incarnation} -> {now['incarnation']})"
    if now["pool_id"] == att.pool_id:
        say(f"{change}; it re-attached the same pool memory")
        return None
    return f"{change} with new memory: the hosts' writes are not in its pool"


def _phases(vm: Machine) -> list[dict]:
    """The plugin's finished phases of one host, from its log."""
    where = vm.run_dir or vm.run_dir_arg
    if where is None:                          # never started: no log
        return []
    return [e for e in plugin_events(plugin_log(where, vm.name)) if e.get("event") == "phase"]


def _fresh_timeline(where: Path, hosts: int, quantum_ns: int | None, say: Callable[[str], None]) -> None:
    """The appliance's timeline, made afresh for this run: its hosts start at time 0 together."""
    path = timeline.path_in(where)
    if not path.exists():
        say(f"the appliance in {where} keeps no timeline (it was started without --clock virtual): "
            "each timed host runs on its own virtual clock")
        return
    quantum = quantum_ns or int(timeline.read(path)["quantum_ns"])
    timeline.create(path, quantum, expected=hosts)
    say(f"{hosts} timed hosts in one timeline, quanta of {quantum:,} ns of virtual time")


def boot_slots() -> int:
    """How many guests boot at once: two per CPU this process may run on. A boot waits part of
    its time (timers, init's polling), so one per CPU left cores idle (-n 16: 97 s against 78 s
    for all at once here); all at once has every guest competing for the whole boot."""
    return 2 * max(1, len(os.sched_getaffinity(0)))


def run(topo: Topology, topo_path: Path, hosts: int, command: str | Sequence[str], *,
        appliance_dir: Path | None = None, ready_timeout: float = timeouts.FLEET_READY_S,
        command_timeout: float = timeouts.FLEET_COMMAND_S, parallel_boots: int | None = None,
        say: Callable[[str], None] = lambda m: None,
        host_done: Callable[[HostResult], None] = lambda r: None, fabric: str | None = None,
        issue: str = "dependent", telemetry: Callable[[dict], None] = lambda s: None,
        capture: Path | None = None, options: BootOptions | None = None,
        quantum_ns: int | None = None, timing: str | None = None) -> list[HostResult]:
    """Boot `hosts` guests on one appliance and run `command` in each. With `fabric` (pf,
    electrical) the appliance traces and models every host's CXL requests (each command is
    bracketed by the phase markers, unless it marks its rows itself: --mark-rows 1), and
    `telemetry` gets its figures once they are modelled. With `capture` (needs `fabric`) the
    appliance keeps every host's drained records in that directory and each host's plugin phases
    are written beside them (device/trace/capture.py); a temporary appliance completes it as it stops.
    `options` boot every Machine (qemu, qemu_args, kernel, modules, lean...), each with its own host
    id, the appliance and its own run directory, hostN under options.run_dir (default: the temporary
    appliance's directory, or a temporary one).
    Timed hosts (options.clock virtual) run in one timeline: a temporary appliance keeps one in
    quanta of `quantum_ns` (default timeline.DEFAULT_QUANTUM_NS), a running one its own if it was
    started with --clock virtual; either way it is made afresh, waiting for all `hosts` to start.
    `timing`: fabric's old spelling (a DeprecationWarning)."""
    fabric = renamed("multihost.run", "timing", timing, "fabric", fabric)
    if not any(d.appliance for d in topo.devices):
        raise PfcxlError(f"topology '{topo.name}' has no devices served by the appliance "
                         "(appliance = \"shared\"/\"private\"); multihost needs one, e.g. pf-appliance")
    if hosts < 1:
        raise PfcxlError(f"{hosts} hosts: multihost needs at least 1")
    if parallel_boots is not None and parallel_boots < 1:
        raise PfcxlError(f"{parallel_boots} parallel boots: at least 1 guest must boot at a time")
    if topo.appliance is not None and hosts > topo.appliance.ports:
        raise PfcxlError(f"{hosts} hosts but the appliance has {topo.appliance.ports} ports")
    if capture is not None and fabric is None:
        raise PfcxlError("--capture keeps what the appliance's timing drains: it needs --timing trace")
    timed = options is not None and options.clock == "virtual"
    if quantum_ns is not None:
        if not timed:
            raise PfcxlError("--quantum is the timeline's of timed hosts: it needs --clock virtual")
        timeline.check_quantum(quantum_ns)
    options = options or BootOptions()
    run_dir = Path(options.run_dir) if options.run_dir is not None else None
    results: dict[int, HostResult] = {}
    with contextlib.ExitStack() as stack:
        where, temporary = stack.enter_context(appliance_for(
            topo, topo_path, appliance_dir, say, fabric, issue, capture,
            (quantum_ns or timeline.DEFAULT_QUANTUM_NS) if timed else None))
        if timed:
            _fresh_timeline(where, hosts, quantum_ns, say)
        if run_dir is None:       # the hosts' logs: where a temporary appliance removes them as it dies
            run_dir = where / "hosts" if temporary else Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="pfcxl-multihost-")))
        machines: dict[int, Machine] = {}
        if capture is not None:   # runs once every guest is closed (their logs complete), before the appliance stops
            def write_captured_phases() -> None:
                for h, vm in machines.items():
                    trace_capture.write_phases(capture, h, _phases(vm))
            stack.callback(write_captured_phases)
        slots = parallel_boots or boot_slots()
        say(f"booting {hosts} guests, {min(slots, hosts)} at a time")
        boots_started = time.monotonic()
        booting: list[tuple[int, Machine, float, int]] = []     # launched, not yet ready: oldest first
        ready: list[tuple[int, Machine, int]] = []
        waiting, prebuilt, last = list(range(hosts)), None, None
        while waiting or booting:
            while waiting and len(booting) < slots:
                h = waiting.pop(0)
                own = dataclasses.replace(options, host=h, appliance=str(where), run_dir=str(run_dir / f"host{h}"))
                vm = Machine(topo, name=f"host{h}", ready_timeout=ready_timeout, prebuilt=prebuilt, options=own)
                stack.callback(vm.close)
                machines[h] = vm
                vm.launch()
                prebuilt, last = vm.boot_image(), vm
                assert vm.attachment is not None       # its devices are the appliance's (checked above)
                booting.append((h, vm, time.monotonic(), vm.attachment.port))
            b, vm, started, port = booting.pop(0)      # boots take alike, so the oldest is ready first
            try:
                vm.wait_ready()
                cpu = cpu_seconds(vm.pid) if vm.pid else None
                vm.qmp("stop")                          # until every guest is ready (module docstring)
            except PfcxlError as exc:
                results[b] = HostResult(b, port, time.monotonic() - started, None, b"", str(exc))
                host_done(results[b])
                continue
            results[b] = HostResult(b, port, time.monotonic() - started, None, b"", cpu_seconds=cpu)
            ready.append((b, vm, port))
        for h, vm, _ in list(ready):
            try:
                vm.qmp("cont")
            except PfcxlError as exc:
                results[h].error = str(exc)
                host_done(results[h])
                ready.remove((h, vm, results[h].port))
        cpu_total = sum(r.cpu_seconds or 0 for r in results.values())
        say(f"{len(ready)} of {hosts} guests ready in {time.monotonic() - boots_started:.1f}s wall, "
            f"{cpu_total:.1f}s of QEMU CPU time ({len(os.sched_getaffinity(0))} CPUs); running the command in each")
        # timed: the traced-run sequence (Machine.start_traced: bracketed unless it marks its rows)
        traced = fabric is not None
        started_cmds = [(h, vm, (vm.start_traced if traced else vm.start_command)(expand(command, h, hosts),
                                                                                  command_timeout))
                        for h, vm, _ in ready]
        for h, vm, token in started_cmds:
            try:
                done = (vm.finish_traced(token, command_timeout).result if traced
                        else vm.finish_command(token, command_timeout))
                results[h].status, results[h].data = done.status, done.data
            except PfcxlError as exc:
                results[h].error = str(exc)
            host_done(results[h])
        if fabric is not None and ready:
            say("modelling what is left in the hosts' trace rings")
            telemetry(ready[0][1].appliance_stats(sync=True))
        if last is not None and last.attachment is not None:
            lost = check_incarnation(topo_path, where, last.attachment, say)
            for r in results.values():
                r.error = r.error or lost
    return [results[h] for h in sorted(results)]
