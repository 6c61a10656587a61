"""A QEMU that never answers does not hang pfcxl: its QMP monitor must greet within the launch's
timeout (a `--qemu-arg` chardev with wait=on keeps it silent), a signal ends the wait at once,
and a monitor that never connected is not waited on for a quit it was never sent; a `--qemu`
whose `--version` hangs, or leaves a child holding its output open, is bounded and cleaned up;
a boot that fails keeps the temporary run directory its error names. Fake QEMUs (shell
scripts) stand in, except for the chardev case, which needs the real one."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pfcxl.device import topology
from pfcxl.errors import VMError
from pfcxl.host_tools.image.initramfs import BootImage
from pfcxl.host_tools.vm import host as vm_mod
from pfcxl.host_tools.vm import qemu_binary
from pfcxl.process import is_running

pytestmark = pytest.mark.component

SILENT = "exec sleep 300"          # a QEMU that starts and never greets on QMP


def script(where: Path, body: str, version: str = 'echo "QEMU emulator version 10.0.2"') -> Path:
    path = where / "qemu"
    path.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then\n{version}\nexit 0\nfi\n{body}\n')
    path.chmod(0o755)
    return path


def vm(tmp_path: Path, qemu: str, qemu_args: list[str] | None = None) -> vm_mod.VM:
    return vm_mod.VM(topology.load(topology.resolve("pf-nic")),
                     BootImage(tmp_path / "vmlinuz", tmp_path / "initrd", "6.12.0", False), tmp_path / "run",
                     lean=False, qemu_path=qemu, qemu_args=qemu_args)


@pytest.fixture
def waits(monkeypatch) -> list:
    """The timeouts of every Popen.wait while the test runs: which of shutdown's steps it took."""
    seen: list = []
    real = subprocess.Popen.wait

    def wait(self, timeout=None):
        seen.append(timeout)
        return real(self, timeout)
    monkeypatch.setattr(subprocess.Popen, "wait", wait)
    return seen


@contextlib.contextmanager
def alarm(seconds: float, exception: type[BaseException]):
    """`exception` raised in this thread after `seconds`, as pfcxl's SIGTERM handler raises
    KeyboardInterrupt: a hang the test cannot otherwise bound."""
    def ring(signum, frame):
        raise exception(f"still waiting after {seconds} s")
    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Hang(Exception):
    pass


def killed(pid: int) -> bool:
    """Whether the process is gone within 5 s (a SIGKILLed orphan is gone once init reaps it);
    one that is not is killed here, after the answer, so no test leaves it behind."""
    for _ in range(100):
        if not is_running(pid):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return False


def test_a_monitor_that_never_greets_fails_the_launch_within_its_timeout(tmp_path, waits):
    guest = vm(tmp_path, str(script(tmp_path, SILENT)))
    with alarm(60, Hang), pytest.raises(VMError) as caught:
        guest.launch(timeout=1)
    assert str(caught.value).startswith("guest: QEMU did not start: its QMP monitor did not greet within 1 s")
    assert guest.state is vm_mod.VMState.FAILED and not is_running(guest.pid)
    assert 10 not in waits           # no wait for a QMP quit that was never sent: SIGTERM at once


def test_a_signal_ends_the_wait_for_the_greeting_and_qemu_goes(tmp_path, waits):
    guest = vm(tmp_path, str(script(tmp_path, SILENT)))
    with alarm(1, KeyboardInterrupt), pytest.raises(KeyboardInterrupt):
        guest.launch(timeout=600)
    with alarm(60, Hang):
        guest.shutdown()             # what Machine.close does on the way out
    assert not is_running(guest.pid) and 10 not in waits


def test_qemu_exiting_before_it_greets_is_said(tmp_path):
    guest = vm(tmp_path, str(script(tmp_path, "echo 'qemu: some option is wrong' >&2; exit 1")))
    with alarm(60, Hang), pytest.raises(VMError) as caught:
        guest.launch(timeout=600)
    message = str(caught.value)
    assert "QEMU exited before its QMP monitor greeted (" in message and "exited with status 1" in message
    assert "qemu: some option is wrong" in message


def test_a_chardev_that_waits_for_a_client_fails_the_launch(tmp_path):
    # the real QEMU: it waits for a client of the chardev before its monitor greets
    sock = tmp_path / "w.sock"
    guest = vm(tmp_path, qemu_binary_default(), ["-chardev", f"socket,id=w,path={sock},server=on,wait=on"])
    with alarm(120, Hang), pytest.raises(VMError, match="its QMP monitor did not greet within 2 s"):
        guest.launch(timeout=2)
    assert not is_running(guest.pid)


def qemu_binary_default() -> str:
    from pfcxl.host_tools.vm.qemu import qemu_binary
    return qemu_binary()


def test_a_version_probe_that_hangs_is_bounded_and_killed(tmp_path):
    pid_file = tmp_path / "probe.pid"
    path = script(tmp_path, SILENT, version=f"echo $$ > {pid_file}; exec sleep 300")
    with alarm(60, Hang), pytest.raises(VMError, match=r"'--version' did not answer within 1 s$"):
        qemu_binary.version(str(path), timeout=1)
    assert not is_running(int(pid_file.read_text()))


def test_the_machine_probes_no_longer_than_its_ready_timeout(tmp_path):
    from pfcxl.machine import Machine
    path = script(tmp_path, SILENT, version="exec sleep 300")
    with alarm(50, Hang), pytest.raises(VMError, match=r"did not answer within 2 s$"):
        Machine("pf-nic", qemu=str(path), ready_timeout=2).resolve()


def test_a_child_that_keeps_the_version_output_open_neither_delays_nor_outlives_the_probe(tmp_path):
    pid_file = tmp_path / "child.pid"
    # the child holds stdout open (it inherits it) and runs on after the script has answered
    path = script(tmp_path, SILENT, version=f'sh -c "echo \\$\\$ > {pid_file}; exec sleep 300" &\n'
                                            'while [ ! -s ' + str(pid_file) + ' ]; do sleep 0.05; done\n'
                                            'echo "QEMU emulator version 10.1.0"')
    with alarm(50, Hang):
        assert qemu_binary.version(str(path)) == "10.1.0"
    assert killed(int(pid_file.read_text()))


def test_what_a_qemu_wrapper_leaves_in_its_process_group_goes_with_it(tmp_path):
    pid_file = tmp_path / "left.pid"
    # a wrapper that starts something in the background (its QEMU, say) and exits
    guest = vm(tmp_path, str(script(tmp_path, f'sh -c "echo \\$\\$ > {pid_file}; exec sleep 300" &\n'
                                              f'while [ ! -s {pid_file} ]; do sleep 0.05; done\nexit 0')))
    with alarm(60, Hang), pytest.raises(VMError, match="QEMU exited before its QMP monitor greeted"):
        guest.launch(timeout=600)
    assert killed(int(pid_file.read_text()))


@pytest.mark.parametrize("qemu_body", ["echo 'qemu: cannot start' >&2; exit 1", SILENT])
def test_a_failed_boot_keeps_the_temporary_run_directory_its_error_names(tmp_path, qemu_body, monkeypatch):
    import re
    import tempfile
    from pfcxl.machine import Machine
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))      # the temporary run directory goes here
    said: list[str] = []
    machine = Machine("pf-nic", qemu=str(script(tmp_path, qemu_body)), ready_timeout=2, progress=said.append)
    with alarm(120, Hang), pytest.raises(VMError) as caught:
        machine.start()
    log = Path(re.search(r"^console log: (.*)$", str(caught.value), re.M).group(1))
    qemu_log = Path(re.search(r"^QEMU log: (.*)$", str(caught.value), re.M).group(1))
    assert log.parent.name.startswith("pfcxl-run-") and log.parent.parent == tmp_path
    assert qemu_log.is_file() and f"run directory kept: {log.parent}" in said
    assert list(log.parent.glob("*.mem")) == []                  # kept without the guest's memory
    assert not is_running(machine.pid)


def test_a_qemu_that_exits_at_launch_raises_one_launch_error_with_its_status_argv_and_log(tmp_path):
    from pfcxl.errors import LaunchError
    fake = script(tmp_path, 'echo "qemu-system-x86_64: -device cxl-type3: no such backend" >&2\nexit 3')
    machine = vm(tmp_path, str(fake))
    with pytest.raises(LaunchError) as caught:
        machine.launch(timeout=30)
    error = caught.value
    assert isinstance(error, VMError) and error.exit_code == VMError.exit_code
    assert error.returncode == 3
    assert error.argv[0] == str(fake) and error.argv == machine.argv
    assert "no such backend" in error.log_tail and "no such backend" in str(error)
    assert error.console_tail == "(no console output)"
    assert machine.state is vm_mod.VMState.FAILED
