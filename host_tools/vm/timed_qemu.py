"""The timed QEMU that --clock virtual boots: Debian's QEMU 10.0 source built by setup's timed-qemu
step with pfcxl's patch (host_tools/provision/timed_qemu.py), found through the stamp that step
writes. Light: reads one JSON file."""

from __future__ import annotations

import json
from pathlib import Path

from pfcxl import cache
from pfcxl.errors import VMError

STAMP = "built.json"
# The +ds source ships no firmware: the build boots with Debian's (seabios, qemu-system-data).
FIRMWARE_DIRS = ("/usr/share/seabios", "/usr/share/qemu")


def stamp() -> dict:
    """What the last finished build recorded (binary, source version, patch hash), or {}."""
    try:
        return json.loads((cache.timed_qemu_dir() / STAMP).read_text())
    except (OSError, ValueError):
        return {}


def binary() -> str:
    """The timed QEMU's path; one line saying how to build it when there is none."""
    path = stamp().get("binary")
    if not path or not Path(path).is_file():
        raise VMError("--clock virtual boots QEMU built with pfcxl's virtual-time patch, and there is none in "
                      f"{cache.timed_qemu_dir()}: run `make setup-timed` (builds Debian's QEMU 10.0 source, "
                      "about 25 minutes on 2 cores, once)")
    return str(path)


def firmware_args() -> list[str]:
    return [a for d in FIRMWARE_DIRS for a in ("-L", d)]
