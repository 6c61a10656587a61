"""The timeline file's host side (device/appliance/timeline.py): bad quanta in one line, a file
made whole or not at all, and its state read back."""

import pytest

from pfcxl.device.appliance import timeline
from pfcxl.errors import PfcxlError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("quantum", [0, 99, 100_001, -5, 1.5, True, "1000"])
def test_a_bad_quantum_is_refused_in_one_line(quantum, tmp_path):
    with pytest.raises(PfcxlError) as exc:
        timeline.create(tmp_path / "timeline", quantum)
    assert "\n" not in str(exc.value) and "100 to 100,000" in str(exc.value)
    assert not list(tmp_path.iterdir())


def test_a_new_timeline_reads_back_and_its_round_size_can_change_between_rounds(tmp_path):
    path = timeline.create(tmp_path / "timeline", 500, expected=2)
    assert path.stat().st_size == timeline.SIZE
    state = timeline.read(path)
    assert (state["quantum_ns"], state["expected"], state["started"], state["hosts"]) == (500, 2, False, [])
    timeline.expect(path, 3)
    assert timeline.read(path)["expected"] == 3
    with pytest.raises(PfcxlError, match="1 to 16"):
        timeline.expect(path, 17)


def test_a_file_that_is_not_a_timeline_is_named(tmp_path):
    bad = tmp_path / "timeline"
    bad.write_bytes(b"x" * 100)
    with pytest.raises(PfcxlError, match="not a timeline"):
        timeline.read(bad)
