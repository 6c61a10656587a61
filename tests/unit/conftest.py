"""Shared unit-test helpers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pfcxl.host_tools.image import CFLAGS, GUEST_SOURCES


def compile_guest_tool(name: str, out_dir: Path) -> Path:
    """Build guest/src/<name>.c exactly as the image builder does; fail (never skip) if it cannot."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc not found on PATH: run 'make setup', which installs gcc and libc6-dev "
                    "(static libc) for building guest tools")
    out = out_dir / name
    cmd = [gcc, *CFLAGS, "-o", str(out), str(GUEST_SOURCES / f"{name}.c")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed (exit {res.returncode}); if it cannot find -lc, "
                    f"libc6-dev (libc.a) is missing: run 'make setup'\n{res.stderr}")
    return out
