"""guest/tool_output.py, the one reader of the JSON lines in a guest's output, and what each caller
decided a broken line means (an error naming the line, or skipped)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pfcxl.errors import PfcxlError, TimingError
from pfcxl.guest.tool_output import json_lines, tool_json, tool_prefix
from pfcxl.host_tools.bench import suite as bench
from pfcxl.host_tools.experiments import paper_bw_hosts as bench_paper_bw_hosts
from pfcxl.host_tools.timing import calibration
from pfcxl.host_tools.timing import config as timing

pytestmark = pytest.mark.unit

PREFIX = tool_prefix("chase")
values = st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=8), max_size=3)
# a line of console noise: never starts with the prefix (kernel messages, shell lines, other tools)
noise = st.text(st.characters(blacklist_characters="\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
                max_size=30).filter(lambda s: not s.strip().startswith(PREFIX))


def result_line(v: dict) -> str:
    return json.dumps({"tool": "chase", **v}, separators=(",", ":"))


# each line: ("noise", text), ("good", dict) or ("broken", text cut from a good line)
lines = st.lists(st.one_of(st.tuples(st.just("noise"), noise), st.tuples(st.just("good"), values),
                           st.tuples(st.just("broken"), values)), max_size=8)


def render(kind: str, v) -> str:
    if kind == "noise":
        return v
    text = result_line(v)
    return text if kind == "good" else text[:-1]          # cut inside the object: not JSON


@settings(max_examples=150, deadline=None)
@given(lines)
def test_skip_keeps_exactly_the_good_lines_in_order(plan):
    output = "\n".join(render(k, v) for k, v in plan)
    want = [{"tool": "chase", **v} for k, v in plan if k == "good"]
    assert json_lines(output, PREFIX, bad="skip") == want


@settings(max_examples=150, deadline=None)
@given(lines)
def test_raise_names_the_first_broken_line(plan):
    output = "\n".join(render(k, v) for k, v in plan)
    broken = [i for i, (k, _) in enumerate(plan, 1) if k == "broken"]
    if not broken:
        assert len(json_lines(output, PREFIX)) == sum(k == "good" for k, _ in plan)
        return
    with pytest.raises(PfcxlError, match=f"^guest output: line {broken[0]} starts like a JSON result but is not JSON"):
        json_lines(output, PREFIX)


def test_json_that_is_not_an_object_is_not_a_result():
    with pytest.raises(PfcxlError, match="line 2 is JSON but not an object"):
        json_lines("boot\n[1, 2]", "[")
    assert json_lines("boot\n[1, 2]", "[", bad="skip") == []


def test_tagged_lines_drop_their_tag():
    out = 'KVPY {"stored": 3}\nKVPY not json\nother {"x": 1}'
    assert json_lines(out, "KVPY ", tagged=True, bad="skip") == [{"stored": 3}]
    with pytest.raises(PfcxlError, match="the bench: line 2"):
        json_lines(out, "KVPY ", tagged=True, what="the bench")


def test_tool_json_wants_exactly_one_result():
    one = f"[  1.0] cxl: probe\n{result_line({'ns_per_load': 5})}\n# done"
    assert tool_json(one, "chase") == {"tool": "chase", "ns_per_load": 5}
    with pytest.raises(TimingError, match="guest chase printed no JSON line"):
        tool_json("[  1.0] nothing here", "chase", error=TimingError)
    with pytest.raises(PfcxlError, match="printed 2 JSON lines, expected one"):
        tool_json(one + "\n" + result_line({}), "chase")
    assert tool_json(result_line({}).replace("chase", "bandwidth") + "\n" + one, "chase")["ns_per_load"] == 5


# ----------------------------------------------------------------- each caller's decision

BROKEN = '{"tool":"chase","ns_per_load":12'


class FakeVM:
    def __init__(self, output: str):
        self.output = output

    def run(self, command, timeout):
        return type("Done", (), {"status": 0, "output": self.output})()


def test_calibration_refuses_a_broken_result_with_one_line():
    """Before: json.JSONDecodeError, a traceback rather than the timing error the CLI words."""
    with pytest.raises(TimingError, match="guest chase: line 2 starts like a JSON result but is not JSON"):
        calibration.calibrate_baseline(FakeVM("noise\n" + BROKEN), runs=1)
    assert calibration.calibrate_baseline(FakeVM(BROKEN + "}"), runs=1)["baseline_ns"] == 12.0


def test_bench_reports_a_broken_result_as_a_failed_run():
    """The suite goes on: no result (the run is reported failed) rather than an exception."""
    assert bench.parse_output("noise\n" + BROKEN) is None
    assert bench.parse_output(BROKEN + "\n" + BROKEN + "}") == {"tool": "chase", "ns_per_load": 12}


def test_paper_bandwidth_hosts_name_the_host_of_a_broken_line():
    with pytest.raises(PfcxlError, match="host 3's bandwidth output: line 1 starts like a JSON result"):
        bench_paper_bw_hosts._rows('{"tool":"bandwidth","results":[', 3)


def test_plugin_events_skip_the_line_still_being_written(tmp_path):
    log = tmp_path / "guest.plugin.log"
    log.write_text('{"event":"start"}\nplugin: loaded\n{"event":"phase","n":1}\n{"event":"pha')
    assert timing.plugin_events(log) == [{"event": "start"}, {"event": "phase", "n": 1}]
