"""Step 7: the Python virtual environment ($PFCXL_VENV, default <repo>/.venv) with pfcxl installed
editable from this repository, and a stamp recording which pyproject.toml it was installed for.

uv creates the venv and installs into it when it can be had: a `uv` on PATH, or the one setup
installs once with pip from PyPI into a tool venv in the cache (<cache>/tools/uv). With its cache
warm, a fresh clone's venv takes seconds instead of pip's minute and more. The venv is seeded
with pip, so `pip install -e` keeps working in it. Where uv cannot be had (no index reachable, an
unsupported platform) or fails, pip does it as before: `python -m venv`, `pip install -e`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from pfcxl import cache
from pfcxl.host_tools.provision.apt import APT_INSTALL
from pfcxl.host_tools.provision.files import file_digest, read_json, write_json_atomically
from pfcxl.host_tools.provision.runner import Setup, StepError, failure

REPO_ROOT = Path(__file__).resolve().parents[2]  # host_tools/provision/ -> the repository
VENV_STAMP_NAME = ".pfcxl-setup.json"
UV_REQUIREMENT = "uv>=0.8,<1"      # `uv venv --clear --seed`, `uv pip install --python`


def venv_dir() -> Path:
    env = os.environ.get("PFCXL_VENV")
    return Path(env).expanduser().absolute() if env else REPO_ROOT / ".venv"


def pyproject_sha256() -> str:
    return file_digest(REPO_ROOT / "pyproject.toml")


_DIRECT_URL_PROBE = (
    "import importlib.metadata as m\n"
    "try:\n    print(m.distribution('pfcxl').read_text('direct_url.json') or '{}')\n"
    "except m.PackageNotFoundError:\n    print('{}')\n"
)


def editable_from_repo(s: Setup, venv: Path) -> bool:
    """Whether pip recorded pfcxl in `venv` as an editable install of this repository."""
    python = venv / "bin" / "python"
    if not python.exists():
        return False
    try:
        # -I: the repo (cwd) holds a pfcxl.egg-info without direct_url.json that would shadow
        # the installed distribution's metadata
        out = s.run([str(python), "-I", "-c", _DIRECT_URL_PROBE], log=False).stdout
        info = json.loads(out)
    except (StepError, ValueError):
        return False
    return (info.get("url") == REPO_ROOT.as_uri()
            and bool(info.get("dir_info", {}).get("editable")))


def check_python_env(s: Setup) -> tuple[bool, str]:
    venv = venv_dir()
    if not (venv / "bin" / "python").exists():
        return False, f"no venv at {venv}"
    stamp = read_json(venv / VENV_STAMP_NAME)
    if not stamp:
        return False, f"no completed install recorded in {venv / VENV_STAMP_NAME}"
    if stamp.get("repo") != str(REPO_ROOT):
        return False, f"{venv} was set up for {stamp.get('repo')}, not {REPO_ROOT}"
    if stamp.get("pyproject_sha256") != pyproject_sha256():
        return False, f"pyproject.toml changed since the last install into {venv}"
    if not (venv / "bin" / "pfcxl").exists():
        return False, f"{venv / 'bin' / 'pfcxl'} missing"
    if not editable_from_repo(s, venv):
        return False, f"pfcxl is not installed editable from {REPO_ROOT} in {venv}"
    return True, f"pfcxl editable in {venv}"


def create_venv(s: Setup, venv: Path) -> None:
    cmd = [sys.executable, "-m", "venv", "--clear", str(venv)]
    proc = s.run(cmd, ok=tuple(range(256)))
    if proc.returncode == 0:
        return
    if "ensurepip" not in proc.stdout + proc.stderr:
        raise StepError(failure(cmd, proc))
    # Debian splits ensurepip out of python3 into python3-venv / python3.X-venv.
    s.need_root("apt-get install python3-venv")
    minor = f"python3.{sys.version_info.minor}-venv"
    s.say(f"ensurepip missing: apt-get install python3-venv {minor}")
    s.run([*APT_INSTALL, "python3-venv", minor], apt=True)
    s.run(cmd)


def uv_tool_dir() -> Path:
    return cache.cache_dir() / "tools" / "uv"


def find_uv(s: Setup) -> Path | None:
    """A working uv: PATH's, else the cached tool venv's, installed there with pip on first use.
    None (and a line saying why) when it cannot be had: pip does the work then."""
    for candidate in (shutil.which("uv"), uv_tool_dir() / "bin" / "uv"):
        if candidate and Path(candidate).exists():
            try:
                s.run([str(candidate), "--version"], log=False)
                return Path(candidate)
            except StepError:
                continue
    tool = uv_tool_dir()
    s.say(f"installing uv into {tool} (once; later setups reuse it)")
    try:
        s.run([sys.executable, "-m", "venv", "--clear", str(tool)])
        s.run([str(tool / "bin" / "python"), "-m", "pip", "install", "--quiet", UV_REQUIREMENT])
        s.run([str(tool / "bin" / "uv"), "--version"], log=False)
    except StepError as exc:
        s.say(f"no uv ({str(exc).splitlines()[0]}): pip installs the venv instead")
        return None
    return tool / "bin" / "uv"


def install_with_uv(s: Setup, uv: Path, venv: Path) -> bool:
    """A fresh venv (seeded with pip) and the editable install, by uv; False if uv failed."""
    python = venv / "bin" / "python"
    try:
        if not python.exists() or not (venv / "bin" / "pip").exists():
            s.say(f"creating venv {venv} (uv)")
            s.run([str(uv), "venv", "--quiet", "--clear", "--seed", "--python", sys.executable, str(venv)])
        (venv / VENV_STAMP_NAME).unlink(missing_ok=True)
        s.say(f"uv pip install -e '{REPO_ROOT}[test]'")
        s.run([str(uv), "pip", "install", "--quiet", "--python", str(python), "-e", f"{REPO_ROOT}[test]"],
              cwd=REPO_ROOT)
    except StepError as exc:
        s.say(f"uv failed ({str(exc).splitlines()[0]}): pip installs the venv instead")
        return False
    return True


def install_with_pip(s: Setup, venv: Path) -> None:
    if not (venv / "bin" / "python").exists() or not (venv / "bin" / "pip").exists():
        s.say(f"creating venv {venv}")
        create_venv(s, venv)
    (venv / VENV_STAMP_NAME).unlink(missing_ok=True)
    s.say(f"pip install -e '{REPO_ROOT}[test]'")
    s.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-e", f"{REPO_ROOT}[test]"],
          cwd=REPO_ROOT)


def run_python_env(s: Setup) -> str:
    venv = venv_dir()
    uv = None if os.environ.get("PFCXL_NO_UV") else find_uv(s)
    if uv is None or not install_with_uv(s, uv, venv):
        install_with_pip(s, venv)
    if not (venv / "bin" / "pfcxl").exists():
        raise StepError(f"pip install finished but {venv / 'bin' / 'pfcxl'} was not created")
    if not editable_from_repo(s, venv):
        raise StepError(f"pip install finished but pfcxl is not editable from {REPO_ROOT}")
    write_json_atomically(venv / VENV_STAMP_NAME,
                          {"pyproject_sha256": pyproject_sha256(), "repo": str(REPO_ROOT)})
    return f"pfcxl editable in {venv}"

