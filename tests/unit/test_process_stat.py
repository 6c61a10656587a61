"""pfcxl.process's one reader of /proc/PID/stat: every field right whatever the command name holds
(spaces, parentheses, ') ' itself), on made-up lines; real processes: test_process_stat_live.py."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pfcxl.process import is_running, parse_stat, proc_stat

pytestmark = pytest.mark.unit

# proc(5) fields 3..52 after the command name: state, ppid, ..., utime 14, stime 15, starttime 22
REST = ["S", "4242"] + [str(n) for n in range(5, 14)] + ["111", "222"] + [str(n) for n in range(16, 22)] \
    + ["98765"] + [str(n) for n in range(23, 53)]


def stat_line(pid: int, comm: str) -> str:
    return f"{pid} ({comm}) {' '.join(REST)}\n"


@settings(max_examples=300, deadline=None)
@given(pid=st.integers(1, 1 << 22), comm=st.text(st.characters(blacklist_characters="\0"), max_size=40))
def test_every_field_whatever_the_command_name(pid, comm):
    s = parse_stat(stat_line(pid, comm))
    assert (s.pid, s.comm, s.state, s.ppid, s.utime, s.stime, s.start) == (pid, comm, "S", 4242, 111, 222, 98765)


@pytest.mark.parametrize("comm", ["a b", "x) S 1 2 3", ") (", "((", "))", "qemu-system (x86)", " ", ""])
def test_hostile_names_by_hand(comm):
    s = parse_stat(stat_line(7, comm))
    assert s.comm == comm and s.state == "S" and s.start == 98765


@pytest.mark.parametrize("text", ["", "12", "12 (sh", "12 sh) S 1", "12 (sh) S 1 2 3", "(sh) S " + " ".join(REST[1:])])
def test_a_line_that_is_not_stat_is_a_clear_error(text):
    with pytest.raises(ValueError, match="not a /proc/PID/stat line"):
        parse_stat(text)


def test_start_names_one_process():
    """A pid plus its start time tells a process from a later one that reuses the pid."""
    me = proc_stat(os.getpid())
    assert me is not None and me.start == proc_stat(os.getpid()).start
    assert me.start <= time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK")


def test_no_pid_is_not_running():
    assert not is_running(None) and not is_running(0)
