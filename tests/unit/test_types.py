"""The type check: mypy passes on the whole package (pyproject.toml [tool.mypy] says what it
covers). It runs through mypy's own API, in this process: a unit test starts no process
(tests/conftest.py). Alone: `.venv/bin/mypy` in the repository's root."""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

import pfcxl

pytestmark = pytest.mark.unit

REPO = Path(pfcxl.__file__).resolve().parent.parent


def test_mypy_finds_no_error(monkeypatch):
    # the config's package walk, exclude pattern and cache directory are relative to the root
    monkeypatch.chdir(REPO)
    out, err, status = api.run(["--config-file", str(REPO / "pyproject.toml")])
    assert status == 0, f"mypy found type errors (run .venv/bin/mypy to see them):\n{out}{err}"
    assert "Success: no issues found" in out, out + err
