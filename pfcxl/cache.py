"""Where pfcxl keeps what it downloads and builds, outside the repository.

Standard library only: host_tools/provision imports this before the package is installed.

Layout under $PFCXL_CACHE (default ~/.cache/pfcxl):
    debs/             downloaded .deb files (kernel, trixie userspace), kept for re-unpacking
    apt-trixie/       private apt configuration for Debian trixie (sources, lists, state)
    kernel/           the 6.12 kernel package unpacked with dpkg -x (boot/, lib/modules/<ver>/)
    apt-kernels/      private apt configuration for --kernel-package (bookworm-backports, trixie,
                      trixie-backports)
    kernel-packages/  each kernel --kernel-package took, unpacked with dpkg -x, one directory a version
    guest-root/       trixie's cxl, daxctl, their libraries, libc and loader, unpacked with dpkg -x
    acpica/           trixie's acpica-tools (iasl) with trixie's libc, run through its own loader
    images/           built guest images, named by the hash of their inputs
    qemu-timed/       QEMU built from Debian's source with pfcxl's virtual-time patch (--clock virtual)
    setup.json        what setup installed: kernel release, paths, QEMU version
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    env = os.environ.get("PFCXL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pfcxl"


def debs_dir() -> Path:
    return cache_dir() / "debs"


def trixie_apt_dir() -> Path:
    return cache_dir() / "apt-trixie"


def kernel_dir() -> Path:
    return cache_dir() / "kernel"


def kernels_apt_dir() -> Path:
    return cache_dir() / "apt-kernels"


def kernel_packages_dir() -> Path:
    return cache_dir() / "kernel-packages"


def guest_root_dir() -> Path:
    return cache_dir() / "guest-root"


def acpica_dir() -> Path:
    return cache_dir() / "acpica"


def images_dir() -> Path:
    return cache_dir() / "images"


def manifest_path() -> Path:
    return cache_dir() / "setup.json"


def read_manifest() -> dict:
    """What setup recorded, or {} when setup has not run."""
    try:
        return json.loads(manifest_path().read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def timed_qemu_dir() -> Path:
    """QEMU built from Debian's source with pfcxl's virtual-time patch (setup's timed-qemu step)."""
    return cache_dir() / "qemu-timed"


def write_whole(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all: a temporary file beside it renamed into place, removed on
    any failure, Ctrl-C included, so an interrupted build leaves nothing half-written."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
