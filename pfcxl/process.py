"""The one place pfcxl starts other programs, and words their failures precisely."""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import subprocess
from pathlib import Path
from typing import Sequence

from pfcxl.errors import PfcxlError, VMError

_PR_SET_PDEATHSIG = 1


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a live process has used (proc(5): stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def starved_seconds(pid: int) -> float:
    """How long the process's most delayed thread has waited runnable for a CPU that the host gave
    to other processes (proc(5): /proc/PID/task/TID/schedstat, its second field, in ns); 0 for a
    process or thread that has gone."""
    worst = 0
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
        done = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise error(f"{what}: {argv[0]} not found (run 'make setup')") from exc
    except subprocess.TimeoutExpired as exc:
        raise error(f"{what}: {argv[0]} did not finish within {timeout:.0f}s") from exc
    if done.returncode != 0:
        detail = _tail(done.stderr or done.stdout)
        raise error(f"{what}: {describe_exit(argv, done.returncode)}"
                    + (f":\n{detail}" if detail else "") + f"\ncommand: {' '.join(argv)}")
    return done.stdout


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
            return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    close_fds=False, start_new_session=True,
                                    preexec_fn=_child_descriptors(dict(fds or {})))
        except FileNotFoundError as exc:
            raise VMError(f"{argv[0]} not found: run 'make setup' (installs QEMU 10 from "
                          "bookworm-backports)") from exc
        except PermissionError as exc:
            raise VMError(f"cannot execute {argv[0]}: {exc}") from exc
