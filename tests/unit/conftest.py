"""Shared unit-test helpers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pfcxl.errors import BuildError
from pfcxl.host_tools import image


def compile_guest_tool(name: str, out_dir: Path) -> Path:
    """guest/src/<name>.c built by the image builder's own function; fail (never skip) if it cannot."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc not found on PATH: run 'make setup', which installs gcc and libc6-dev "
                    "(static libc) for building guest tools")
    try:
        return image.build_tool(name, out_dir)
    except BuildError as exc:
        pytest.fail(f"{exc}\n(if it cannot find -lc, libc6-dev (libc.a) is missing: run 'make setup')")
