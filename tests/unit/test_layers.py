"""The import contract (docs/ARCHITECTURE.md, "Layers"): imports go down the layers only.

Every import statement of every module, at the top or inside a function, is read with `ast` (no
code runs), resolved to the pfcxl module it names, and checked against the layer rules below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pfcxl

pytestmark = pytest.mark.unit

REPO = Path(pfcxl.__file__).resolve().parent.parent
FOLDERS = ("device", "engines", "firmware_tables", "guest", "host_tools", "serving")

# Lowest first. A module may import its own layer and the layers below it, never one above.
BASE = ("pfcxl.errors", "pfcxl.cache", "pfcxl.process", "pfcxl.compile", "pfcxl.text_files")
# host_tools packages built on pfcxl.Machine / pfcxl.Appliance: several hosts, kept-up machines,
# the benchmark suite, the KV replay and the experiment scripts. The rest of host_tools is what
# the API is built on.
FLEET_AND_BENCH = ("pfcxl.host_tools.fleet", "pfcxl.host_tools.bench", "pfcxl.host_tools.experiments",
                   "pfcxl.host_tools.kv.replay", "pfcxl.host_tools.kv.replay_host", "pfcxl.host_tools.kv.replay_report",
                   "pfcxl.host_tools.kv.replay_guest", "pfcxl.host_tools.kv.replay_mailbox",
                   "pfcxl.host_tools.kv.replay_timing")
LAYERS = [
    ("base", BASE),                                            # errors, the cache, running programs
    ("device", ("pfcxl.device",)),                             # topology, appliance, fabric, trace, facts
    ("tables, guest and serving", ("pfcxl.firmware_tables", "pfcxl.guest", "pfcxl.serving")),
    ("host tools", ("pfcxl.host_tools",)),                     # vm, image, timing, provision
    ("engine plugins", ("pfcxl.engines",)),                    # LMCache, SGLang, vLLM over the guest binding
    ("public API", ("pfcxl", "pfcxl.machine", "pfcxl.appliance", "pfcxl.runs", "pfcxl.pytest_plugin")),
    ("fleet and benchmarks", FLEET_AND_BENCH),
    ("command line", ("pfcxl.host_tools.cli", "pfcxl.host_tools.provision.cli",
                      "pfcxl.host_tools.provision.__main__")),
]


def layer_of(module: str) -> int:
    best, depth = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            hit = module == p or (p != "pfcxl" and module.startswith(p + "."))
            if hit and len(p) > depth:
                best, depth = i, len(p)
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] in FOLDERS:
        parts = ["pfcxl", *parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    found = {}
    for folder in ("pfcxl", *FOLDERS):
        for path in (REPO / folder).rglob("*.py"):
            rel = path.relative_to(REPO).parts
            if folder == "pfcxl" and len(rel) > 2:
                continue                        # pfcxl/<folder> links: the folders themselves
            found[module_name(path)] = path
    return found


def imports_of(module: str, path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from pkg import mod` imports the module pkg.mod; `from mod import name`, the module mod
            named = [f"{target}.{a.name}" for a in node.names]
            modules = [n for n in named if n in MODULES]
            out += [(node.lineno, n) for n in modules] or [(node.lineno, target)]
    return [(line, name) for line, name in out if name.startswith("pfcxl")]


MODULES = package_modules()


def test_the_contract_reads_the_whole_package():
    assert {"pfcxl.machine", "pfcxl.device.topology", "pfcxl.host_tools.cli.main", "pfcxl.host_tools.vm.host",
            "pfcxl.firmware_tables.cedt", "pfcxl.serving.sim", "pfcxl.errors", "pfcxl.engines.lmcache"} <= set(MODULES)
    assert all(layer_of(m) >= 0 for m in MODULES), [m for m in MODULES if layer_of(m) < 0]


def test_the_rules_catch_an_upward_import(tmp_path):
    # the checker itself: a device module importing the CLI and one importing host_tools are caught
    bad = tmp_path / "bad.py"
    bad.write_text("from pfcxl.host_tools import cli\ndef f():\n    from pfcxl.host_tools.vm.host import VM\n")
    found = [(line, name) for line, name in imports_of("pfcxl.device.bad", bad)
             if name in MODULES and layer_of(name) > layer_of("pfcxl.device.bad")]
    assert found == [(1, "pfcxl.host_tools.cli"), (3, "pfcxl.host_tools.vm.host")]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module):
    mine = layer_of(module)
    up = [f"line {line}: {name} ({LAYERS[layer_of(name)][0]})"
          for line, name in imports_of(module, MODULES[module])
          if name in MODULES and layer_of(name) > mine]
    assert not up, f"{module} ({LAYERS[mine][0]}) imports from a layer above it:\n" + "\n".join(up)
