"""Step 7: the Python virtual environment ($PFCXL_VENV, default <repo>/.venv) with pfcxl installed
editable from this repository, and a stamp recording which pyproject.toml it was installed for."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pfcxl.host_tools.provision.apt import APT_INSTALL
from pfcxl.host_tools.provision.files import file_digest, read_json, write_json_atomically
from pfcxl.host_tools.provision.runner import Setup, StepError, failure

REPO_ROOT = Path(__file__).resolve().parents[2]  # host_tools/provision/ -> the repository
VENV_STAMP_NAME = ".pfcxl-setup.json"


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


def run_python_env(s: Setup) -> str:
    venv = venv_dir()
    if not (venv / "bin" / "python").exists() or not (venv / "bin" / "pip").exists():
        s.say(f"creating venv {venv}")
        create_venv(s, venv)
    (venv / VENV_STAMP_NAME).unlink(missing_ok=True)
    s.say(f"pip install -e '{REPO_ROOT}[test]'")
    # --no-compile: pip would byte-compile every module of every package (about 40% of the
    # install's CPU); Python compiles the few a run imports on first use and keeps them
    s.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-compile", "-e", f"{REPO_ROOT}[test]"],
          cwd=REPO_ROOT)
    if not (venv / "bin" / "pfcxl").exists():
        raise StepError(f"pip install finished but {venv / 'bin' / 'pfcxl'} was not created")
    if not editable_from_repo(s, venv):
        raise StepError(f"pip install finished but pfcxl is not editable from {REPO_ROOT}")
    write_json_atomically(venv / VENV_STAMP_NAME,
                          {"pyproject_sha256": pyproject_sha256(), "repo": str(REPO_ROOT)})
    return f"pfcxl editable in {venv}"

