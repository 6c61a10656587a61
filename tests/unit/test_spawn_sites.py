"""Every child process starts through pfcxl/process.py, the one spawn helper: no other
module of the package imports subprocess or pty, spawns with pexpect, or calls os.system,
os.popen, os.spawn* or os.exec*/os.fork. Read with `ast` (no code runs), as test_layers reads the
imports. guest/python runs inside the guest, where pfcxl is not installed: it is exempt."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit.test_layers import MODULES

pytestmark = pytest.mark.unit

HELPER = "pfcxl.process"
EXEMPT = ("pfcxl.guest.python",)        # runs in the guest, cannot import pfcxl
# multiprocessing is left out: its workers run pfcxl's own functions (the KV stress hosts), no
# program with an argv to log
MODULES_THAT_START = {"subprocess", "pty"}
OS_CALLS = ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp")
OS_PREFIXES = ("spawn", "exec")
# pexpect's fdspawn drives a socket that is already open (the guest console): it starts nothing
PEXPECT_OK = {"fdspawn"}


def direct_starts(path: Path) -> list[str]:
    """Each line where the module starts a program itself, worded."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] in MODULES_THAT_START]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in MODULES_THAT_START:
            found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner, name = node.value.id, node.attr
            if owner == "os" and (name in OS_CALLS or name.startswith(OS_PREFIXES)):
                found.append(f"line {node.lineno}: os.{name}")
            elif owner in ("pexpect", "fdpexpect") and "spawn" in name and name not in PEXPECT_OK:
                found.append(f"line {node.lineno}: {owner}.{name}")
    return found


def test_the_scan_finds_a_planted_spawn(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import subprocess\nimport os\nfrom pexpect import fdpexpect\nimport pexpect\n"
                   "def f(sock):\n    os.execv('/bin/sh', ['sh'])\n    pexpect.spawn('sh')\n"
                   "    fdpexpect.fdspawn(sock)\n    os.getpid()\n    os.posix_spawn('/bin/true', [], {})\n")
    assert direct_starts(bad) == ["line 1: import subprocess", "line 6: os.execv", "line 7: pexpect.spawn",
                                  "line 10: os.posix_spawn"]


def test_the_helper_itself_is_scanned_and_starts_programs():
    assert direct_starts(MODULES[HELPER])        # the scan would see it: it is the one place


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != HELPER and not m.startswith(EXEMPT)))
def test_no_module_but_the_helper_starts_a_program(module):
    found = direct_starts(MODULES[module])
    assert not found, f"{module} starts a program itself; use pfcxl.process (run, capture, start, spawn):\n" + \
        "\n".join(found)
