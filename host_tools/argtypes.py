"""Values the command line names, checked: a bad one is one line naming it and the rule.
Numbers are argparse types; directories are checked when the command is about to use them."""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path


from pfcxl.errors import PfcxlError


def _above_zero(text: str, unit: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number{' of ' + unit if unit else ''}") from exc
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text}{' ' + unit if unit else ''}: must be a finite number above 0")
    return value


def seconds(text: str) -> float:
    """A timeout or interval: a finite number of seconds above 0."""
    return _above_zero(text, "seconds")


def positive(text: str) -> float:
    """A load, a factor or a scale: a finite number above 0."""
    return _above_zero(text, "")


def count(text: str) -> int:
    """A number of things to start: a whole number, at least 1."""
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


def writable_dir(path: Path, option: str, mode: int = 0o700) -> None:
    """Create `path` if needed (`mode`: this user's only, as it may hold guest memory) and prove it
    takes files, before anything else is written."""
    try:
        path.mkdir(mode=mode, parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except FileExistsError as exc:
        raise PfcxlError(f"{option} {path}: exists and is not a directory") from exc
    except OSError as exc:
        raise PfcxlError(f"{option} {path}: cannot write there: {exc.strerror}") from exc



def packages(text: str) -> tuple[str, ...]:
    """--packages: comma-separated Debian package names (a malformed one: argparse's one line)."""
    from pfcxl.host_tools.image.debian_packages import parse_names
    try:
        return parse_names(text)
    except PfcxlError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--packages: ")) from exc


MAX_LOADS = 100         # each load is one replay of the whole trace per system


def loads_list(text: str) -> list[float]:
    parts = text.split(",", MAX_LOADS)
    if len(parts) > MAX_LOADS:
        raise argparse.ArgumentTypeError(f"at most {MAX_LOADS} loads (each is one replay of the trace per system)")
    return [positive(x) for x in parts]


class _OldSpelling(argparse.Action):
    """An option's old spelling: one notice on stderr, then the value goes where the new one's does."""

    def __init__(self, option_strings, dest, new: str = "", **kwargs):
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stderr.write(f"pfcxl: notice: {option_string} is now {self.new} (the old spelling still works)\n")
        setattr(namespace, self.dest, values)


def old_spelling(p: argparse.ArgumentParser, old: str, new: str, **kwargs) -> None:
    """Keep `old` working for the option now spelled `new` (kwargs: its choices, type, ...)."""
    current = next(a for a in p._actions if new in a.option_strings)
    action = p.add_argument(old, dest=current.dest, action=_OldSpelling, new=new, metavar=new.lstrip("-").upper(),
                            help=f"the old spelling of {new} (works, with a notice)", **kwargs)
    if hasattr(current, "boot_field"):          # a boot option's old spelling is the same option
        action.boot_field = current.boot_field  # type: ignore[attr-defined]
