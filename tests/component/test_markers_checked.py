"""The `unit` marker is checked, not trusted (tests/conftest.py): a unit test that starts a process
fails, naming it; the same test marked component passes. Starts processes itself: component."""

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.component

CONFTEST = (Path(__file__).resolve().parents[1] / "conftest.py").read_text()
STARTS = {"subprocess": "import subprocess\n    subprocess.run(['true'], check=True)",
          "fork": "import os\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)",
          "multiprocessing": "import multiprocessing\n    p = multiprocessing.get_context('spawn').Process(target=print)\n"
                             "    p.start()\n    p.join()",
          "system": "import os\n    os.system('true')"}


@pytest.mark.parametrize("how", sorted(STARTS))
def test_a_unit_test_that_starts_a_process_fails_and_a_component_test_does_not(pytester, how):
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    unit: u\n    component: c\n    integration: i\n")
    for marker in ("unit", "component"):
        pytester.makepyfile(**{f"test_{marker}": f"import pytest\n\n@pytest.mark.{marker}\n"
                                                 f"def test_it():\n    {STARTS[how]}\n"})
    pure = "import pytest\n\n@pytest.mark.unit\ndef test_pure():\n    assert sum(range(4)) == 6\n"
    pytester.makepyfile(test_pure=pure)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*test_unit.py::test_it is marked unit but started * process(es)*"
                                 "move its module to tests/component and mark it component*"])
