"""`make test` ends with one line giving the suite's CPU time (tests/suite_cpu.py, printed by
tests/conftest.py): the pytest process's and every reaped child's user and system time."""

from __future__ import annotations

import os
import re

import pytest

from tests import suite_cpu

pytestmark = pytest.mark.unit

LINE = re.compile(r"^suite CPU time: (\d+\.\d) CPU-minutes \(user (\d+):(\d\d), system (\d+):(\d\d); "
                  r"pytest and the children it reaped\) in (\d+):(\d\d) wall$")


def test_the_line_counts_the_children_it_reaped_and_reads_as_minutes():
    start = os.times_result((1.0, 0.5, 10.0, 2.0, 100.0))
    end = os.times_result((31.0, 10.5, 1378.0, 154.0, 1153.0))    # workers: 1368 s user, 152 s system
    text = suite_cpu.line(start, end)
    m = LINE.match(text)
    assert m, text
    assert m[1] == "26.0"                                   # (30 + 10 + 1368 + 152) / 60
    assert (m[2], m[3], m[4], m[5]) == ("23", "18", "2", "42")    # user 1398 s, system 162 s
    assert (m[6], m[7]) == ("17", "33")                     # 1053 s wall
