"""Failures explain themselves and leave nothing running."""

import re
import signal
import subprocess
import sys
import time

import pytest

from .conftest import pfcxl_cli, qemu_pids_using

pytestmark = pytest.mark.integration


def assert_no_qemu(run_dir, wait=10.0):
    deadline = time.monotonic() + wait
    while qemu_pids_using(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not qemu_pids_using(run_dir), "QEMU left running"


def test_guest_that_never_gets_ready_times_out_with_console_tail(tmp_path):
    # A wrong init on the kernel command line: the guest runs, but never prints PFCXL-READY. 15 s is
    # ample for the kernel to reach init (about 3 s on a quiet machine), and all of it is waited out.
    done = pfcxl_cli("run", "--run-dir", str(tmp_path), "--timeout", "15",
                     "--append", "loglevel=7 rdinit=/usr/bin/cat", "--", "true", timeout=180)
    assert done.returncode == 5, done.stderr
    assert "Traceback" not in done.stderr
    # pfcxl's init never ran: the error says where the boot stopped
    # how long it waited, and how much of that QEMU was kept from a CPU by a loaded host (not counted)
    assert re.search(r"pfcxl: error: guest: guest did not become ready within 15s: \d+s of wall time, \d+s of "
                     r"which QEMU waited for a CPU the host gave to other processes, at stage 'kernel' \(firmware "
                     r"and kernel: pfcxl's init had not started\)\n", done.stderr), done.stderr
    assert "last console lines:" in done.stderr
    assert "/usr/bin/cat" in done.stderr           # the kernel's own word on what it ran
    assert f"console log: {tmp_path}/guest.console.log" in done.stderr
    assert "command line: qemu-system-x86_64" in done.stderr
    assert_no_qemu(tmp_path)


@pytest.mark.parametrize("init, panic", [
    ("/nonexistent", "Kernel panic - not syncing: VFS: Unable to mount root fs"),
    ("/usr/bin/true", "Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000000"),   # init exits
])
def test_kernel_panic_fails_fast_with_console_tail(tmp_path, init, panic):
    done = pfcxl_cli("run", "--run-dir", str(tmp_path), "--timeout", "300",
                     "--append", f"rdinit={init}", "--", "true", timeout=180)
    assert done.returncode == 5
    first = next(line for line in done.stderr.splitlines() if "error:" in line)
    assert first.startswith("pfcxl: error: guest: kernel panic, at stage 'kernel'"), done.stderr
    assert panic in first
    assert "Traceback" not in done.stderr
    assert_no_qemu(tmp_path)


def _start_long_run(run_dir):
    # Ctrl-C as in a terminal: a test runner started in the background of a shell (`make test &`)
    # runs with SIGINT ignored, its children inherit that, and Python keeps it so (rightly: a
    # background job is not Ctrl-C'd). pfcxl then never sees the signal; that is not what is tested.
    proc = subprocess.Popen([sys.executable, "-m", "pfcxl.host_tools.cli.main", "run", "--run-dir", str(run_dir),
                             "--", "sleep", "600"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    for line in proc.stderr:
        if "guest ready" in line:
            break
        assert time.monotonic() < deadline, "guest did not get ready"
    else:
        pytest.fail(f"pfcxl exited before the guest was ready (status {proc.wait()})")
    assert qemu_pids_using(run_dir), "no QEMU found for the run"
    return proc


def _signals(pid: int) -> str:
    """The process's ignored and blocked signal masks, as /proc shows them."""
    status = open(f"/proc/{pid}/status").read().splitlines()
    return " ".join(line.replace("\t", "") for line in status if line.startswith(("SigIgn", "SigBlk")))


def test_ctrl_c_shuts_the_guest_down(tmp_path):
    proc = _start_long_run(tmp_path)
    masks = _signals(proc.pid)
    proc.send_signal(signal.SIGINT)
    # a guard against a hang, not a timing: the shutdown itself is bounded (QMP quit 10 s, then
    # SIGTERM 5 s, then SIGKILL), but at the end of a full suite on 2 cores 60 s was once too few
    try:
        status = proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)          # pfcxl prints every thread's stack on SIGUSR1
        time.sleep(2)
        proc.kill()
        pytest.fail(f"pfcxl did not exit after SIGINT ({masks}); where it was:\n{proc.stderr.read()}")
    assert status == 130
    assert "interrupted" in proc.stderr.read()
    assert_no_qemu(tmp_path)


def test_sigkill_of_pfcxl_takes_qemu_along(tmp_path):
    proc = _start_long_run(tmp_path)
    proc.kill()
    proc.wait(timeout=30)
    assert_no_qemu(tmp_path)
