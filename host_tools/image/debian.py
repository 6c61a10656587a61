"""The Python-capable guest: a minimal Debian trixie rootfs (python3, cxl, daxctl from ndctl 81)
made with mmdebstrap into the cache, booted as an initramfs with pfcxl's own init, modules,
tools and plan laid over it (later cpio entries win).

The rootfs tarball is built once per package list (about 20 s, ~120 MB); `image.build(...,
kind="debian")` turns it into archive entries.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from pfcxl.errors import ImageError

from pfcxl import cache
from pfcxl.host_tools.image import cpio
from pfcxl.process import run

SUITE = "trixie"                  # ndctl 81: bookworm's cxl cannot create RAM regions
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "cxl", "daxctl")     # python3, not -minimal: mmap and json live in the stdlib package
EXCLUDED = "path-exclude=/usr/share/{doc,man,locale,info}/*"
GUEST_PYTHON = Path(__file__).resolve().parents[2] / "guest" / "python"


def rootfs_tar(progress=lambda message: None) -> Path:
    """The rootfs tarball for PACKAGES, built with mmdebstrap when missing."""
    key = hashlib.sha256(f"{SUITE} {' '.join(PACKAGES)} {EXCLUDED}".encode()).hexdigest()[:12]
    out = cache.cache_dir() / "debian" / f"{SUITE}-{key}.tar"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    progress(f"building the Debian {SUITE} guest rootfs with mmdebstrap (once, ~20 s)")
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".rootfs-", suffix=".tar")
    os.close(fd)
    try:
        run(["mmdebstrap", "--variant=essential", f"--include={','.join(PACKAGES)}", f"--dpkgopt={EXCLUDED}",
             SUITE, tmp, MIRROR], what="building the Debian guest rootfs (mmdebstrap)", error=ImageError,
            timeout=1800)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def rootfs_entries(tar_path: Path) -> list[cpio.Entry]:
    """The tarball as archive entries: directories, files (hard links become copies), symlinks.
    Device nodes are left out: the guest mounts devtmpfs."""
    entries: list[cpio.Entry] = []
    data_of: dict[str, bytes] = {}
    with tarfile.open(tar_path) as tar:
        for m in tar.getmembers():
            path = str(PurePosixPath(m.name.lstrip("./"))) if m.name not in (".", "./") else ""
            if not path or path == ".":
                continue
            perm = stat.S_IMODE(m.mode)
            if m.isdir():
                entries.append(cpio.Entry.directory(path, perm))
            elif m.issym():
                entries.append(cpio.Entry.symlink(path, m.linkname))
            elif m.islnk():
                target = str(PurePosixPath(m.linkname.lstrip("./")))
                entries.append(cpio.Entry.file(path, data_of.get(target, b""), perm))
            elif m.isreg():
                member = tar.extractfile(m)
                assert member is not None               # a regular file's is always there
                data = member.read()
                data_of[path] = data
                entries.append(cpio.Entry.file(path, data, perm))
    return entries


GUEST_PYTHON_DIR = "usr/lib/pfcxl/python"     # on PYTHONPATH, set by guest/init/init


def python_module_entries() -> list[cpio.Entry]:
    """pfcxl's guest-side Python modules (pfcxl.guest.python on the host), importable as top-level
    modules (`pfcxl_guest`, `pfcxl_kvstore`) by the guest's python3. The package's __init__.py
    stays behind: it only guards the host's package name."""
    dirs = [cpio.Entry.directory(d) for d in ("usr/lib/pfcxl", GUEST_PYTHON_DIR)]
    return dirs + [cpio.Entry.file(f"{GUEST_PYTHON_DIR}/{p.name}", p.read_bytes())
                   for p in sorted(GUEST_PYTHON.glob("*.py")) if p.name != "__init__.py"]
