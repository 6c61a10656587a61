"""pfcxl.process's /proc/PID/stat reader on real processes that name themselves to mislead a
parser (spaces, parentheses, ') ' with state-like letters, bytes that are not UTF-8), through
running, exited-but-unreaped (zombie) and reaped."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from pfcxl.host_tools.experiments import appliance_timing as bench_appliance_timing
from pfcxl.process import cpu_seconds, is_running, proc_stat

pytestmark = pytest.mark.component

NAMER = r"""
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(bytes.fromhex(sys.argv[1])), 0, 0, 0)   # PR_SET_NAME
print("named", flush=True)
time.sleep(60)
"""
# what a process may call itself (the kernel keeps 15 bytes)
NAMES = [b"a b", b"x) R 1 2 (", b") (", b"\xff\xfe(bad)", b"q) Z 9", b"((((((((((((((("]


@pytest.mark.parametrize("name", NAMES)
def test_real_processes_named_to_mislead(name):
    child = subprocess.Popen([sys.executable, "-c", NAMER, name.hex()], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"named\n"
        s = proc_stat(child.pid)
        assert s is not None
        assert s.comm.encode("utf-8", "surrogateescape") == name
        assert s.pid == child.pid and s.ppid == os.getpid() and s.state in "RS"
        assert s.start > 0 and is_running(child.pid)
        assert cpu_seconds(child.pid) >= 0
        # the benchmark walks every process in /proc: a misleading name anywhere must not stop it
        assert bench_appliance_timing.qemu_seconds() >= 0
    finally:
        child.kill()
    deadline = time.monotonic() + 30           # exited, not yet reaped: a zombie, which has stopped
    while proc_stat(child.pid).state != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc_stat(child.pid).state == "Z" and not is_running(child.pid)
    child.wait()
    assert proc_stat(child.pid) is None and not is_running(child.pid)
    with pytest.raises(FileNotFoundError):
        cpu_seconds(child.pid)
