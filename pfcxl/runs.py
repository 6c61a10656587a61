"""What a guest command gives back: `Result` (status and output), and `TracedRun`, a command run
with the TCG plugin watching (Machine.traced_run).

The traced-run sequence, the one every timed command uses (`pfcxl run --timing`, `pfcxl bench`,
`pfcxl multihost --timing`, the paper bandwidth script):

    bracket the command with the plugin's phase markers (pfcxl_mark start/stop), unless it marks
    its rows itself (--mark-rows 1) -> run it -> wait for the plugin's phase -> stop draining the
    trace (and drain on for the next command) -> model the records (TracedRun.model / rows)

Who holds a Machine's trace: its own TimingSession (timing count / trace / inject; the records come
back here in trace mode), or a timed appliance (`pfcxl appliance start --fabric`), which drains
and models every host's ring itself (TracedRun.appliance_figures). A Machine with neither runs
the command as it is. `seconds` is the command's host wall-clock: emulator (TCG) time, never a
fabric figure; fabric figures come from the models in device/.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from pfcxl.errors import PfcxlError
from pfcxl.host_tools.timing import config as timing_mod
from pfcxl.host_tools.vm.console import shell_command

if TYPE_CHECKING:
    import numpy as np

    from pfcxl.machine import Machine


@dataclass(frozen=True)
class Result:
    """A guest command's exit status and output: `data` byte for byte (the console's CR LF
    turned into LF), `output` the same as text."""

    status: int
    data: bytes
    command: str = ""

    @property
    def output(self) -> str:       # bytes that are not UTF-8 become U+FFFD
        return self.data.decode(errors="replace")

    @property
    def ok(self) -> bool:
        return self.status == 0


@dataclass(frozen=True)
class Started:
    """A traced command typed into the guest, not yet collected (Machine.finish_traced)."""

    token: Any                 # the console's, for Machine.finish_command
    bracketed: bool
    first_phase: int           # the plugin's phases before this command
    began: float


@dataclass
class TracedRun:
    """One traced command: its Result, and what the plugin saw of it."""

    result: Result
    seconds: float                      # host wall-clock of the command: emulator time
    records: "np.ndarray | None"        # trace mode: every CXL request of the run, in order
    phases: list[dict]                  # the plugin's phases of a bracketed run (one)
    machine: "Machine" = field(repr=False)
    first_phase: int = 0

    def rows(self, n: int, timeout: float = 30) -> "list[np.ndarray]":
        """A command that marks its own rows (--mark-rows 1), n of them: the records of each row,
        cut by the plugin's phase counts (TimingError when they do not add up, or when the plugin
        has not reported n phases within `timeout` seconds)."""
        session = self._session()
        phases = session.wait_phases(self.first_phase + n, timeout)[self.first_phase:]
        return timing_mod.split_rows(self._records(), phases)

    def model(self, dependent: bool = True) -> dict:
        """The fabric models' figures for exactly these records (host_tools/timing/report.py)."""
        from pfcxl.host_tools.timing import report as timing_report
        from pfcxl.host_tools.timing import vtime
        config = self.machine.timing_config
        what_if = vtime.params(config.fabric_params if config is not None else ())
        return timing_report.model_trace(self.machine.topology, self._records(), dependent=dependent, what_if=what_if)

    def emulator_cost(self) -> dict:
        """The command's host wall-clock per CXL request: QEMU TCG overhead, labelled so."""
        from pfcxl.host_tools.timing import report as timing_report
        return timing_report.emulator_cost(len(self._records()), self.seconds)

    def appliance_figures(self) -> dict | None:
        """On a timed appliance: its figures for this host once this host's trace is modelled;
        None for any other Machine."""
        attachment = self.machine.attachment
        if not self.machine.on_timed_appliance or attachment is None:
            return None
        from pfcxl.host_tools.timing.telemetry_view import for_host
        return for_host(self.machine.appliance_stats(sync=True), attachment.host)

    def _session(self) -> timing_mod.TimingSession:
        if self.machine.timing is None:
            raise PfcxlError(f"{self.machine.name}: no timing plugin of its own (boot with timing=...)")
        return self.machine.timing

    def _records(self) -> "np.ndarray":
        if self.records is None:
            raise PfcxlError(f"{self.machine.name}: only a trace-mode run has records to model (timing='trace')")
        return self.records


def start(machine: "Machine", command: str | Sequence[str], timeout: float, bracket: bool | None) -> Started:
    """Type the (bracketed) command; `bracket` None: bracketed when something traces this machine
    and the command does not mark its rows itself."""
    text = shell_command(command)
    session = machine.timing
    traced = session is not None or machine.on_timed_appliance
    if bracket is None:
        bracket = traced and not timing_mod.marks_rows(text)
    elif bracket and not traced:
        raise PfcxlError(f"{machine.name}: nothing traces this machine, so there are no phases to mark "
                         "(boot with timing=..., or attach to a timed appliance)")
    first = len(session.phases()) if session is not None else 0
    token = machine.start_command(timing_mod.bracket(text, machine.ready) if bracket else text, timeout)
    return Started(token, bool(bracket), first, time.monotonic())


def finish(machine: "Machine", started: Started, timeout: float) -> TracedRun:
    """Collect the command, its phase and its records; the session drains on for the next one."""
    result = machine.finish_command(started.token, timeout)
    seconds = time.monotonic() - started.began
    session, records, phases = machine.timing, None, []
    if session is not None:
        if started.bracketed:
            phases = session.wait_phases(started.first_phase + 1)[started.first_phase:]
        records = session.stop()
        session.start()
    return TracedRun(result, seconds, records, phases, machine, started.first_phase)
