"""The traced-run sequence: a guest command run with the TCG plugin watching, the one every timed
command uses (`pfcxl run --timing`, `pfcxl bench`, `pfcxl multihost --timing`, the paper
bandwidth script), through Machine.traced_run / start_traced / finish_traced:

    bracket the command with the plugin's phase markers (pfcxl_mark start/stop), unless it marks
    its rows itself (--mark-rows 1) -> run it -> wait for the plugin's phase -> stop draining the
    trace (and drain on for the next command) -> model the records (TracedRun.model / rows)

Who holds a guest's trace: its own TimingSession (timing count / trace / inject; the records come
back here in trace mode), or a timed appliance (`pfcxl appliance start --fabric`), which drains
and models every host's ring itself (TracedRun.appliance_figures). A guest with neither runs the
command as it is. `seconds` is the command's host wall-clock: emulator (TCG) time, never a fabric
figure; fabric figures come from the models in device/.

A `Tracer` holds what the sequence needs of one booted guest (its VM, its session, the figures
of a timed appliance); the Machine builds it, and nothing here knows the Machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from pfcxl.device.topology import Topology
from pfcxl.errors import PfcxlError
from pfcxl.host_tools import timeouts
from pfcxl.host_tools.timing import config as timing_mod
from pfcxl.host_tools.vm.console import shell_command
from pfcxl.host_tools.vm.host import VM, Result

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Started:
    """A traced command typed into the guest, not yet collected (Tracer.finish)."""

    token: Any                 # the console's, for VM.finish_command
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
    name: str                           # the guest's, for messages
    topology: Topology | None = field(default=None, repr=False)
    session: timing_mod.TimingSession | None = field(default=None, repr=False)
    fabric_params: tuple[str, ...] = ()
    first_phase: int = 0
    # a timed appliance's figures for this host (None: no timed appliance models this host)
    figures: Callable[[], dict] | None = field(default=None, repr=False)

    def rows(self, n: int, timeout: float = 30) -> "list[np.ndarray]":
        """A command that marks its own rows (--mark-rows 1), n of them: the records of each row,
        cut by the plugin's phase counts (TimingError when they do not add up, or when the plugin
        has not reported n phases within `timeout` seconds)."""
        phases = self._session().wait_phases(self.first_phase + n, timeout)[self.first_phase:]
        return timing_mod.split_rows(self._records(), phases)

    def model(self, dependent: bool = True) -> dict:
        """The fabric models' figures for exactly these records (host_tools/timing/report.py)."""
        from pfcxl.host_tools.timing import report as timing_report
        from pfcxl.host_tools.timing import vtime
        if self.topology is None:
            raise PfcxlError(f"{self.name}: this run names no topology to model its records on")
        return timing_report.model_trace(self.topology, self._records(), dependent=dependent,
                                         what_if=vtime.params(self.fabric_params))

    def report(self, dependent: bool = True) -> dict:
        """The models' figures with the emulator's cost beside them, labelled so: what `pfcxl run
        --timing trace` prints and writes (--report)."""
        return {**self.model(dependent), "emulator": self.emulator_cost()}

    def emulator_cost(self) -> dict:
        """The command's host wall-clock per CXL request: QEMU TCG overhead, labelled so."""
        from pfcxl.host_tools.timing import report as timing_report
        return timing_report.emulator_cost(len(self._records()), self.seconds)

    def appliance_figures(self) -> dict | None:
        """On a timed appliance: its figures for this host once this host's trace is modelled;
        None for a guest no timed appliance models."""
        return self.figures() if self.figures is not None else None

    def _session(self) -> timing_mod.TimingSession:
        if self.session is None:
            raise PfcxlError(f"{self.name}: no timing plugin of its own (boot with timing=...)")
        return self.session

    def _records(self) -> "np.ndarray":
        if self.records is None:
            raise PfcxlError(f"{self.name}: only a trace-mode run has records to model (timing='trace')")
        return self.records


@dataclass(frozen=True)
class Tracer:
    """What the traced-run sequence needs of one booted guest."""

    vm: VM
    session: timing_mod.TimingSession | None     # its own plugin's, if any
    topology: Topology
    fabric_params: tuple[str, ...] = ()
    figures: Callable[[], dict] | None = None      # set when a timed appliance models its trace

    @property
    def traced(self) -> bool:
        return self.session is not None or self.figures is not None

    def start(self, command: str | Sequence[str], timeout: float = timeouts.COMMAND_S,
              bracket: bool | None = None) -> Started:
        """Type the (bracketed) command; `bracket` None: bracketed when something traces this
        guest and the command does not mark its rows itself."""
        text = shell_command(command)
        if bracket is None:
            bracket = self.traced and not timing_mod.marks_rows(text)
        elif bracket and not self.traced:
            raise PfcxlError(f"{self.vm.name}: nothing traces this machine, so there are no phases to mark "
                             "(boot with timing=..., or attach to a timed appliance)")
        first = len(self.session.phases()) if self.session is not None else 0
        token = self.vm.start_command(timing_mod.bracket(text, self.vm.ready_info) if bracket else text, timeout)
        return Started(token, bool(bracket), first, time.monotonic())

    def finish(self, started: Started, timeout: float = timeouts.COMMAND_S) -> TracedRun:
        """Collect the command, its phase and its records; the session drains on for the next one."""
        result = self.vm.finish_command(started.token, timeout)
        seconds = time.monotonic() - started.began
        records, phases = None, []
        if self.session is not None:
            if started.bracketed:
                phases = self.session.wait_phases(started.first_phase + 1)[started.first_phase:]
            records = self.session.stop()
            self.session.start()
        return TracedRun(result, seconds, records, phases, self.vm.name, self.topology, self.session,
                         self.fabric_params, started.first_phase, self.figures)
