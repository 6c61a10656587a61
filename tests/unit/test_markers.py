"""Every collected test says what it needs with exactly one of the three markers (tests/conftest.py):
unit, component or integration; and `make test-unit` selects the unit tests alone."""

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

MARKERS = ("unit", "component", "integration")
ROOT = Path(__file__).resolve().parents[2]


def test_every_collected_test_has_exactly_one_marker(request):
    from tests.conftest import MARKS_KEY
    marks = request.config.stash[MARKS_KEY]
    assert request.node.nodeid in marks                   # the record holds this session's tests
    wrong = {nodeid: found for nodeid, found in marks.items() if len(found) != 1}
    assert wrong == {}, f"tests without exactly one of {MARKERS}: {wrong}"


def test_the_markers_are_registered_and_make_test_unit_selects_unit_alone(request):
    registered = {line.split(":")[0] for line in request.config.getini("markers")}
    assert set(MARKERS) <= registered
    rule = re.search(r"^test-unit:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert rule is not None and re.search(r'-m "?unit"?(\s|$)', rule[1]), rule and rule[1]


def _module_markers(path: Path) -> list[str]:
    """The markers of a module-level `pytestmark = pytest.mark.X` (read from its syntax tree)."""
    return [node.value.attr for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["pytestmark"]
            and isinstance(node.value, ast.Attribute)]


def test_each_integration_module_is_marked_integration_and_each_unit_folder_module_is_not():
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        found = _module_markers(path)
        if path.parent.name == "integration":
            assert found == ["integration"], path
        else:
            assert found in (["unit"], ["component"]), path
