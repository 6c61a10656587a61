"""Where a command's results go by default: `results/[KIND-]<time>-NAME[-TAG]`, or the --out it was given.

The one definition of that naming, so every command's folders sort by time the same way.
"""

from __future__ import annotations

import datetime
from pathlib import Path

ROOT = Path("results")
STAMP = "%Y%m%d-%H%M%S"


def results_dir(out: str | Path | None, name: str, *, kind: str = "", tag: str = "",
                now: datetime.datetime | None = None) -> Path:
    """`out` when given; else results/[kind-]<time>-name[-tag] (nothing is created)."""
    if out:
        return Path(out)
    stamp = (now or datetime.datetime.now()).strftime(STAMP)
    return ROOT / "-".join(p for p in (kind, stamp, name, tag) if p)
