"""The KV binding (guest/python) is a module of the package: the host imports it as
pfcxl.guest.python.*, no module of the package edits sys.path, and the guest image still gets the
same files, which work there as top-level modules."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

import pfcxl
from pfcxl.guest import python as binding
from pfcxl.host_tools.image import debian as debian_image

pytestmark = pytest.mark.unit

REPO = Path(pfcxl.__file__).resolve().parent.parent
FOLDERS = ("pfcxl", "device", "engines", "firmware_tables", "guest", "host_tools", "serving")
TOP_LEVEL = ("pfcxl_guest", "pfcxl_kvarena", "pfcxl_kvlayout", "pfcxl_kvstore", "pfcxl_poison")
# the host's users of the binding: the CLI, the KV replay, the experiments and the engine plugins
CALL_SITES = ("host_tools/cli/kv.py", "host_tools/kv/replay_host.py", "host_tools/experiments/kv_stress.py",
              "host_tools/experiments/kv_takeover.py", "engines/common.py")


def sys_path_edits(source: str) -> list[int]:
    """Lines that touch `sys.path` (append, insert, assignment, ...) or call site.addsitedir."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                (node.value.id, node.attr) in (("sys", "path"), ("site", "addsitedir")):
            lines.append(node.lineno)
    return lines


def package_files() -> list[Path]:
    return [p for folder in FOLDERS for p in (REPO / folder).rglob("*.py")
            if not (folder == "pfcxl" and len(p.relative_to(REPO).parts) > 2)]     # pfcxl/<folder> links


def test_the_scan_catches_a_sys_path_edit():
    assert sys_path_edits("import sys\nsys.path.append('guest/python')\n"
                          "def f():\n    sys.path[:0] = ['x']\n") == [2, 4]
    assert sys_path_edits("import site\nsite.addsitedir('x')\n") == [2]
    assert sys_path_edits("import os\nos.path.join('a', 'b')\n") == []


def test_no_module_of_the_package_edits_sys_path():
    files = package_files()
    assert REPO / "host_tools/image/debian.py" in files and REPO / "guest/python/pfcxl_kvstore.py" in files
    edits = [f"{p.relative_to(REPO)}:{line}" for p in files for line in sys_path_edits(p.read_text())]
    assert not edits, "these modules edit sys.path (import the package's module instead):\n" + "\n".join(edits)


@pytest.mark.parametrize("path", CALL_SITES)
def test_the_call_sites_import_the_binding_from_the_package(path):
    tree = ast.parse((REPO / path).read_text())
    imported = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert ("pfcxl.guest.python", "pfcxl_kvstore") in imported, f"{path} does not import pfcxl.guest.python"


def test_the_host_gets_the_package_modules_not_top_level_copies():
    from pfcxl.host_tools.cli import kv as cli_kv
    kv = importlib.import_module("pfcxl.guest.python.pfcxl_kvstore")
    assert cli_kv.kv is kv and kv.Arena is importlib.import_module("pfcxl.guest.python.pfcxl_kvarena").Arena
    assert kv.Mapping is importlib.import_module("pfcxl.guest.python.pfcxl_kvlayout").Mapping
    assert not set(TOP_LEVEL) & set(sys.modules), "a guest module was imported under its top-level name"
    with pytest.raises(ImportError, match="import this folder as pfcxl.guest.python, not python"):
        exec(compile((Path(binding.__file__)).read_text(), "__init__.py", "exec"), {"__name__": "python"})


def test_the_guest_image_gets_the_same_files_as_top_level_modules(tmp_path, monkeypatch):
    files = {e.path: e.data for e in debian_image.python_module_entries() if e.data}
    assert files == {f"{debian_image.GUEST_PYTHON_DIR}/{name}.py": (REPO / "guest/python" / f"{name}.py").read_bytes()
                     for name in TOP_LEVEL}
    # the guest's python3 has them on its PYTHONPATH (guest/init/init): import them that way
    for path, data in files.items():
        (tmp_path / Path(path).name).write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        kv = importlib.import_module("pfcxl_kvstore")
        assert kv.__file__ == str(tmp_path / "pfcxl_kvstore.py")
        assert sys.modules["pfcxl_kvlayout"].pfcxl_guest is sys.modules["pfcxl_guest"]
        assert kv.Arena is sys.modules["pfcxl_kvarena"].Arena
        pool = tmp_path / "pool"
        with open(pool, "wb") as f:
            f.truncate(64 << 20)
        kv.format(str(pool), hosts=2, slots=64, chunk_tokens=256)
        with kv.Store.open(str(pool), host=1) as store:
            store.put(b"key", b"block")
            assert store.get(b"key") == b"block"
    finally:
        for name in TOP_LEVEL:
            sys.modules.pop(name, None)
