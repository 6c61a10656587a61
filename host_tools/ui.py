"""The terminal: one console for results (stdout) and one for progress and errors (stderr)."""

from __future__ import annotations

import sys

from rich.console import Console

# Not a terminal (logs, CI): wide enough that tables and addresses are not cut.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def write_output(data: bytes) -> None:
    """A guest command's output to stdout byte for byte (not through rich, which would wrap it
    and would need text), after whatever was printed before it."""
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
