"""One error tree: every exception class the host side defines derives from PfcxlError,
so the CLI gives each one line and its exit code. Read with `ast` (the engine modules import
engines that only .venv-engines has): a class whose bases are all Python's own exceptions is one
outside the tree. guest/python runs in the guest and cannot import pfcxl: its KVError is
translated where the host calls it (KVStoreError)."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

from pfcxl import errors
from tests.unit.test_layers import MODULES

pytestmark = pytest.mark.unit

BUILTIN_EXCEPTIONS = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
EXEMPT = ("pfcxl.guest.python",)


def outside_the_tree(path: Path) -> list[str]:
    """The classes of a module whose bases are all Python's own exception types."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.bases:
            names = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
            if all(n in BUILTIN_EXCEPTIONS for n in names):
                found.append(f"line {node.lineno}: class {node.name}({', '.join(names)})")
    return found


def test_the_scan_finds_a_class_outside_the_tree(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from pfcxl.errors import PfcxlError\nclass A(ValueError): pass\nclass B(PfcxlError, ValueError): pass\n"
                   "class C(B): pass\nclass D: pass\nclass E(Exception, OSError): pass\n")
    assert outside_the_tree(bad) == ["line 2: class A(ValueError)", "line 6: class E(Exception, OSError)"]


def test_the_base_is_the_one_exception_the_tree_starts_from():
    assert outside_the_tree(MODULES["pfcxl.errors"]) == ["line 8: class PfcxlError(Exception)"]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "pfcxl.errors" and not m.startswith(EXEMPT)))
def test_every_host_side_error_is_a_pfcxl_error(module):
    found = outside_the_tree(MODULES[module])
    assert not found, f"{module} defines errors outside PfcxlError's tree:\n" + "\n".join(found)


def test_the_errors_that_joined_the_tree_keep_the_bases_their_callers_catch():
    from pfcxl.device.appliance.protocol import RequestError
    from pfcxl.host_tools.provision.runner import StepError
    assert issubclass(StepError, errors.SetupError) and StepError("x").exit_code == 3
    assert issubclass(RequestError, errors.ApplianceError) and RequestError("x").exit_code == 7
    assert issubclass(errors.KVStoreError, errors.PfcxlError)
