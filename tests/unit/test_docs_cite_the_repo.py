"""Docs and docstrings point only at files this repository holds, and at no tracker outside it:
a user has only the repo."""

from __future__ import annotations

import pytest
import re
from pathlib import Path

import pfcxl

REPO = Path(pfcxl.__file__).resolve().parent.parent
TEXT_SUFFIXES = {".py", ".md", ".toml", ".c", ".h", ".j2"}
# Paths in QEMU's source tree (cited as QEMU's), and a file a test writes into a clone.
NOT_OURS = ("tests/qtest/", "tests/data/acpi/", "tests/unit/test_probe_clone.py")
# A repo path as docs write it: a top-level folder, then path parts, ending in a file suffix.
CITED = re.compile(r"(?<![\w/.-])((?:docs|device|firmware_tables|guest|host_tools|pfcxl|serving|tests)"
                   r"/[\w./-]*?\.(?:md|py|c|h|toml|j2|jsonl|npy))\b")
OUTSIDE = re.compile(r"\.\./shared/|/work/shared|\bDESIGN\.md\b|\bPLATFORM\.md\b|\bDIGEST\.md\b"
                     r"|\(issues? \d+|\bissue #?\d+\b", re.IGNORECASE)

pytestmark = pytest.mark.unit


def repo_texts() -> list[Path]:
    skip = {".git", ".venv", ".venv-engines", "__pycache__", ".pytest_cache", ".mypy_cache", "results"}
    return sorted(p for p in REPO.rglob("*")
                  if p.suffix in TEXT_SUFFIXES and p.is_file() and not skip & set(p.relative_to(REPO).parts)
                  and p.relative_to(REPO).parts[0] != "pfcxl" or p.parent == REPO / "pfcxl" and p.suffix == ".py")


def test_the_scan_sees_the_docs_and_the_code():
    names = {p.relative_to(REPO).as_posix() for p in repo_texts()}
    assert {"README.md", "docs/ARCHITECTURE.md", "device/topology/__init__.py", "pfcxl/machine.py"} <= names


def test_every_cited_repo_file_exists():
    missing = []
    for path in repo_texts():
        for m in CITED.finditer(path.read_text(errors="replace")):
            cited = m.group(1).rstrip(".")
            placeholder = any(part.split(".")[0].isupper() for part in cited.split("/"))
            if placeholder or cited.startswith(NOT_OURS):
                continue
            # a path under pfcxl/<folder> is the folder itself (pfcxl/device -> ../device)
            if not (REPO / cited).exists():
                missing.append(f"{path.relative_to(REPO)}: {cited}")
    assert not missing, "files cited that the repo does not hold:\n" + "\n".join(missing)


def test_nothing_cites_documents_or_trackers_outside_the_repo():
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}"
             for path in repo_texts() if path.name != Path(__file__).name
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert not found, "citations of things outside the repo:\n" + "\n".join(found)
