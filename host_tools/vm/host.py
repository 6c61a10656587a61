"""One emulated host: a QEMU process, its serial console (host_tools/vm/console.py) and its QMP monitor (qemu.qmp).

Lifecycle, after qemu.machine: explicit states; `launch()` either leaves a running VM or cleans
up and raises one VMError carrying the command line and the log tail; `shutdown()` is graceful
(QMP quit), then forced (SIGTERM, SIGKILL), always reached from `__exit__`, harmless twice.
The console and QMP ride on socket pairs handed to QEMU as file descriptors: no paths to race on.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import re
import select
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NoReturn, Sequence, TypeVar

from qemu.qmp import QMPError
from qemu.qmp.legacy import QEMUMonitorProtocol

from pfcxl import process
from pfcxl.device.topology import Topology
from pfcxl.errors import LaunchError, VMError
from pfcxl.firmware_tables.generate import TableSet, tables_for
from pfcxl.host_tools import timeouts
from pfcxl.firmware_tables.table_files import write as write_tables

from pfcxl.host_tools.image import kernel_pvh
from pfcxl.host_tools.vm import qemu
from pfcxl.host_tools.vm.console import (CommandRunner, Console, ConsoleClosed, ConsoleTimeout, not_shell,
                                         shell_command)
from pfcxl.host_tools.image.initramfs import BootImage
from pfcxl.process import describe_exit, spawn, starved_seconds

# Descriptor numbers QEMU gets: the console, QMP and command-output socket pairs, then each
# appliance-served device's memory in device order. Fixed, so the printed command line is the exec'd one.
CONSOLE_FD, QMP_FD, OUTPUT_FD, FIRST_MEMORY_FD = 3, 4, 5, 6

# init's verdict, or the kernel giving up (a panic, also when init itself dies); each is followed by
# the rest of its line
READY_MARKERS = [b"PFCXL-READY {", b"PFCXL-FAILED {", b"Kernel panic - not syncing:"]
PANIC_RE = re.compile(r"Kernel panic - not syncing:[^\n]*")
STAGE_RE = re.compile(r"PFCXL-STAGE (\w+)")   # guest/init announces each stage it enters
CONSOLE_TAIL_LINES = 25
_Part = TypeVar("_Part")     # VM._made: what launch() makes
# The ready timeout counts the time QEMU ran or could have run: time it waited for a CPU that a
# loaded host gave to others does not count (two guests booting on two busy cores took over 300 s
# of wall time). READY_WALL_FACTOR times the timeout of wall time ends even a starved boot.
READY_WALL_FACTOR = 10
READY_POLL = 5.0      # seconds between looks at QEMU's scheduling figures
QMP_TIMEOUT = 30.0    # seconds for a QMP reply, and (by default) for the monitor's greeting at launch
GREETING_POLL = 0.2   # seconds between looks at whether QEMU is still running while it has not greeted


class VMState(enum.Enum):
    CREATED = "created"
    BOOTING = "booting"
    READY = "ready"
    STOPPED = "stopped"
    FAILED = "failed"


# How long after its limit a command's status may take to come back (the rest of its output
# draining through the serial line) before the guest is taken for stuck.
STATUS_GRACE = 60


@dataclass(frozen=True)
class Result:
    """A guest command's exit status and output: `data` byte for byte (over the serial line its
    CR LF back to LF), `output` the same as text. The one result type of a guest command: VM.run,
    Machine.run and a traced run's `.result`."""

    status: int
    data: bytes
    command: str = ""

    @property
    def output(self) -> str:       # bytes that are not UTF-8 become U+FFFD
        return self.data.decode(errors="replace")

    @property
    def ok(self) -> bool:
        return self.status == 0


def ring_fd_number(topo: Topology) -> int:
    """The descriptor number QEMU (and its TCG plugin, as ring=/proc/self/fd/N) finds a timed
    appliance's trace ring at: the one after the appliance's memory descriptors."""
    return FIRST_MEMORY_FD + sum(1 for d in topo.devices if d.appliance)


class VM:
    """A guest booted from a topology. Use as a context manager; see module docstring."""

    def __init__(self, topo: Topology, image: BootImage, run_dir: Path, *, name: str = "guest",
                 extra_cmdline: str = "", tables: TableSet | None = None,
                 appliance_fds: dict[str, int] | None = None, extra_args: list[str] | None = None,
                 lean: bool = True, ring_fd: int | None = None, qemu_path: str | None = None,
                 qemu_args: list[str] | None = None) -> None:
        self.topo, self.image, self.name = topo, image, name
        self.extra_args = list(extra_args or [])   # appended to QEMU's argv (e.g. a TCG plugin)
        self.qemu_path = qemu_path or qemu.qemu_binary()
        self.qemu_args = list(qemu_args or [])     # the user's own (--qemu-arg), last so they can override
        self.run_dir = Path(run_dir)
        self.cmdline = qemu.kernel_cmdline(topo, extra_cmdline, lean)
        # lean: the kernel's own ELF at its PVH entry, no bzImage decompression under TCG
        self.kernel = (image.pvh or kernel_pvh.uncompressed(image.kernel)) if lean else image.kernel
        self.state = VMState.CREATED
        self.console_log = self.run_dir / f"{name}.console.log"
        self.qemu_log = self.run_dir / f"{name}.qemu.log"
        self.tables = tables if tables is not None else tables_for(topo)
        self.appliance_fds = appliance_fds or {}     # device id -> descriptor from the appliance
        self.ring_fd = ring_fd                       # a timed appliance's trace ring, at ring_fd_number()
        self.argv: list[str] = []
        self.ready_info: dict = {}
        self._proc: process.Popen | None = None
        self._console: Console | None = None
        self._commands: CommandRunner | None = None
        self._console_sock: socket.socket | None = None
        self._output_sock: socket.socket | None = None     # the virtio-serial port commands write to
        self._output: Console | None = None
        self._serial_commands: CommandRunner | None = None  # output over the serial line
        self._qmp: QEMUMonitorProtocol | None = None
        self._qmp_connected = False
        self._log_file: BinaryIO | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> "VM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def memory_fds(self) -> dict[str, int]:
        """Device id -> the descriptor number QEMU finds its appliance memory at."""
        served = sorted(d.id for d in self.topo.devices if d.appliance)
        return {dev_id: FIRST_MEMORY_FD + i for i, dev_id in enumerate(served)}

    def tables_dir(self) -> Path:
        return self.run_dir / f"{self.name}.tables"

    def planned_argv(self) -> list[str]:
        """QEMU's argv for this VM, with every file named where launch() writes it: a pure
        function of the topology, image, run directory and options (pfcxl qemu-args prints it)."""
        backing: dict[str, Path | str] = dict(qemu.backing_paths(self.topo, self.run_dir))
        backing.update(qemu.inherited_backing(self.memory_fds()))
        cdat_files = {k: self.tables_dir() / f"{k}.cdat" for k in {**self.tables.device_cdat, **self.tables.switch_cdat}}
        boot = qemu.BootFiles(self.kernel, self.image.initrd, self.cmdline)
        return qemu.argv(self.topo, boot, backing, console_fd=CONSOLE_FD, qmp_fd=QMP_FD, output_fd=OUTPUT_FD,
                         qemu=self.qemu_path,
                         cdat=cdat_files, numa_args=self.tables.numa_args,
                         extra_args=self.extra_args + self.qemu_args)

    def launch(self, timeout: float = QMP_TIMEOUT) -> None:
        """Start QEMU and connect to its QMP monitor, which must greet within `timeout` seconds (a
        QEMU that waits, e.g. for a client of a `--qemu-arg` chardev with wait=on, fails the launch
        then rather than hanging it)."""
        if self.state is not VMState.CREATED:
            raise VMError(f"{self.name}: launch() called in state {self.state.value}")
        missing = [d.id for d in self.topo.devices if d.appliance and d.id not in self.appliance_fds]
        if missing:
            raise VMError(f"devices {', '.join(missing)} are served by the appliance: attach this host "
                          "first (pfcxl run --host N, with 'pfcxl appliance start' running)")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.argv = self.planned_argv()
        qemu.prepare_backing(self.topo, self.run_dir)
        if self.tables.device_cdat or self.tables.switch_cdat:
            write_tables(self.topo, self.tables_dir(), self.tables)
        console_ours, console_qemu = socket.socketpair()
        qmp_ours, qmp_qemu = socket.socketpair()
        output_ours, output_qemu = socket.socketpair()
        fds = {CONSOLE_FD: console_qemu.fileno(), QMP_FD: qmp_qemu.fileno(), OUTPUT_FD: output_qemu.fileno()}
        fds.update({self.memory_fds()[dev]: fd for dev, fd in self.appliance_fds.items()})
        if self.ring_fd is not None:
            fds[ring_fd_number(self.topo)] = self.ring_fd
        self.qemu_log.write_text(f"# {qemu.show(self.argv)}\n")
        self.state = VMState.BOOTING
        try:
            self._proc = spawn(self.argv, log=self.qemu_log, fds=fds)
            for theirs in (console_qemu, qmp_qemu, output_qemu):
                theirs.close()
            self._console_sock, self._output_sock = console_ours, output_ours
            self._log_file = open(self.console_log, "wb")
            self._console = Console(console_ours, self._log_file)
            self._output = Console(output_ours, None)
            self._qmp = QEMUMonitorProtocol(qmp_ours)
            self._qmp.settimeout(QMP_TIMEOUT)
            self._await_greeting(qmp_ours, timeout)     # qemu.qmp's connect() itself waits without a limit
            self._qmp.connect(negotiate=True)
            self._qmp_connected = True
        except Exception as exc:
            error = self._failure(f"QEMU did not start: {exc}")
            self.shutdown()
            self.state = VMState.FAILED
            raise error from exc

    def _await_greeting(self, sock: socket.socket, timeout: float) -> None:
        """Until QEMU's QMP greeting is there to read; VMError when QEMU exits first or `timeout`
        seconds pass (a signal's KeyboardInterrupt ends the wait too)."""
        proc, deadline = self._made(self._proc), time.monotonic() + timeout
        while True:
            readable = bool(select.select([sock], [], [], GREETING_POLL)[0])
            if readable and sock.recv(1, socket.MSG_PEEK):
                return                               # the greeting's first byte: connect() reads it
            if readable or proc.poll() is not None:  # its end closed (nothing to read), or it exited
                with contextlib.suppress(process.TimeoutExpired):
                    proc.wait(GREETING_POLL)         # its status, for the message, once it is gone
                raise VMError("QEMU exited before its QMP monitor greeted")
            if time.monotonic() >= deadline:
                raise VMError(f"its QMP monitor did not greet within {timeout:g} s (is QEMU waiting, e.g. for "
                              "a client of a --qemu-arg chardev with wait=on?)")

    def wait_ready(self, timeout: float = timeouts.READY_S) -> dict:
        """Wait for init's PFCXL-READY line; return its JSON. Raises VMError with the console tail.
        `timeout` is of QEMU's own time: what it spent waiting for a busy host's CPUs is added
        (READY_WALL_FACTOR)."""
        self._require(VMState.BOOTING)
        console = self._made(self._console)
        try:
            kind = self._expect_ready(timeout)
            rest = console.line(timeout).decode(errors="replace")
        except ConsoleTimeout:
            self._fail(f"guest did not become ready within {timeout:.0f}s, {self._stage()}")
        except ConsoleClosed:
            self._fail(self._panic() or f"QEMU exited before the guest became ready, {self._stage()}")
        if kind == 2:
            self._fail(f"kernel panic, {self._stage()}: Kernel panic - not syncing:{rest.rstrip()}")
        info = json.loads("{" + rest)
        if kind == 1:
            self._fail(f"guest init failed at stage '{info.get('stage')}': {info.get('error')}")
        self.ready_info = info
        # init opened the output port when the kernel has virtio_console (its "output" key)
        self._serial_commands = CommandRunner(console)
        self._commands = CommandRunner(console, self._output if info.get("output") == "port" else None)
        self.state = VMState.READY
        return info

    def _expect_ready(self, timeout: float) -> int:
        """The first READY_MARKERS match within `timeout` seconds of wall time less the time QEMU
        was starved (ConsoleTimeout after that, or after READY_WALL_FACTOR x timeout of wall time,
        naming both)."""
        start, starved0 = time.monotonic(), starved_seconds(self.pid)
        while True:
            wall = time.monotonic() - start
            starved = max(starved_seconds(self.pid) - starved0, 0.0)
            left = min(timeout - (wall - starved), READY_WALL_FACTOR * timeout - wall)
            if left <= 0:
                self._fail(f"guest did not become ready within {timeout:.0f}s: {wall:.0f}s of wall time, "
                           f"{starved:.0f}s of which QEMU waited for a CPU the host gave to other processes, "
                           f"{self._stage()}")
            try:
                return self._made(self._console).expect_exact(READY_MARKERS, min(left, READY_POLL))[0]
            except ConsoleTimeout:
                continue

    def shutdown(self, timeout: float = timeouts.QUIT_S) -> None:
        """Stop QEMU: QMP quit, then SIGTERM, then SIGKILL. Safe in any state, twice."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            steps = [("term", 5.0), ("kill", 5.0)]
            # QMP quit only on a monitor that is connected: waiting `timeout` for a quit that was
            # never sent (a launch that failed or was interrupted before the greeting) is time lost
            if self._qmp is not None and self._qmp_connected:
                try:
                    self._qmp.cmd("quit")
                except (QMPError, OSError, EOFError, Exception):
                    pass   # QEMU may close the monitor before answering; the wait below decides
                steps.insert(0, ("quit", timeout))
            for sig, wait in steps:
                if sig == "term":
                    proc.terminate()
                elif sig == "kill":
                    proc.kill()
                try:
                    proc.wait(wait)
                    break
                except process.TimeoutExpired:
                    continue
        if proc is not None and proc.poll() is not None:
            # QEMU's own process group (spawn starts it in a session of its own): what is left
            # there, say the children of a --qemu wrapper that exited, goes with it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for closer in (self._qmp, self._console_sock, self._output_sock, self._log_file):
            if closer is not None:
                try:
                    closer.close()
                except Exception:
                    pass
        self._qmp = self._console_sock = self._output_sock = self._log_file = None
        self._qmp_connected = False
        self._console = self._output = self._commands = self._serial_commands = None
        if self.state is not VMState.FAILED:
            self.state = VMState.STOPPED

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    # ------------------------------------------------------------------ console

    def run(self, command: str | Sequence[str], timeout: float = timeouts.COMMAND_S, *, serial: bool = False) -> Result:
        """Run a command in the guest; return its output and exit status. A string is shell
        syntax; a list is argv (each word quoted). The command has no stdin (/dev/null). One
        that runs longer than `timeout` is killed in the guest (VMError); the guest stays up.
        The output comes over the virtio-serial port when the guest has one, else (or with
        `serial`, for comparison) over the serial console."""
        return self.finish_command(self.start_command(command, timeout, serial=serial), timeout)

    def start_command(self, command: str | Sequence[str], timeout: float = timeouts.COMMAND_S, *,
                      serial: bool = False) -> tuple[str, str, float, CommandRunner]:
        """Start a command and return at once (several guests can then work at the same time);
        the guest kills it once it has run `timeout` seconds."""
        self._require(VMState.READY)
        command = shell_command(command)
        runner = self._made(self._serial_commands if serial else self._commands)
        try:
            return runner.start(command, timeout), command, timeout, runner
        except ConsoleTimeout:
            self._fail(f"the guest shell did not take the command: {command[:200]}")
        except ConsoleClosed:
            self._fail(f"QEMU exited while sending: {command[:200]}")

    def finish_command(self, started: tuple[str, str, float, CommandRunner], timeout: float = timeouts.COMMAND_S) -> Result:
        """Wait for a command from start_command; its output and exit status."""
        tag, command, limit, runner = started
        try:
            data, status = runner.finish(tag, max(timeout, limit) + STATUS_GRACE)
        except ConsoleTimeout:
            self._fail(f"command did not finish within {timeout:g}s, and the guest did not end it: {command[:200]}")
        except ConsoleClosed:
            self._fail(self._panic() or f"QEMU exited while running: {command[:200]}")
        if status == "syntax":
            raise not_shell(self.name, data.decode(errors="replace"), command)
        if status == "late":
            raise VMError(f"{self.name}: command did not finish within {limit:g}s: the guest killed it "
                          f"(its process group); the guest is still up: {command[:200]}")
        return Result(int(status), data, command)

    def check(self, command: str, timeout: float = timeouts.COMMAND_S) -> str:
        """Run a command that must succeed; return its output."""
        result = self.run(command, timeout)
        if result.status != 0:
            raise VMError(f"{self.name}: '{command}' exited with status {result.status}:\n"
                          f"{result.output.strip()[-2000:]}")
        return result.output

    def qmp(self, command: str, **arguments: object) -> object:
        if self._qmp is None:
            raise VMError(f"{self.name}: QMP is not connected (state {self.state.value})")
        try:
            return self._qmp.cmd(command, **arguments)
        except QMPError as exc:
            raise VMError(f"{self.name}: QMP {command} failed: {exc}") from exc

    @property
    def console_fd(self) -> int:
        self._require(VMState.BOOTING, VMState.READY)
        return self._made(self._console_sock).fileno()

    def console_tail(self, lines: int = CONSOLE_TAIL_LINES) -> str:
        text = self._console_text()
        return "\n".join(text.rstrip().splitlines()[-lines:]) or "(no console output)"

    # ------------------------------------------------------------------ failures

    def _require(self, *states: VMState) -> None:
        if self.state not in states:
            raise VMError(f"{self.name}: not possible in state {self.state.value}")

    def _made(self, part: _Part | None) -> _Part:
        """A part launch() makes (console, command runner, socket), which a stopped VM lacks."""
        if part is None:
            raise VMError(f"{self.name}: not possible in state {self.state.value}")
        return part

    def _console_text(self) -> str:
        if self._log_file is not None:
            self._log_file.flush()
        try:
            text = self.console_log.read_bytes().decode(errors="replace")
        except FileNotFoundError:
            return ""
        return text.replace("\r\n", "\n").replace("\r", "\n")

    def _stage(self) -> str:
        """Where the boot got to, from the markers guest/init prints."""
        stages = STAGE_RE.findall(self._console_text())
        if stages:
            return f"at stage '{stages[-1]}' of pfcxl's init"
        return "at stage 'kernel' (firmware and kernel: pfcxl's init had not started)"

    def _panic(self) -> str | None:
        found = PANIC_RE.search(self._console_text())
        return f"kernel panic, {self._stage()}: {found.group(0).strip()}" if found else None

    def _failure(self, reason: str) -> LaunchError:
        """The error of a guest that failed: its reason, QEMU's exit, both logs' tails, the argv."""
        returncode = self._proc.returncode if self._proc is not None and self._proc.poll() is not None else None
        exit_note = f" ({describe_exit(self.argv, returncode)})" if returncode is not None else ""
        try:
            log_tail = "\n".join(self.qemu_log.read_text(errors="replace").strip().splitlines()[1:][-10:])
        except FileNotFoundError:
            log_tail = ""
        console = self.console_tail()
        said = "\nQEMU said:\n  " + log_tail.replace("\n", "\n  ") if log_tail else ""
        message = (f"{self.name}: {reason}{exit_note}\n"
                   f"last console lines:\n  " + console.replace("\n", "\n  ") + said +
                   f"\nconsole log: {self.console_log}\nQEMU log: {self.qemu_log}\n"
                   f"command line: {qemu.show(self.argv)}")
        return LaunchError(message, argv=list(self.argv), returncode=returncode, log_tail=log_tail,
                           console_tail=console)

    def _fail(self, reason: str) -> NoReturn:
        """A failed boot raises LaunchError; a guest that fails later (a command), VMError with
        the same message."""
        error = self._failure(reason)
        booting = self.state is VMState.BOOTING
        self.state = VMState.FAILED
        self.shutdown()
        raise error if booting else VMError(str(error))
