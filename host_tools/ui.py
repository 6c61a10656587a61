"""The terminal: one console for results (stdout) and one for progress and errors (stderr)."""

from __future__ import annotations

import sys

from rich.console import Console

# Not a terminal (logs, CI): wide enough that tables and addresses are not cut.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def verbatim(text: str) -> None:
    """Guest output on stdout as the guest wrote it: no wrapping, markup or highlighting (scripts
    read it; only pfcxl's own tables may wrap)."""
    out.file.flush()
    sys.stdout.write(text)
    sys.stdout.flush()
