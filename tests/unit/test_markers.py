"""Every collected test says what it needs with exactly one of the three markers (tests/conftest.py):
unit, component or integration, and its module sits in the folder of that name (tests/unit holds
only tests that start no process); and `make test-unit` selects the unit tests alone."""

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
    # the folder holds unit tests alone (below), so running it is selecting them
    assert rule is not None and re.search(r"\stests/unit/?(\s|$)", rule[1]), rule and rule[1]


def _module_markers(path: Path) -> list[str]:
    """The markers of a module-level `pytestmark = pytest.mark.X` (read from its syntax tree)."""
    return [node.value.attr for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["pytestmark"]
            and isinstance(node.value, ast.Attribute)]


def misplaced_modules(tests: Path) -> list[str]:
    """The test modules under `tests` whose module-level marker is not the one their folder is
    named after (tests/unit: unit, tests/component: component, tests/integration: integration),
    each with where it belongs."""
    wrong = []
    for path in sorted(tests.rglob("test_*.py")):
        where, found = path.relative_to(tests), _module_markers(path)
        if where.parts[0] not in MARKERS or found != [where.parts[0]]:
            home = f"tests/{found[0]}" if len(found) == 1 and found[0] in MARKERS else f"one of {MARKERS}"
            wrong.append(f"tests/{where} is marked {found}: move it to {home}, marked alike")
    return wrong


def misplaced_tests(marks: dict[str, list[str]]) -> dict[str, list[str]]:
    """Of the collected tests (node id -> their markers among the three), those whose markers are
    not the one of the folder their module sits in (node ids start tests/<folder>/)."""
    def folder(nodeid: str) -> str:
        parts = nodeid.split("::")[0].split("/")
        return parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return {nodeid: found for nodeid, found in marks.items() if found != [folder(nodeid)]}


def test_each_test_module_is_marked_after_its_folder():
    assert misplaced_modules(ROOT / "tests") == []


def test_every_collected_test_is_marked_after_its_folder(request):
    from tests.conftest import MARKS_KEY
    assert misplaced_tests(request.config.stash[MARKS_KEY]) == {}


def test_a_module_in_the_wrong_folder_is_found(tmp_path):
    modules = {"unit/test_pure.py": "unit", "unit/test_starts.py": "component", "component/test_c.py": "component",
               "component/test_u.py": "unit", "integration/test_i.py": "integration", "test_top.py": "unit",
               "unit/deeper/test_d.py": "unit", "integration/test_none.py": None}
    for name, marker in modules.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        mark = f"pytestmark = pytest.mark.{marker}\n" if marker else ""
        (tmp_path / name).write_text(f"import pytest\n\n{mark}\n\ndef test_it():\n    pass\n")
    # "tests/" + ...: the paths of this made-up tree are no citations of the repo's files
    assert misplaced_modules(tmp_path) == ["tests/" + line for line in (
        "component/test_u.py is marked ['unit']: move it to tests/unit, marked alike",
        "integration/test_none.py is marked []: move it to one of ('unit', 'component', 'integration'), marked alike",
        "test_top.py is marked ['unit']: move it to tests/unit, marked alike",
        "unit/test_starts.py is marked ['component']: move it to tests/component, marked alike")]


def test_a_collected_test_in_the_wrong_folder_is_found():
    marks = {"unit/test_a.py::test_ok": ["unit"], "unit/test_a.py::test_slow": ["component"],
             "component/test_b.py::test_ok[1]": ["component"], "component/test_b.py::test_two": [],
             "integration/test_c.py::T::test_ok": ["integration"], "test_d.py::test_top": ["unit"],
             "unit/x/test_e.py::test_deep": ["unit"], "unit/test_f.py::test_both": ["component", "unit"]}
    wrong = misplaced_tests({"tests/" + nodeid: found for nodeid, found in marks.items()})
    assert wrong == {"tests/" + nodeid: marks[nodeid] for nodeid in
                     ("unit/test_a.py::test_slow", "component/test_b.py::test_two", "test_d.py::test_top",
                      "unit/test_f.py::test_both")}
