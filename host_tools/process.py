"""The one place pfcxl starts other programs, and words their failures precisely."""

from __future__ import annotations

import ctypes
import signal
import subprocess
from pathlib import Path
from typing import Sequence

from pfcxl.errors import PfcxlError, VMError

_PR_SET_PDEATHSIG = 1


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


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
    except FileNotFoundError:
        raise error(f"{what}: {argv[0]} not found (run 'make setup')") from None
    except subprocess.TimeoutExpired:
        raise error(f"{what}: {argv[0]} did not finish within {timeout:.0f}s") from None
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


def spawn(argv: Sequence[str], *, log: Path, pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start a long-running helper (QEMU) with its stdout and stderr in `log`.

    It gets its own session, so a Ctrl-C at the terminal reaches pfcxl, which then shuts the
    helper down in order, rather than killing it mid-write.
    """
    with open(log, "ab") as out:
        try:
            return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    pass_fds=tuple(pass_fds), start_new_session=True,
                                    preexec_fn=die_with_parent)
        except FileNotFoundError:
            raise VMError(f"{argv[0]} not found: run 'make setup' (installs QEMU 10 from "
                          "bookworm-backports)") from None
        except PermissionError as exc:
            raise VMError(f"cannot execute {argv[0]}: {exc}") from None
