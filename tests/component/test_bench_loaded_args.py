"""`pfcxl bench`'s options of the guests' loaded-latency curve (host_tools/bench/virtual_loaded.py):
each misuse is one line, before anything boots; the curve itself is booted in
tests/integration/test_timeline.py."""

from __future__ import annotations

import pytest

from . import bounded_cli

pytestmark = pytest.mark.component

CASES = {
    "hosts without an appliance": (["bench", "--hosts", "3"], 1, "--hosts sets the guests' loaded-latency curve"),
    "gaps without an appliance": (["bench", "--gaps", "0,64"], 1, "--gaps sets the guests' loaded-latency curve"),
    "appliance untimed": (["bench", "-t", "pf-appliance"], 1, "give --clock virtual for the guests' loaded-latency"),
    "one host": (["bench", "-t", "pf-appliance", "--clock", "virtual", "--hosts", "1"], 1,
                 "a chasing host and at least one traffic host"),
    "zero hosts": (["bench", "--hosts", "0"], 2, "must be at least 1"),
    "bad gaps": (["bench", "--gaps", "0,fast"], 2, "not a comma-separated list"),
    "negative gap": (["bench", "--gaps", "-4"], 2, "0 to 2^32"),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    return bounded_cli.run_named({name: [*argv, "--out", str(out / name.replace(" ", "-"))]
                                  for name, (argv, _, _) in CASES.items()}), out


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_misused_loaded_curve_option_is_one_line_and_boots_nothing(outcomes, name):
    done, out = outcomes
    _, code, words = CASES[name]
    if code == 1:                                  # pfcxl's own check
        assert words in done[name].one_line_error(code)
    else:                                          # argparse's, naming the subcommand
        lines = done[name].stderr.strip().splitlines()
        assert done[name].rc == 2 and len(lines) == 1 and lines[0].startswith("pfcxl bench: error: "), lines
        assert words in lines[0]
    assert not (out / name.replace(" ", "-")).exists()
