"""Reading a file a user named (a topology, a serving input, a trace, a results.json): its UTF-8
text, or one line in the caller's error class naming the file and what is wrong with it. One
place, so every reader words a missing, unreadable or non-UTF-8 file the same way."""

from __future__ import annotations

import tomllib
from pathlib import Path

from pfcxl.errors import PfcxlError


def read_text(path: Path, error: type[PfcxlError], label: str | None = None) -> str:
    """`path`'s text; `error` if it is missing, a directory, unreadable or not UTF-8. `label` (default
    the path) starts each message: "trace t.jsonl: no such file"."""
    label = label or str(path)
    try:
        return Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError as exc:
        raise error(f"{label}: no such file") from exc
    except IsADirectoryError as exc:
        raise error(f"{label}: is a directory, not a file") from exc
    except OSError as exc:
        raise error(f"{label}: cannot read: {exc.strerror}") from exc
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
