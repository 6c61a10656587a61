"""pfcxl's TCG plugin (device/plugin/pfcxl_plugin.c): compiled once into the cache, and the
doorbell address its phase markers use."""

from __future__ import annotations

from pathlib import Path

from pfcxl.device.topology import address_map
from pfcxl.device.topology import data_path
from pfcxl.device.trace import records as tf
from pfcxl.device.topology import Topology
from pfcxl.errors import TimingError

from pfcxl import cache
from pfcxl.compile import compile_cached

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "device" / "plugin"
PLUGIN_SOURCES = ("pfcxl_plugin.c", "pfcxl_vtime.h", "pfcxl_timeline.h", "pfcxl_timeline_file.h",
                  "qemu_plugin_api.h")
PLUGIN_CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden")


def plugin_dir() -> Path:
    return cache.cache_dir() / "plugin"


def build_plugin(out_dir: Path | None = None) -> Path:
    """The plugin .so, compiled into the cache and reused until its source or flags change."""
    sources = [PLUGIN_DIR / name for name in PLUGIN_SOURCES]
    return compile_cached(PLUGIN_DIR / "pfcxl_plugin.c", sources, PLUGIN_CFLAGS, out_dir or plugin_dir(),
                          "pfcxl_plugin", ".so")


# the plugin's MAX_DOORBELLS (device/plugin/pfcxl_plugin.c)
MAX_DOORBELLS = 32


def doorbell_hpas(topo: Topology) -> list[int]:
    """Physical addresses of the marker lines, the last 64 bytes of a DAX device (the guest side,
    guest/include/pfcxl_mark.h, stores to device offset size - 64): every CXL DAX device's, the
    first first, then each direct device's (its devdax namespace ends where its NVDIMM ends), at
    most MAX_DOORBELLS (the plugin's) in that order. Every device's: a guest program marks and
    empties the modelled caches (chase --cold) through the device it uses, e.g. an appliance
    host's private region (dax1.0), whose doorbell was once unknown to the plugin, so its
    --cold did nothing. A system-ram region has no DAX device to mark through: its memory is the
    kernel's, so it is skipped."""
    devdax = [p for p, r in zip(address_map.dax_placements(topo), topo.regions) if r.mode != "system-ram"]
    cxl = devdax if data_path.has_cxl(topo) else []
    direct = address_map.direct_placements(topo) if data_path.has_direct(topo) else []
    return [p.base + p.size - tf.LINE for p in cxl + direct][:MAX_DOORBELLS]


def doorbell_hpa(topo: Topology) -> int:
    """The first marker line (doorbell_hpas)."""
    lines = doorbell_hpas(topo)
    if not lines:
        raise TimingError(f"topology '{topo.name}' has no devdax region, so no DAX device for the timing "
                          "plugin's doorbell (a system-ram region's memory is the kernel's)")
    return lines[0]
