"""Reading a file a user named (a topology, a serving input, a trace, a results.json, a firmware
table): its bytes or UTF-8 text, or one line in the caller's error class naming the file and what
is wrong with it. One place, so every reader words a missing, unreadable, oversized, non-regular
or non-UTF-8 file the same way, and none reads without bound (/dev/zero) or waits on a FIFO."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import BinaryIO

from pfcxl.errors import PfcxlError

# The most read_text takes: far above any real topology, input or trace (the bundled Mooncake
# traces are 1 and 3 MiB), far below what would exhaust memory.
MAX_TEXT_BYTES = 1 << 28         # 256 MiB

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def open_regular(path: Path, error: type[PfcxlError], label: str | None = None) -> BinaryIO:
    """`path` opened for reading; `error` if it is missing, a directory, not a regular file (a
    FIFO, a device such as /dev/zero, a socket: refused before a byte is read, so nothing waits on
    a writer or reads forever) or cannot be opened. `label` (default the path) starts each
    message: "trace t.jsonl: no such file"."""
    label = label or str(path)
    try:
        # O_NONBLOCK: opening a FIFO does not wait for a writer (fstat below refuses it)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise error(f"{label}: no such file") from exc
    except OSError as exc:
        kind = _kind(path)
        raise error(f"{label}: {kind}, not a regular file" if kind else f"{label}: cannot read: {exc.strerror}") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(f"{label}: is a directory, not a file" if stat.S_ISDIR(mode)
                    else f"{label}: {_kind_of(mode)}, not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bytes(path: Path, error: type[PfcxlError], label: str | None = None, limit: int = MAX_TEXT_BYTES) -> bytes:
    """`path`'s bytes, at most `limit` of them: open_regular's errors, and `error` if it cannot be
    read or is larger than `limit`."""
    label = label or str(path)
    with open_regular(path, error, label) as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise error(f"{label}: cannot read: {exc.strerror}") from exc
    if len(data) > limit:
        raise error(f"{label}: larger than {_size(limit)}, more than pfcxl reads from such a file; not read")
    return data


def _kind(path: Path) -> str | None:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else _kind_of(mode)


def _kind_of(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 and not limit % (1 << 20) else f"{limit} bytes"


def read_text(path: Path, error: type[PfcxlError], label: str | None = None) -> str:
    """`path`'s text: read_bytes' errors, and `error` if it is not UTF-8."""
    label = label or str(path)
    data = read_bytes(path, error, label, MAX_TEXT_BYTES)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{label}: not UTF-8 text (byte {exc.start})") from exc


def read_toml(path: Path, error: type[PfcxlError], label: str | None = None) -> dict:
    """A TOML file's tables: read_text's errors, and TOML's own named by the file's name."""
    text = read_text(path, error, label)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path.name}: not valid TOML: {exc}") from exc
    except RecursionError as exc:
        raise error(f"{path.name}: not valid TOML here: arrays or tables nested too deeply for Python's "
                    "TOML reader") from exc
