"""The engines environment: `<repo>/.venv-engines`, a venv of its own (so the main venv stays small)
with the serving engines pfcxl's plugins are tested against (pfcxl/engines/, docs/kvstore.md
"Serving engines"), CPU only, and pfcxl installed editable from this repository.

`python3 -m pfcxl.host_tools.provision --engines` (make engines; make test runs it). Idempotent:
a stamp records the repository and the pins it was installed for, and the check reads every
pinned distribution's version in the venv, so a missing or wrong one is found and named. pip's
downloads are cached in pip's own cache (~/.cache/pip), outside the repository.

PFCXL_TORCH_INDEX: an index URL for the torch phase alone (PyTorch's CPU wheel index, where the
default index would give the CUDA build).
"""

from __future__ import annotations

import hashlib
import json
import os
import time

from pfcxl.host_tools.provision.files import read_json, write_json_atomically
from pfcxl.host_tools.provision.python_env import REPO_ROOT, create_venv, editable_from_repo
from pfcxl.host_tools.provision.runner import Setup, StepError

ENGINES_VENV = REPO_ROOT / ".venv-engines"
STAMP_NAME = ".pfcxl-engines.json"

# The engines, tested at these versions; sglang and vllm are installed without their dependencies
# (the CUDA stacks they pull in), and with the few their imports need instead (EXTRAS).
TORCH = ("torch", "2.13.0")
ENGINES = (("lmcache", "0.5.6"), ("sglang", "0.5.23"), ("vllm", "0.34.0"))
NO_DEPS = ("sglang", "vllm")
# what sglang.srt.mem_cache.hicache_storage and vllm's KV connector modules import beyond lmcache's
# dependencies, at the versions this environment was measured with
EXTRAS = (("orjson", "3.13.0"), ("pybase64", "1.5.1"), ("triton", "3.9.0"), ("pillow", "13.0.0"),
          ("ipython", "9.18.1"), ("cbor2", "6.3.0"), ("cloudpickle", "3.1.3"), ("uvloop", "0.23.0"),
          ("llguidance", "1.9.1"), ("xgrammar", "0.2.9"))
PINS = (TORCH, *ENGINES, *EXTRAS)


def pins_digest() -> str:
    return hashlib.sha256(json.dumps(PINS).encode()).hexdigest()


def spec(pin: tuple[str, str]) -> str:
    return f"{pin[0]}=={pin[1]}"


_VERSIONS_PROBE = (
    "import importlib.metadata as m, json, sys\n"
    "out = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n        out[name] = m.version(name)\n"
    "    except m.PackageNotFoundError:\n        out[name] = None\n"
    "print(json.dumps(out))\n"
)


def wrong_versions(s: Setup) -> list[str]:
    """One phrase per pinned distribution that is missing from the venv or at another version."""
    python = ENGINES_VENV / "bin" / "python"
    out = s.run([str(python), "-I", "-c", _VERSIONS_PROBE, *(name for name, _ in PINS)], log=False).stdout
    have = json.loads(out)
    # a local version label (torch's "+cpu") is the build, not another version
    return [f"{name} {version} missing" if have.get(name) is None else f"{name} is {have[name]}, not {version}"
            for name, version in PINS if (have.get(name) or "").split("+")[0] != version]


def check_engines_env(s: Setup) -> tuple[bool, str]:
    if not (ENGINES_VENV / "bin" / "python").exists():
        return False, f"no venv at {ENGINES_VENV}"
    stamp = read_json(ENGINES_VENV / STAMP_NAME)
    if not stamp:
        return False, f"no completed install recorded in {ENGINES_VENV / STAMP_NAME}"
    if stamp.get("repo") != str(REPO_ROOT) or stamp.get("pins") != pins_digest():
        return False, f"{ENGINES_VENV} was set up for other pins or another repository"
    try:
        wrong = wrong_versions(s)
    except (StepError, ValueError) as e:
        return False, f"{ENGINES_VENV}/bin/python cannot report its packages: {e}"
    if wrong:
        return False, f"in {ENGINES_VENV}: " + "; ".join(wrong)
    if not editable_from_repo(s, ENGINES_VENV):
        return False, f"pfcxl is not installed editable from {REPO_ROOT} in {ENGINES_VENV}"
    return True, "torch " + TORCH[1] + ", " + ", ".join(f"{n} {v}" for n, v in ENGINES) + f" in {ENGINES_VENV}"


def run_engines_env(s: Setup) -> str:
    python = ENGINES_VENV / "bin" / "python"
    if not python.exists() or not (ENGINES_VENV / "bin" / "pip").exists():
        s.say(f"creating venv {ENGINES_VENV}")
        create_venv(s, ENGINES_VENV)
    (ENGINES_VENV / STAMP_NAME).unlink(missing_ok=True)
    pip = [str(python), "-m", "pip", "install", "--progress-bar", "off"]
    index = os.environ.get("PFCXL_TORCH_INDEX")
    held = [spec(TORCH)]          # every phase names torch's pin, so no resolver swaps it
    phases = [
        ("torch (CPU build)", [*pip, *(["--index-url", index] if index else []), spec(TORCH)]),
        ("lmcache with its dependencies, the engines' import extras",
         [*pip, *held, *(spec(p) for p in ENGINES if p[0] not in NO_DEPS), *(spec(p) for p in EXTRAS)]),
        ("sglang and vllm without their dependencies", [*pip, "--no-deps", *(spec(p) for p in ENGINES if p[0] in NO_DEPS)]),
        ("pfcxl editable", [*pip, *held, "-e", str(REPO_ROOT)]),
    ]
    for number, (what, cmd) in enumerate(phases, 1):
        started = time.monotonic()
        s.say(f"{number}/{len(phases)} pip install {what}")
        s.run(cmd, cwd=REPO_ROOT)
        s.say(f"{number}/{len(phases)} done in {time.monotonic() - started:.0f} s")
    if wrong := wrong_versions(s):
        raise StepError(f"pip install finished but in {ENGINES_VENV}: " + "; ".join(wrong))
    if not editable_from_repo(s, ENGINES_VENV):
        raise StepError(f"pip install finished but pfcxl is not editable from {REPO_ROOT} in {ENGINES_VENV}")
    write_json_atomically(ENGINES_VENV / STAMP_NAME, {"pins": pins_digest(), "repo": str(REPO_ROOT)})
    return "torch " + TORCH[1] + ", " + ", ".join(f"{n} {v}" for n, v in ENGINES) + f" in {ENGINES_VENV}"
