"""pfcxl's TCG plugin (device/plugin/pfcxl_plugin.c): compiled once into the cache, and the
doorbell address its phase markers use."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from pfcxl.device import address_map
from pfcxl.device import trace_format as tf
from pfcxl.device.topology import Topology
from pfcxl.errors import VMError

from . import cache

PLUGIN_DIR = Path(__file__).resolve().parent.parent / "device" / "plugin"
PLUGIN_SOURCES = ("pfcxl_plugin.c", "qemu_plugin_api.h")
PLUGIN_CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden")


class TimingError(VMError):
    """The plugin cannot be built or loaded, or a ring file is not what it should be."""


def plugin_dir() -> Path:
    return cache.cache_dir() / "plugin"


def build_plugin(out_dir: Path | None = None) -> Path:
    """The plugin .so, compiled into the cache and reused until its source or flags change."""
    digest = hashlib.sha256(" ".join(PLUGIN_CFLAGS).encode())
    for name in PLUGIN_SOURCES:
        digest.update((PLUGIN_DIR / name).read_bytes())
    out_dir = out_dir or plugin_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    so = out_dir / f"pfcxl_plugin-{digest.hexdigest()[:16]}.so"
    if so.exists():
        return so.resolve()
    tmp = out_dir / f".{so.name}.{os.getpid()}.tmp"
    try:
        done = subprocess.run(["gcc", *PLUGIN_CFLAGS, "-o", str(tmp), str(PLUGIN_DIR / "pfcxl_plugin.c")],
                              capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise TimingError("building the TCG plugin needs gcc, which is not installed") from exc
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise TimingError(f"gcc could not build {PLUGIN_DIR / 'pfcxl_plugin.c'} "
                          f"(status {done.returncode}):\n{done.stderr.strip()[-3000:]}")
    os.replace(tmp, so)   # atomic: a concurrent build of the same source lands on the same name
    return so.resolve()


def doorbell_hpa(topo: Topology) -> int:
    """Host physical address of the marker line: the last 64 bytes of the first DAX device
    (the guest side, guest/include/pfcxl_mark.h, stores to device offset size - 64)."""
    placements = address_map.dax_placements(topo)
    if not placements:
        raise TimingError(f"topology '{topo.name}' has no region, so no DAX device for the doorbell")
    dax = placements[0]
    return dax.base + dax.size - tf.LINE
