"""How the tests are laid out: fixtures are defined in conftest.py files only (a test gets them by
name, never by importing a helper module), and no integration test imports a unit test module."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]


def _is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "fixture"


def test_fixtures_are_defined_in_conftest_or_the_test_module_using_them():
    # a helper module (neither conftest.py nor test_*.py) defines none: its fixtures would reach a
    # test only through an import that linters see as unused
    found = [f"{path.relative_to(TESTS)}:{node.lineno} {node.name}"
             for path in sorted(TESTS.rglob("*.py")) if path.name != "conftest.py" and not path.name.startswith("test_")
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.FunctionDef) and any(_is_fixture(d) for d in node.decorator_list)]
    assert found == []


def test_no_integration_test_imports_a_unit_test_module():
    imports = []
    for path in sorted((TESTS / "integration").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and (node.module.startswith("tests.unit")
                                                                     or (node.level == 2 and node.module.startswith("unit"))):
                imports.append(f"{path.name}:{node.lineno} from {node.module}")
            if isinstance(node, ast.Import):
                imports += [f"{path.name}:{node.lineno} import {a.name}" for a in node.names if a.name.startswith("tests.unit")]
    assert imports == []


def _fixed_strings(function: ast.AST) -> set[str]:
    """The variables a function assigns a string literal to."""
    return {target.id for node in ast.walk(function) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for target in node.targets if isinstance(target, ast.Name)}


def test_no_integration_test_keeps_a_machine_up_under_a_fixed_name():
    # machines kept up share one directory ($PFCXL_CACHE/machines): a fixed name collides when two
    # runs of the suite go at once; the machine_name fixture gives names unique to the process
    fixed = []
    for path in sorted((TESTS / "integration").glob("test_*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef):
                continue
            literals = _fixed_strings(function)
            for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
                args = call.args
                for flag, value in zip(args, args[1:]):
                    if isinstance(flag, ast.Constant) and flag.value == "--name" and (
                            isinstance(value, ast.Constant) or isinstance(value, ast.Name) and value.id in literals):
                        fixed.append(f"{path.name}:{call.lineno}")
    assert fixed == []
