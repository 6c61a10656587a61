"""Unpacking downloaded .debs into the cache: control fields, dpkg -x into a temporary tree that
is verified and then swapped in whole (a stamp file records what it holds), merged /usr."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

from pfcxl.host_tools.provision.files import write_json_atomically
from pfcxl.host_tools.provision.runner import Setup

STAMP_NAME = ".pfcxl-stamp.json"  # in each unpacked tree: what it was unpacked from
MERGED_USR_DIRS = ("bin", "sbin", "lib", "lib64")


def deb_fields(s: Setup, deb: Path) -> tuple[str, str]:
    """(Package, Version) from the control file of `deb`."""
    out = s.run(["dpkg-deb", "-f", str(deb), "Package", "Version"]).stdout
    fields = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    return fields.get("Package", ""), fields.get("Version", "")


def merge_into(src: Path, dst: Path) -> None:
    """Move src's entries into dst (recursively); dst's entry wins a clash (it is canonical)."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in src.iterdir():
        target = dst / entry.name
        if entry.is_dir() and not entry.is_symlink() and target.is_dir() and not target.is_symlink():
            merge_into(entry, target)
        elif not (target.exists() or target.is_symlink()):
            os.rename(entry, target)
    shutil.rmtree(src)


def ensure_merged_usr(root: Path) -> None:
    """bin, sbin, lib, lib64 at the top of `root` become symlinks into usr/, as on Debian."""
    for name in MERGED_USR_DIRS:
        top, target = root / name, root / "usr" / name
        if top.is_symlink():
            continue
        target.mkdir(parents=True, exist_ok=True)
        if top.is_dir():
            merge_into(top, target)
        top.symlink_to(f"usr/{name}")


def unpack_atomically(s: Setup, debs: list[Path], dest: Path,
                      finish: Callable[[Path], None], stamp: dict) -> None:
    """dpkg -x every deb into a temp dir next to `dest`, finish/verify it, then swap it in."""
    parent = dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    for kind in ("tmp", "old"):  # left behind by an interrupted run
        for stale in parent.glob(f".{dest.name}.{kind}-*"):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = parent / f".{dest.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        for deb in debs:
            s.run(["dpkg", "-x", str(deb), str(tmp)])
        finish(tmp)
        write_json_atomically(tmp / STAMP_NAME, stamp)
        old = parent / f".{dest.name}.old-{os.getpid()}"
        if dest.exists() or dest.is_symlink():
            os.rename(dest, old)
        os.rename(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)

