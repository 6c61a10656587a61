"""The file system under a path: its name for messages, and whether it has room for a pool.

A pool file is sparse: creating it takes no room, and every page first written later takes one.
On a file system that runs out (a tmpfs is as large as its `size=`), that write has no error to
return: the process that touches the page gets SIGBUS. So the room is checked before a pool is
made, and host tools name the file system when the signal comes anyway (host_tools/bus_error.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from pfcxl.errors import ApplianceError

from pfcxl.device.topology.units import GiB, MiB


def _existing(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def filesystem(path: Path) -> str:
    """'tmpfs at /dev/shm': the type and mount point of the file system holding `path` (or its
    nearest existing parent)."""
    path = _existing(path)
    dev = os.stat(path).st_dev
    want = f"{os.major(dev)}:{os.minor(dev)}"
    best: tuple[str, str] | None = None
    try:
        with open("/proc/self/mountinfo") as mounts:
            for line in mounts:
                # "25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=..."
                left, _, right = line.partition(" - ")
                fields, kind = left.split(), right.split()[:1]
                if len(fields) < 5 or fields[2] != want or not kind:
                    continue
                point = fields[4].replace("\\040", " ")
                inside = str(path) == point or str(path).startswith(point.rstrip("/") + "/")
                if inside and (best is None or len(point) > len(best[1])):
                    best = (kind[0], point)
    except OSError:
        pass
    return f"{best[0]} at {best[1]}" if best else f"the file system of {path}"


def _size(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def free_bytes(path: Path) -> tuple[int, int]:
    """(bytes an unprivileged writer may still take, total bytes) of the file system of `path`."""
    st = os.statvfs(_existing(path))
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def check_room(path: Path, needed: int, what: str, elsewhere: Path | None = None) -> None:
    """One line naming the file system when `needed` more bytes do not fit under `path`; with
    `elsewhere` (where backing "directory" would put the pool), that place and its room too."""
    free, total = free_bytes(path)
    if needed > free:
        other = ""
        if elsewhere is not None:
            room, _ = free_bytes(elsewhere)
            other = f"backing \"directory\" ({elsewhere}, on {filesystem(elsewhere)}, " + \
                (f"has {_size(room)} free), " if room >= needed else f"has only {_size(room)} free too), ")
        raise ApplianceError(f"{what} needs {_size(needed)} more under {path}, on {filesystem(path)}, which has "
                             f"{_size(free)} free of {_size(total)}: a write past that would kill its writer "
                             f"with SIGBUS; free room there, or give the appliance {other}a smaller pool or backing "
                             "\"memfd\"")
