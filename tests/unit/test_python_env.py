"""Setup's Python environment (host_tools/provision/python_env.py): uv makes the venv (seeded with
pip) and installs pfcxl editable when it can be had, from PATH or installed once into the cache's
tool venv; where uv cannot be had or fails, pip does it as before. The commands are recorded by a
Setup whose run() starts nothing: the install's effects (the venv's python, pip and pfcxl) are
made by hand where the real command would make them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pfcxl.host_tools.provision import python_env
from pfcxl.host_tools.provision.runner import Setup, StepError

pytestmark = pytest.mark.unit


class Recorder(Setup):
    def __init__(self, venv: Path, fail: tuple[str, ...] = ()) -> None:
        super().__init__(check_only=False)
        self.venv, self.fail, self.commands, self.lines = venv, fail, [], []

    def say(self, message: str) -> None:
        self.lines.append(message)

    def run(self, cmd, *, cwd=None, apt=False, ok=(0,), log=True):
        text = " ".join(map(str, cmd))
        self.commands.append(text)
        if any(f in text for f in self.fail):
            raise StepError(f"`{text}` exited 1: refused by the test")
        if text.endswith(f"venv --clear {self.venv}") or " venv --quiet --clear --seed " in text:
            for name in ("python", "pip"):
                (self.venv / "bin").mkdir(parents=True, exist_ok=True)
                (self.venv / "bin" / name).touch()
        if " install " in text and "[test]" in text:
            (self.venv / "bin" / "pfcxl").touch()
        return subprocess.CompletedProcess(cmd, 0, "", "")


@pytest.fixture
def where(tmp_path, monkeypatch):
    venv, bin_dir = tmp_path / "venv", tmp_path / "path"
    bin_dir.mkdir()
    monkeypatch.setenv("PFCXL_VENV", str(venv))
    monkeypatch.setenv("PFCXL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("PFCXL_NO_UV", raising=False)
    monkeypatch.setattr(python_env, "editable_from_repo", lambda s, v: (v / "bin" / "pfcxl").exists())
    return venv, bin_dir


def put_uv_on_path(bin_dir: Path) -> Path:
    uv = bin_dir / "uv"
    uv.write_text("#!/bin/sh\nexit 0\n")
    uv.chmod(0o755)
    return uv


def pip_commands(s: Recorder) -> list[str]:
    return [c for c in s.commands if " -m pip install -e " in c or f"-m venv --clear {s.venv}" in c]


def test_uv_on_path_makes_a_seeded_venv_and_installs_editable_and_pip_is_not_used(where):
    venv, bin_dir = where
    uv = put_uv_on_path(bin_dir)
    s = Recorder(venv)
    python_env.run_python_env(s)
    assert s.commands == [
        f"{uv} --version",
        f"{uv} venv --quiet --clear --seed --python {sys.executable} {venv}",
        f"{uv} pip install --quiet --python {venv}/bin/python -e {python_env.REPO_ROOT}[test]"]
    assert (venv / python_env.VENV_STAMP_NAME).exists()


def test_without_uv_it_is_installed_once_into_the_cache_and_used(where):
    venv, _ = where
    s = Recorder(venv)
    python_env.run_python_env(s)
    tool = python_env.uv_tool_dir()
    assert str(tool).startswith(str(Path(python_env.cache.cache_dir())))
    assert s.commands[:3] == [f"{sys.executable} -m venv --clear {tool}",
                              f"{tool}/bin/python -m pip install --quiet {python_env.UV_REQUIREMENT}",
                              f"{tool}/bin/uv --version"]
    assert s.commands[3].startswith(f"{tool}/bin/uv venv ") and s.commands[4].startswith(f"{tool}/bin/uv pip install")
    assert pip_commands(s) == []


@pytest.mark.parametrize("refused", ["pip install --quiet uv", "uv pip install", "uv venv"])
def test_where_uv_cannot_be_had_or_fails_pip_installs_the_venv(where, refused):
    venv, _ = where
    s = Recorder(venv, fail=(refused,))
    assert python_env.run_python_env(s) == f"pfcxl editable in {venv}"
    assert pip_commands(s)[-1] == f"{venv}/bin/python -m pip install -e {python_env.REPO_ROOT}[test]"
    assert any("pip installs the venv instead" in line for line in s.lines)
    assert (venv / python_env.VENV_STAMP_NAME).exists()


def test_pfcxl_no_uv_uses_pip_alone(where, monkeypatch):
    venv, bin_dir = where
    put_uv_on_path(bin_dir)
    monkeypatch.setenv("PFCXL_NO_UV", "1")
    s = Recorder(venv)
    python_env.run_python_env(s)
    assert s.commands == [f"{sys.executable} -m venv --clear {venv}",
                          f"{venv}/bin/python -m pip install -e {python_env.REPO_ROOT}[test]"]
