"""Shared unit-test helpers."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pfcxl.errors import BuildError
from pfcxl.host_tools import debian_image, image
from pfcxl.serving.chunks import KV_CHUNK_TOKENS


def compile_guest_tool(name: str, out_dir: Path) -> Path:
    """guest/src/<name>.c built by the image builder's own function; fail (never skip) if it cannot."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc not found on PATH: run 'make setup', which installs gcc and libc6-dev "
                    "(static libc) for building guest tools")
    try:
        return image.build_tool(name, out_dir)
    except BuildError as exc:
        pytest.fail(f"{exc}\n(if it cannot find -lc, libc6-dev (libc.a) is missing: run 'make setup')")


def kv_pool(tmp_path: Path, size: int = 64 << 20, hosts: int = 4, slots: int = 256) -> str:
    """A pool file of `size` bytes holding an empty KV store (guest/python/pfcxl_kvstore.py)."""
    path = tmp_path / "pool"
    path.write_bytes(b"")
    os.truncate(path, size)
    debian_image.import_guest_module("pfcxl_kvstore").format(str(path), hosts=hosts, slots=slots,
                                                              chunk_tokens=KV_CHUNK_TOKENS)
    return str(path)
