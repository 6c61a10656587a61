"""`kill -USR1` on a pfcxl that seems stuck prints where each of its threads is, and it goes on."""

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.component


def test_sigusr1_prints_the_stacks_and_the_command_goes_on(tmp_path):
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    # a --qemu whose version probe waits until the test writes the FIFO: a command waiting on something
    qemu = tmp_path / "qemu"
    qemu.write_text(f"#!/bin/sh\nread x < {fifo}\necho not a qemu\n")
    qemu.chmod(0o755)
    proc = subprocess.Popen([sys.executable, "-m", "pfcxl.host_tools.cli.main", "run", "--qemu", str(qemu),
                             "--", "true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while "SigCgt" not in (status := open(f"/proc/{proc.pid}/status").read()) or \
                not int(status.split("SigCgt:")[1].split()[0], 16) & (1 << (signal.SIGUSR1 - 1)):
            assert time.monotonic() < deadline and proc.poll() is None, "pfcxl never took SIGUSR1"
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        assert proc.poll() is None                          # the dump did not end it
        with open(fifo, "w") as w:                          # now let it go on: a QEMU it refuses
            w.write("go\n")
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "Current thread" in err or "Thread 0x" in err, err
    assert "main.py" in err                                 # the frames of pfcxl's own code
    assert proc.returncode not in (0, -signal.SIGUSR1) and "pfcxl: error:" in err
