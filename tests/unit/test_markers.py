"""Every collected test says what it needs with exactly one of the three markers (tests/conftest.py):
unit, component or integration; and `make test-unit` selects the unit tests alone."""

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


def test_each_integration_module_is_marked_integration_and_each_unit_folder_module_is_not():
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        found = re.findall(r"^pytestmark = pytest\.mark\.(\w+)$", path.read_text(), re.M)
        if path.parent.name == "integration":
            assert found == ["integration"], path
        else:
            assert found in (["unit"], ["component"]), path
