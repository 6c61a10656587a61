"""The one place pfcxl starts other programs, and words their failures precisely.

Every child starts here: run (to completion, its stdout, a failure worded as one error), capture
(to completion, the CompletedProcess for a caller that reads its status), probe (a short probe,
bounded, nothing left behind), start (a Popen for a child the caller drives), replace_with (exec)
and spawn (QEMU: fixed descriptors, its own session, dies with pfcxl). Each logs its argv with shlex.join on the
"pfcxl.process" logger (debug level: `--debug` shows them). tests/unit/test_spawn_sites.py fails
on any other module that starts a program itself. The names callers need of the subprocess
module (TimeoutExpired, PIPE, ...) are re-exported here, so no other module imports it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import shlex
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from pfcxl.errors import PfcxlError, VMError

_PR_SET_PDEATHSIG = 1
log = logging.getLogger("pfcxl.process")

# what callers use of the subprocess module, so that they never import it themselves
CompletedProcess = subprocess.CompletedProcess
Popen = subprocess.Popen
TimeoutExpired = subprocess.TimeoutExpired
PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT


def _starting(argv: Sequence[str]) -> list[str]:
    """The argv as a list, logged once as a shell would read it."""
    argv = [str(a) for a in argv]
    log.debug("starting: %s", shlex.join(argv))
    return argv


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat that pfcxl reads (proc(5)); times in clock ticks."""

    pid: int
    comm: str            # the command name, which may hold spaces and parentheses
    state: str           # R, S, D, Z (zombie), ...
    ppid: int
    utime: int
    stime: int
    start: int           # since boot: a pid plus its start names one process, even after reuse

    @property
    def cpu_seconds(self) -> float:
        return (self.utime + self.stime) / os.sysconf("SC_CLK_TCK")


def parse_stat(text: str) -> ProcStat:
    """One /proc/PID/stat line. The command name sits between the first '(' and the LAST ')':
    it may itself hold ') ', so splitting on spaces or on the first ')' misreads every field."""
    head, sep, rest = text.rpartition(")")
    pid, paren, comm = head.partition("(")
    fields = rest.split()
    try:
        if not sep or not paren or len(fields) < 20:
            raise ValueError("too few fields")
        # fields[0] is field 3 of proc(5): state 3, ppid 4, utime 14, stime 15, starttime 22
        return ProcStat(int(pid), comm, fields[0], int(fields[1]), int(fields[11]), int(fields[12]),
                        int(fields[19]))
    except ValueError as exc:
        raise ValueError(f"not a /proc/PID/stat line ({exc}): {text[:200]!r}") from None


def proc_stat(pid: int) -> ProcStat | None:
    """The process's stat, None if there is no such process (any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # any process may name itself with bytes that are not UTF-8 (prctl PR_SET_NAME)
    return parse_stat(raw.decode("utf-8", "surrogateescape"))


def is_running(pid: int | None) -> bool:
    """A process that exists and has not exited (a zombie has exited: only its parent's wait is
    left)."""
    stat = proc_stat(pid) if pid else None
    return stat is not None and stat.state != "Z"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a live process has used; FileNotFoundError if it is gone."""
    stat = proc_stat(pid)
    if stat is None:
        raise FileNotFoundError(f"/proc/{pid}/stat: no such process")
    return stat.cpu_seconds


def starved_seconds(pid: int | None) -> float:
    """How long the process's most delayed thread has waited runnable for a CPU that the host gave
    to other processes (proc(5): /proc/PID/task/TID/schedstat, its second field, in ns); 0 for a
    process or thread that has gone, or none (pid None)."""
    worst = 0
    if pid is None:
        return 0.0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                worst = max(worst, int(f.read().split()[1]))
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
    return worst / 1e9


def describe_exit(argv: Sequence[str], returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"{argv[0]} was killed by {name}"
    return f"{argv[0]} exited with status {returncode}"


def run(argv: Sequence[str], *, what: str, error: type[PfcxlError] = PfcxlError,
        cwd: Path | None = None, timeout: float | None = None) -> str:
    """Run a short command to completion; return stdout; raise `error` naming the step on failure."""
    try:
        done = subprocess.run(_starting(argv), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise error(f"{what}: {argv[0]} not found (run 'make setup')") from exc
    except subprocess.TimeoutExpired as exc:
        raise error(f"{what}: {argv[0]} did not finish within {timeout:.0f}s") from exc
    if done.returncode != 0:
        detail = _tail(done.stderr or done.stdout)
        raise error(f"{what}: {describe_exit(argv, done.returncode)}"
                    + (f":\n{detail}" if detail else "") + f"\ncommand: {' '.join(argv)}")
    return done.stdout


def capture(argv: Sequence[str], **options: Any) -> subprocess.CompletedProcess:
    """Run a command to completion with its stdout and stderr captured; the CompletedProcess, for
    a caller that reads the status itself (`options`: subprocess.run's input, text, timeout, cwd,
    env, errors). OSError if it cannot start; TimeoutExpired after a timeout."""
    return subprocess.run(_starting(argv), capture_output=True, **options)


def start(argv: Sequence[str], **options: Any) -> subprocess.Popen:
    """Start a child the caller drives and waits for (`options`: Popen's stdin, stdout, stderr,
    text, start_new_session, preexec_fn, cwd, env). OSError if it cannot start."""
    return subprocess.Popen(_starting(argv), **options)


def replace_with(argv: Sequence[str]) -> None:
    """Become the program (exec: a service started in the foreground); returns only on OSError."""
    argv = _starting(argv)
    os.execv(argv[0], argv)


def probe(argv: Sequence[str], timeout: float, limit: int = 1 << 16) -> tuple[int, str]:
    """Run a short probe (`qemu --version`) to its end: its status and the first `limit` bytes of
    its stdout and stderr together. It runs in a session of its own, and whatever it leaves behind
    (a background child still holding its output open) is killed when it ends, so neither an
    output pipe kept open nor a child outlives the call. subprocess.TimeoutExpired after `timeout`
    seconds; OSError if it cannot be started. A signal's KeyboardInterrupt kills it too."""
    with tempfile.TemporaryFile() as out:     # a file, not a pipe: its end is the probe's exit, not EOF
        proc = subprocess.Popen(_starting(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            status = proc.wait(timeout)
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)     # its session's group: the probe and what it started
            proc.wait()
        out.seek(0)
        return status, out.read(limit).decode(errors="replace")


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """For preexec_fn: if pfcxl itself is killed (even with SIGKILL), the kernel sends the child
    `signum`: no QEMU is ever left behind. It fires when the spawning *thread* exits, so spawn
    from the main one."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)


def _child_descriptors(fds: dict[int, int]):
    """The child's setup: die with the parent, put each descriptor at its fixed number, and let
    no other descriptor of ours through exec. The fixed numbers are what the argv names, so the
    command line `pfcxl qemu-args` prints is exactly the one exec'd."""
    def setup() -> None:
        die_with_parent()
        low = max(fds, default=2) + 1
        # Copy every source above the targets first: a source may sit on another's target number.
        copies = {target: fcntl.fcntl(source, fcntl.F_DUPFD_CLOEXEC, low) for target, source in fds.items()}
        for target, copy in copies.items():
            os.dup2(copy, target, inheritable=True)
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd > 2 and fd not in fds:
                try:
                    os.set_inheritable(fd, False)
                except OSError:
                    pass   # the directory listing's own descriptor, already closed
    return setup


def spawn(argv: Sequence[str], *, log: Path, fds: dict[int, int] | None = None) -> subprocess.Popen:
    """Start a long-running helper (QEMU) with its stdout and stderr in `log`.

    `fds` maps descriptor numbers in the child to ours (the console, QMP and memory descriptors).
    It gets its own session, so a Ctrl-C at the terminal reaches pfcxl, which then shuts the
    helper down in order, rather than killing it mid-write.
    """
    with open(log, "ab") as out:
        try:
            return subprocess.Popen(_starting(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    close_fds=False, start_new_session=True,
                                    preexec_fn=_child_descriptors(dict(fds or {})))
        except FileNotFoundError as exc:
            raise VMError(f"{argv[0]} not found: run 'make setup' (installs QEMU 10 from "
                          "bookworm-backports)") from exc
        except PermissionError as exc:
            raise VMError(f"cannot execute {argv[0]}: {exc}") from exc
