"""The CPU time of a pytest run, as `make test` prints it last (tests/conftest.py): user and system
time of the pytest process and of every child it reaped (xdist workers, and the guests, compilers
and daemons they waited for), from os.times() at configure and at unconfigure."""

from __future__ import annotations

import os


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}:{rest:02d}"


def line(start: os.times_result, end: os.times_result) -> str:
    """One line: CPU-minutes in all, user and system, and the wall time between the two readings."""
    user = (end.user - start.user) + (end.children_user - start.children_user)
    system = (end.system - start.system) + (end.children_system - start.children_system)
    wall = end.elapsed - start.elapsed
    return (f"suite CPU time: {(user + system) / 60:.1f} CPU-minutes (user {_clock(user)}, system "
            f"{_clock(system)}; pytest and the children it reaped) in {_clock(wall)} wall")
