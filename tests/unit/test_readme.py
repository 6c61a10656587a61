"""The README is the way in: Quick start first, then the first hour (run, demo, bench, serving, the
Python API and the pytest plugin) on its first screen; every doc it names exists; every `pfcxl`
command of its shell blocks and of docs/*.md parses; its Python examples compile."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pfcxl.host_tools.cli import main as cli

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()

pytestmark = pytest.mark.unit


def sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## ", text, flags=re.M)[1:]
    return {p.split("\n", 1)[0]: p for p in parts}


def test_quick_start_then_the_first_hour_on_the_first_screen():
    names = list(sections(README))
    assert names[:2] == ["Quick start (Debian 12, as root)", "Your first hour"], names
    assert README.index("## Your first hour") < len("\n".join(README.splitlines()[:40]))
    first_hour = sections(README)["Your first hour"]
    for thing in ("pfcxl run", "pfcxl demo", "pfcxl bench", "pfcxl serving", "pfcxl.Machine", "pfcxl.Appliance",
                  "pfcxl_machine", "pfcxl_appliance", "host=N"):
        assert thing in first_hour, thing
    assert len(README.splitlines()) < 200       # internals live in docs/


def test_every_doc_the_readme_names_exists():
    named = set(re.findall(r"`(docs/[\w./-]*)`", README))
    assert {"docs/guide.md", "docs/internals.md"} <= named
    for path in named:
        assert (REPO / path).exists(), path


def shell_commands(text: str) -> list[str]:
    return [line.split("  #")[0].strip() for block in re.findall(r"```sh\n(.*?)```", text, re.S)
            for line in block.splitlines() if line.strip().startswith("pfcxl ")]


DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COMMANDS = [(p.name, part.strip()) for p in DOCS for line in shell_commands(p.read_text())
            for part in line.split("&&") if part.strip().startswith("pfcxl ")]


@pytest.mark.parametrize("doc,command", COMMANDS)
def test_every_documented_command_parses(doc, command):
    argv = shlex.split(command)[1:]
    try:
        args = cli.parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{doc}: `{command}` does not parse ({exc})")
    assert callable(args.func)


def test_the_readmes_python_examples_compile():
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) >= 2
    for block in blocks:
        compile(re.sub(r"^   ", "", block, flags=re.M), "README.md", "exec")
