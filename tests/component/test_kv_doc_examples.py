"""Every `pfcxl kv` example in README.md and docs/*.md runs as written: each document's
`pfcxl appliance start` and `pfcxl kv ...` lines, in order, against a pf-appliance of its own (a
private PFCXL_CACHE, so its default run directory and pool are the test's), then stopped. A
command the docs show must exit 0; the examples are read from the documents, not copied here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.component


def kv_examples(doc: str) -> list[str]:
    """The `pfcxl appliance start` and `pfcxl kv` commands of the document's sh blocks that show
    `pfcxl kv`, in order (a line's `&&`-joined commands one by one, comments dropped)."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", (REPO / doc).read_text(), re.S):
        if "pfcxl kv " not in block:
            continue
        for line in block.splitlines():
            for command in line.split("#")[0].split("&&"):
                command = command.strip()
                if command.startswith(("pfcxl kv ", "pfcxl appliance start")):
                    commands.append(command)
    return commands


DOCS = [str(p.relative_to(REPO)) for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
        if kv_examples(str(p.relative_to(REPO)))]


def test_the_docs_show_kv_examples():
    assert "docs/kvstore.md" in DOCS and len(DOCS) >= 2, DOCS


@pytest.mark.parametrize("doc", DOCS)
def test_every_documented_kv_example_runs(doc, tmp_path):
    commands = kv_examples(doc)
    assert any(c.startswith("pfcxl kv bench") for c in commands), f"{doc} shows no kv bench example"
    assert commands[0].startswith("pfcxl appliance start"), commands
    # a short cache path: the appliance's control socket lives under it (108 bytes at most)
    cache = Path(tempfile.mkdtemp(prefix="kvdoc-", dir="/tmp"))
    env = {**os.environ, "PFCXL_CACHE": str(cache),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    try:
        for command in commands:
            done = subprocess.run(command, shell=True, env=env, cwd=tmp_path, capture_output=True, text=True)
            assert done.returncode == 0, f"{doc}: `{command}` exited {done.returncode}:\n{done.stderr}"
    finally:
        subprocess.run("pfcxl appliance stop", shell=True, env=env, capture_output=True)
        shutil.rmtree(cache, ignore_errors=True)
