"""A user's own QEMU (`--qemu PATH`, `Machine(qemu=...)`): found, asked its version, refused in one
line when it cannot boot pfcxl's topologies (older than 10.0: no volatile-memdev Type 3 devices,
generic ports or the QMP error injection the CLI uses). Light: the CLI imports it to build options."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from pfcxl.errors import VMError, shown
from pfcxl.process import TimeoutExpired, probe

MIN_VERSION = (10, 0)
VERSION_TIMEOUT = 60    # seconds for `--version`, at most (Machine: no more than its ready timeout)
VERSION_RE = re.compile(r"QEMU emulator version (\d+)\.(\d+)(?:\.(\d+))?")


def resolve(value: str | os.PathLike) -> str:
    """A path (made absolute, so a daemon in another directory execs the same file) or a bare
    name looked up on PATH, as a shell would."""
    text = os.fspath(value)
    if not text:
        raise VMError("--qemu: empty path")
    if "/" not in text:
        found = shutil.which(text)
        if found is None:
            raise VMError(f"--qemu {shown(text)}: no such program on PATH")
        return found
    return str(Path(text).absolute())


def version(path: str, timeout: float = VERSION_TIMEOUT) -> str:
    """`path --version`'s version, e.g. '10.0.2'; VMError in one line when it is not a QEMU
    that runs, does not answer within `timeout` seconds, or is older than MIN_VERSION. Whatever
    the program started is gone when this returns (process.probe)."""
    if not os.path.isfile(path):
        raise VMError(f"--qemu {shown(path)}: no such file")
    if not os.access(path, os.X_OK):
        raise VMError(f"--qemu {shown(path)}: not executable")
    try:
        status, said = probe([path, "--version"], timeout)
    except OSError as exc:
        raise VMError(f"--qemu {shown(path)}: cannot run it: {exc.strerror or exc}") from exc
    except TimeoutExpired as exc:
        raise VMError(f"--qemu {shown(path)}: '--version' did not answer within {timeout:g} s") from exc
    match = VERSION_RE.search(said)
    if status != 0 or match is None:
        said = " ".join(said.split())[:120] or "nothing"
        raise VMError(f"--qemu {shown(path)}: not a QEMU ('--version' exited {status} and said: {said})")
    major, minor, micro = int(match[1]), int(match[2]), match[3]
    found = f"{major}.{minor}" + (f".{micro}" if micro is not None else "")
    if (major, minor) < MIN_VERSION:
        raise VMError(f"--qemu {shown(path)} is QEMU {found}; pfcxl needs QEMU "
                      f"{MIN_VERSION[0]}.{MIN_VERSION[1]} or newer")
    return found
