"""Which kernel a guest boots: setup's Debian kernel, or one of the user's (`--kernel PATH` with
`--modules DIR`): a bzImage/vmlinuz file, or a kernel build tree (its arch/x86/boot/bzImage, and
its vmlinux for the lean PVH entry when it is there).

The kernel's release comes from the bzImage's own setup header (Documentation/arch/x86/boot.rst:
the `kernel_version` field points at the version string), so the modules tree is checked against
the kernel that boots, not against a file name.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from pfcxl.errors import ImageError, shown

from pfcxl import cache
from pfcxl.host_tools.image import kernel_pvh

HDRS_OFFSET, HDRS_MAGIC = 0x202, b"HdrS"
KERNEL_VERSION_FIELD = 0x20E        # u16: the version string's offset, minus 0x200
SETUP_AREA = 32 * 1024              # the real-mode setup code, where that string lives
BUILD_TREE_BZIMAGE = Path("arch/x86/boot/bzImage")
RELEASE_RE = re.compile(r"[0-9][A-Za-z0-9.+_~-]*")


@dataclass(frozen=True)
class Kernel:
    """What the image builder and the VM need of a kernel."""

    vmlinuz: Path                  # the bzImage (classic boots)
    pvh: Path | None               # an ELF with a PVH entry (lean boots); None: unpacked from vmlinuz
    modules_dir: Path              # lib/modules/<release>, or a build tree's top
    release: str
    origin: str                    # where it came from, for PFCXL-READY, --dry-run and results.json


def bzimage_release(path: Path) -> str:
    """The release (`uname -r`) a bzImage announces in its setup header; ImageError if it has none."""
    with open(path, "rb") as f:
        head = f.read(SETUP_AREA)
    if head[HDRS_OFFSET:HDRS_OFFSET + 4] != HDRS_MAGIC or len(head) < KERNEL_VERSION_FIELD + 2:
        raise ImageError(f"--kernel {shown(path)}: not a bzImage (no 'HdrS' boot header); give arch/x86/boot/bzImage "
                         "or the build tree")
    at = int.from_bytes(head[KERNEL_VERSION_FIELD:KERNEL_VERSION_FIELD + 2], "little") + 0x200
    text = head[at:at + 256].split(b"\0")[0].decode(errors="replace")
    match = RELEASE_RE.match(text)
    if at <= 0x200 or match is None:
        raise ImageError(f"--kernel {shown(path)}: its boot header has no kernel version string")
    return match.group(0)


def modules_root(modules: Path, release: str) -> Path:
    """lib/modules/<release> of an INSTALL_MOD_PATH tree, or `modules` itself when it is such a
    directory or a build tree (both hold modules.builtin)."""
    for base in ("lib/modules", "usr/lib/modules"):
        if (modules / base / release).is_dir():
            return modules / base / release
    others = sorted(p.name for base in ("lib/modules", "usr/lib/modules") if (modules / base).is_dir()
                    for p in (modules / base).iterdir())
    if others:
        raise ImageError(f"--modules {shown(modules)} holds modules for {', '.join(others)}, but the kernel is {release}")
    if (modules / "modules.builtin").is_file():
        return modules
    raise ImageError(f"--modules {shown(modules)}: no lib/modules/{release} (an INSTALL_MOD_PATH tree) and no "
                     "modules.builtin")


def _pvh_of(bzimage: Path, vmlinux: Path | None) -> Path:
    """The ELF a lean boot starts: the tree's vmlinux when it has the PVH note, else the bzImage's
    payload unpacked into the cache (keyed by the file's hash), else the bzImage itself."""
    if vmlinux is not None and vmlinux.is_file() and kernel_pvh.has_pvh_entry(vmlinux.read_bytes()):
        return vmlinux
    digest = hashlib.sha256(bzimage.read_bytes()).hexdigest()[:20]
    out = cache.images_dir() / "kernels" / f"vmlinux-{digest}.pvh"
    try:
        return kernel_pvh.uncompressed(bzimage, out)
    except ImageError:
        return bzimage          # not zstd or no CONFIG_PVH: the lean command line on the bzImage


def own(kernel: Path | str, modules: Path | str | None) -> Kernel:
    """--kernel PATH [--modules DIR], checked: ImageError in one line naming what is wrong."""
    kernel = Path(kernel).absolute()
    if kernel.is_dir():
        bzimage, vmlinux = kernel / BUILD_TREE_BZIMAGE, kernel / "vmlinux"
        if not bzimage.is_file():
            raise ImageError(f"--kernel {shown(kernel)}: a directory but no {BUILD_TREE_BZIMAGE} (build the kernel first)")
        modules = Path(modules) if modules is not None else kernel
    elif kernel.is_file():
        bzimage, vmlinux = kernel, None
        if modules is None:
            raise ImageError(f"--kernel {shown(kernel)}: a kernel file needs --modules DIR (its INSTALL_MOD_PATH tree)")
        modules = Path(modules)
    else:
        raise ImageError(f"--kernel {shown(kernel)}: no such file or directory")
    if not modules.is_dir():
        raise ImageError(f"--modules {shown(modules)}: no such directory")
    release = bzimage_release(bzimage)
    root = modules_root(modules.absolute(), release)
    return Kernel(bzimage, _pvh_of(bzimage, vmlinux), root, release, f"--kernel {kernel}")


def setup_kernel(manifest: dict) -> Kernel:
    """The Debian kernel `make setup` unpacked (its PVH ELF is unpacked beside it when first booted)."""
    return Kernel(Path(manifest["vmlinuz"]), None, Path(manifest["modules_dir"]), manifest["kernel_release"],
                  f"Debian {manifest.get('kernel_package', 'linux-image')} {manifest.get('kernel_version', '')} "
                  "(make setup)".replace("  ", " "))
