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
BASE = ("pfcxl.errors", "pfcxl.cache", "pfcxl.process", "pfcxl.compile", "pfcxl.text_files", "pfcxl.renamed")
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
    ("public API", ("pfcxl", "pfcxl.machine", "pfcxl.appliance", "pfcxl.pytest_plugin")),
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


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module -> the package modules it imports (every import statement, type-only included)."""
    return {m: {name for _, name in imports_of(m, path) if name in modules and name != m}
            for m, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative): each
    is a set of modules that import each other in a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    group.append(top)
                    if top == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_cycle_check_finds_a_circle_through_a_lazy_and_a_type_only_import(tmp_path):
    # a imports b at the top, b imports c inside a function, c imports a for the type checker only
    texts = {"a": "from pfcxl.device import b\n",
             "b": "def f():\n    from pfcxl.device import c\n",
             "c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pfcxl.device.a import X\n",
             "d": "from pfcxl.device import a\n"}
    planted = {}
    for name, text in texts.items():
        (tmp_path / f"{name}.py").write_text(text)
        planted[f"pfcxl.device.{name}"] = tmp_path / f"{name}.py"
    global MODULES
    saved, MODULES = MODULES, {**MODULES, **planted}       # imports_of resolves names against MODULES
    try:
        graph = import_graph(planted)
    finally:
        MODULES = saved
    assert cycles(graph) == [["pfcxl.device.a", "pfcxl.device.b", "pfcxl.device.c"]]


def test_no_modules_import_each_other_in_a_circle():
    found = cycles(import_graph(MODULES))
    assert not found, "modules that import each other in a circle:\n" + "\n".join(", ".join(c) for c in found)
