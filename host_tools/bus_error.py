"""A SIGBUS while a host tool touches a pool file, as one line instead of a dead process.

A pool file is sparse; a page first written where its file system has no room (a full tmpfs such
as /dev/shm) cannot be supplied, and the kernel answers the write with SIGBUS. Python cannot
catch that signal (its handler runs only after the faulting copy returns, which it never does),
so a small C handler (native/bus_error.c, built into the cache like the plugin) prints the line
prepared here, naming the file and its file system, and exits with ApplianceError's status.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from pfcxl.device.appliance import fs_room
from pfcxl.errors import ApplianceError

from pfcxl import cache
from pfcxl.compile import compile_cached

SOURCE = Path(__file__).resolve().parent / "native" / "bus_error.c"
CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-fvisibility=default")


@functools.cache
def _library() -> ctypes.CDLL:
    so = compile_cached(SOURCE, [SOURCE], CFLAGS, cache.cache_dir() / "guard", "bus_error", ".so")
    lib = ctypes.CDLL(str(so))
    lib.pfcxl_bus_error_guard.argtypes = (ctypes.c_char_p, ctypes.c_int)
    lib.pfcxl_bus_error_guard.restype = ctypes.c_int
    return lib


def message(path: Path) -> str:
    return (f"pfcxl: error: {path}: a page of this mapped file could not be had from its file system "
            f"({fs_room.filesystem(path)}; SIGBUS): the file system is full or the file was cut short; "
            "free room there or use a smaller pool")


def guard(path: Path) -> None:
    """From now on, a SIGBUS in this process prints message(path) and exits (the CLI's tools
    map one pool file per run)."""
    if _library().pfcxl_bus_error_guard((message(path) + "\n").encode(), ApplianceError.exit_code):
        raise ApplianceError(f"cannot install the SIGBUS handler for {path}")
