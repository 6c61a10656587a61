"""A real pytest run with an xdist worker ends with the suite CPU time line (tests/conftest.py
loaded as a plugin), and the line counts the worker, a reaped child: its test burns 3 CPU-seconds
that the controller never spends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_suite_cpu_time import LINE

pytestmark = pytest.mark.component

ROOT = Path(__file__).resolve().parents[2]
BURN = '''
import time
def test_burn():
    end = time.process_time() + 3.0
    while time.process_time() < end:
        pass
'''


def test_a_run_with_a_worker_ends_with_the_cpu_line_counting_the_worker(tmp_path):
    (tmp_path / "test_burn.py").write_text(BURN)
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "1", "-q", "-p", "no:cacheprovider",
                          "-p", "tests.conftest", "--rootdir", str(tmp_path), str(tmp_path / "test_burn.py")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    last = run.stdout.strip().splitlines()[-1]
    m = LINE.match(last)
    assert m, run.stdout
    cpu = int(m[2]) * 60 + int(m[3]) + int(m[4]) * 60 + int(m[5])
    assert cpu >= 3, last                                   # the worker's 3 CPU-seconds
