"""What every step runs with: the Step contract, progress lines and a logged command runner."""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pfcxl import cache, process
from pfcxl.errors import SetupError


class StepError(SetupError):
    """A step failed; the message is one line saying why."""


def failure(cmd: list[str], proc: process.CompletedProcess) -> str:
    """One line: the command, its exit code and the last lines of its stderr (else stdout)."""
    tail = [ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
    return (f"`{shlex.join(cmd)}` exited {proc.returncode}: "
            + (" | ".join(tail[-4:]) or "(no output)"))


class Setup:
    """The state one provisioning run shares between its steps."""

    def __init__(self, check_only: bool) -> None:
        self.check_only = check_only
        self.log_path = cache.cache_dir() / "setup.log"
        self.prefix = ""

    def say(self, message: str) -> None:
        print(f"[setup] {self.prefix}: {message}", flush=True)

    def _log(self, text: str) -> None:
        if self.check_only:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as f:
            f.write(text)

    def run(self, cmd: list[str], *, cwd: Path | None = None, apt: bool = False,
            ok: tuple[int, ...] = (0,), log: bool = True) -> process.CompletedProcess:
        env = dict(os.environ)
        if apt:
            env.update(DEBIAN_FRONTEND="noninteractive", LC_ALL="C.UTF-8")
        started = time.monotonic()
        try:
            proc = process.capture(cmd, cwd=cwd, env=env, text=True, errors="replace")
        except OSError as e:
            raise StepError(f"`{shlex.join(cmd)}` could not start: {e}") from e
        if log:
            self._log(f"\n$ {shlex.join(cmd)}  (cwd={cwd or os.getcwd()}, exit {proc.returncode}, "
                      f"{time.monotonic() - started:.1f} s)\n{proc.stdout}{proc.stderr}")
        if proc.returncode not in ok:
            raise StepError(failure(cmd, proc))
        return proc

    def need_root(self, what: str) -> None:
        if os.geteuid() != 0:
            raise StepError(f"{what} needs root (run `make setup` as root)")


class Fetch(Setup):
    """Setup's command runner (logged to setup.log) for fetches outside setup (--kernel-package,
    --packages): its progress lines go to the caller's callback."""

    def __init__(self, progress: Callable[[str], None]) -> None:
        super().__init__(check_only=False)
        self.progress = progress

    def say(self, message: str) -> None:
        self.progress(message)


@dataclass
class Step:
    name: str
    check: Callable[[Setup], tuple[bool, str]]  # (done, what is there or what is missing)
    run: Callable[[Setup], str]  # does the work, returns a short description of the result
