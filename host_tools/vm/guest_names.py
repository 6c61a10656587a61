"""Names for guests that share a run directory (`pfcxl run --run-dir D` twice at once).

A guest's console log, QEMU log and tables are named after it, so each live guest on a directory
needs its own name. A name is held by an flock on `<name>.lock` for the guest's life: the kernel
drops it when its process ends, so a crashed run never keeps a name taken.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
from pathlib import Path


@contextlib.contextmanager
def guest_name(run_dir: Path, base: str = "guest"):
    """The first of `base`, `base-1`, `base-2`, ... that no live guest on `run_dir` holds."""
    for n in itertools.count():
        name = base if n == 0 else f"{base}-{n}"
        fd = os.open(run_dir / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield name
        finally:
            os.close(fd)
        return
