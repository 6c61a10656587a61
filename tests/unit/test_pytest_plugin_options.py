"""The pfcxl marker's options (pfcxl/pytest_plugin.py): a misspelled key fails the test in one line
naming the key, the closest valid one and all of them, before anything boots, instead of a plain
TypeError from Machine."""

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.unit

MISSPELLED = """
import pytest

@pytest.mark.pfcxl(topolgy="electrical-switch")
def test_machine(pfcxl_machine):
    pass

@pytest.mark.pfcxl(appliance_topolgy="pf-appliance")
def test_appliance(pfcxl_appliance):
    pass

@pytest.mark.parametrize("pfcxl_machine", [{"timming": "count"}], indirect=True)
def test_indirect(pfcxl_machine):
    pass
"""


def test_a_misspelled_marker_key_is_named_with_the_valid_ones(pytester):
    pytester.makepyfile(test_misspelled=MISSPELLED)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly")
    result.assert_outcomes(errors=3)
    text = result.stdout.str()
    for key, close in (("topolgy", "topology"), ("appliance_topolgy", "appliance_topology"), ("timming", "timing")):
        assert f"@pytest.mark.pfcxl: no option '{key}' (did you mean '{close}'?); the options are Machine's " \
               "keywords and appliance_topology: topology, timing, image," in text
    assert "TypeError" not in text and "Traceback" not in text

