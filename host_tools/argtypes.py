"""Values the command line names, checked: a bad one is one line naming it and the rule.
Numbers are argparse types; directories are checked when the command is about to use them."""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

from pfcxl.device.topology.data_path import DATA_PATHS
from pfcxl.errors import PfcxlError


def _above_zero(text: str, unit: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number{' of ' + unit if unit else ''}") from exc
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text}{' ' + unit if unit else ''}: must be a finite number above 0")
    return value


def seconds(text: str) -> float:
    """A timeout or interval: a finite number of seconds above 0."""
    return _above_zero(text, "seconds")


def positive(text: str) -> float:
    """A load, a factor or a scale: a finite number above 0."""
    return _above_zero(text, "")


def count(text: str) -> int:
    """A number of things to start: a whole number, at least 1."""
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


def writable_dir(path: Path, option: str, mode: int = 0o700) -> None:
    """Create `path` if needed (`mode`: this user's only, as it may hold guest memory) and prove it
    takes files, before anything else is written."""
    try:
        path.mkdir(mode=mode, parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except FileExistsError as exc:
        raise PfcxlError(f"{option} {path}: exists and is not a directory") from exc
    except OSError as exc:
        raise PfcxlError(f"{option} {path}: cannot write there: {exc.strerror}") from exc



def add_data_path(p: argparse.ArgumentParser) -> None:
    """--data-path for every command that boots (pfcxl.device.topology.data_path)."""
    p.add_argument("--data-path", choices=DATA_PATHS,
                   help="how the guest reaches the memory: cxl (the CXL region, emulated I/O), direct (the "
                   "same bytes as an NVDIMM devdax device at guest-RAM speed) or both (default: the "
                   "topology's [guest] data_path, itself cxl by default)")


def packages(text: str) -> tuple[str, ...]:
    """--packages: comma-separated Debian package names (a malformed one: argparse's one line)."""
    from pfcxl.host_tools.image.debian_packages import parse_names
    try:
        return parse_names(text)
    except PfcxlError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--packages: ")) from exc


def add_packages(p: argparse.ArgumentParser) -> None:
    """--packages for every command that takes --image (host_tools/image/debian_packages.py)."""
    p.add_argument("--packages", type=packages, metavar="A,B", default=(),
                   help="more Debian trixie packages in the Debian image (with --image debian), with their "
                   "dependencies, e.g. numactl; downloaded into the cache, the image reused for the same list")


def add_own_qemu(p: argparse.ArgumentParser) -> None:
    """--qemu and --qemu-arg for every command that boots (host_tools/vm/qemu_binary.py)."""
    p.add_argument("--qemu", metavar="PATH", help="the QEMU binary to boot with (10.0 or newer; default "
                   "qemu-system-x86_64 from setup)")
    p.add_argument("--qemu-arg", metavar="ARG", dest="qemu_args", action="append", default=[],
                   help="one more QEMU argument, appended after pfcxl's own (repeatable); one that starts "
                   "with '-' is written with '=': --qemu-arg=-name --qemu-arg=mine")
    kernel = p.add_mutually_exclusive_group()
    kernel.add_argument("--kernel", metavar="PATH", help="boot this kernel: a bzImage/vmlinuz file, or a kernel "
                        "build tree (its arch/x86/boot/bzImage, and vmlinux for the lean PVH entry)")
    kernel.add_argument("--kernel-package", metavar="VERSION", help="boot a Debian kernel package instead: a "
                        "version (6.12.117, 6.12.117-1 or 6.12.117+deb13-amd64) or latest, from bookworm-backports, "
                        "trixie or trixie-backports; downloaded and unpacked into the cache once, each version kept")
    p.add_argument("--modules", metavar="DIR", help="the kernel's modules: an INSTALL_MOD_PATH tree "
                   "(lib/modules/RELEASE); default for a build tree: the tree; the image takes the CXL, DAX, "
                   "NVDIMM and kmem modules and their dependencies from it")


MAX_LOADS = 100         # each load is one replay of the whole trace per system


def loads_list(text: str) -> list[float]:
    parts = text.split(",", MAX_LOADS)
    if len(parts) > MAX_LOADS:
        raise argparse.ArgumentTypeError(f"at most {MAX_LOADS} loads (each is one replay of the trace per system)")
    return [positive(x) for x in parts]
