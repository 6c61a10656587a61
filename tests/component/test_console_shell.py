"""The command scripts of host_tools/vm/console.py against a real interactive busybox sh on a real
terminal (a pty), the guest console's own shell and line discipline without a guest
(commands ending, output bytes). The same runs on a booted guest: tests/integration/test_console.py."""

from __future__ import annotations

import os
import pty
import signal
import socket
import subprocess
import time

import pytest

from pfcxl.host_tools.vm.console import CommandRunner, Console

BUSYBOX = "/bin/busybox"

pytestmark = pytest.mark.component


class Terminal:
    """The pty's master side, as Console reads and writes a socket."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def recv(self, n: int) -> bytes:
        try:
            return os.read(self.fd, n)
        except OSError:               # EIO: the shell is gone
            return b""

    def sendall(self, data: bytes) -> None:
        while data:
            data = data[os.write(self.fd, data):]


def busybox_shell(home, port: bool) -> tuple[int, int, socket.socket]:
    """`busybox sh` on a pty of its own (pid, the pty's master, our end of the port socket), with
    the signal dispositions a guest's init leaves: Python ignores SIGPIPE and an exec keeps that,
    and with it ignored busybox's `yes` can spin on EPIPE after `head` has gone (seen: one run in
    about 50 stalled until its limit)."""
    ours, theirs = socket.socketpair()
    pid, fd = pty.fork()
    if pid == 0:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.chdir(home)
        if port:
            os.dup2(theirs.fileno(), 9)
        os.execve(BUSYBOX, ["sh"], {"PATH": "/usr/bin:/bin", "HOME": str(home), "PS1": "# ", "TERM": "linux"})
    theirs.close()
    return pid, fd, ours


@pytest.fixture(params=["serial", "port"])
def shell(tmp_path, request):
    """A CommandRunner on `busybox sh` (interactive, job control) in a pty of its own; "port" gives
    the shell descriptor 9 on a socket, as guest/init does with the virtio-serial port, and the
    output comes over that."""
    pid, fd, ours = busybox_shell(tmp_path, request.param == "port")
    log = open(tmp_path / "console.log", "wb")
    runner = CommandRunner(Console(Terminal(fd), log), Console(ours, None) if request.param == "port" else None)
    yield runner
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(fd)
    ours.close()
    log.close()


def run(runner: CommandRunner, command: str, limit: float) -> tuple[bytes, str]:
    return runner.finish(runner.start(command, limit), limit + 60)


def sleepers(marker: str) -> list[str]:
    found = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if marker in line and "ps -eo" not in line]


def test_every_byte_value_comes_back_as_written(shell):
    # each of the 256 values, in one printf: nothing replaced, nothing dropped (the console's
    # line discipline adds CR before LF, which the runner takes back off)
    escapes = "".join(f"\\{b:03o}" for b in range(256))
    output, status = run(shell, f"printf '{escapes}'", 60)
    assert (output, status) == (bytes(range(256)), "0")
    output, status = run(shell, r"printf '\200\377A'", 60)
    assert (output, status) == (b"\x80\xffA", "0")


def test_the_limit_kills_the_commands_whole_process_group_and_the_shell_goes_on(shell, tmp_path):
    marker = f"{os.getpid()}{time.monotonic_ns() % 10**6}"
    # a command that ignores the signals a terminal sends, and leaves a child running
    command = f"trap '' INT TERM HUP; sh -c 'sleep {marker}1; echo child-ran' & sleep {marker}2; echo parent-ran"
    output, status = run(shell, command, 2)
    assert status == "late" and b"ran" not in output
    # both sleepers were killed with the group, nothing of the script is left in /tmp
    deadline = time.monotonic() + 30
    while sleepers(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sleepers(marker) == []
    assert run(shell, "echo still here; exit 4", 60) == (b"still here\n", "4")


def test_a_command_within_its_limit_keeps_its_status_and_no_watchdog_is_left(shell):
    assert run(shell, "sleep 0.2; echo done; exit 9", 30) == (b"done\n", "9")
    # the watchdog job (sleep 30.000) went with the command
    deadline = time.monotonic() + 30
    while sleepers("sleep 30.000") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sleepers("sleep 30.000") == []



def test_a_syntax_error_says_why_and_the_shell_goes_on(shell):
    output, status = run(shell, "echo 'unbalanced", 30)
    assert status == "syntax" and b"unterminated quoted string" in output
    assert run(shell, "echo after", 30) == (b"after\n", "0")


def test_the_shell_does_not_ignore_sigpipe(shell):
    # bit 13 of SigIgn is SIGPIPE (signal 13): a pipeline's writer must die when its reader goes
    output, status = run(shell, "grep SigIgn /proc/self/status", 30)
    assert status == "0" and int(output.split()[1], 16) & (1 << (signal.SIGPIPE - 1)) == 0, output


def test_large_output_is_exact_and_stderr_comes_with_it(shell):
    size = 1 << 20
    output, status = run(shell, f"yes 0123456789abcdef 2>/dev/null | head -c {size}; echo to-stderr >&2", 120)
    assert status == "0"
    assert output == (b"0123456789abcdef\n" * (size // 17 + 1))[:size] + b"to-stderr\n"


def test_the_port_carries_carriage_returns_as_written(tmp_path):
    """Over the port nothing is translated: a CR LF the command writes stays CR LF (the serial
    line's tty cannot tell it from its own)."""
    pid, fd, ours = busybox_shell(tmp_path, True)
    try:
        runner = CommandRunner(Console(Terminal(fd), None), Console(ours, None))
        assert run(runner, r"printf 'a\r\nb\r\n'", 30) == (b"a\r\nb\r\n", "0")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
        ours.close()


@pytest.mark.parametrize("image", ["busybox", "debian"])
def test_a_command_that_is_not_shell_is_refused_on_the_host_before_a_boot(image, capsys, monkeypatch, tmp_path):
    """sh -n of the guest's own shell (busybox ash, or the Debian image's dash), run on the host:
    `pfcxl run` and `multihost` say it in one line, exit 2, and boot nothing."""
    from pfcxl.errors import CommandError
    from pfcxl.host_tools.cli import main as cli
    from pfcxl.host_tools.vm import console
    from pfcxl.machine import Machine
    monkeypatch.setattr(Machine, "launch", lambda self: pytest.fail("a guest was booted"))
    cases = [["run", "--image", image, "--run-dir", str(tmp_path), "--", "if true; then echo ("]]
    if image == "busybox":               # multihost boots the busybox image
        cases.append(["multihost", "-n", "2", "--", "echo {host} 'unbalanced"])
    for argv in cases:
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "not valid shell syntax (sh -n)" in err, err
    console.check_syntax("echo fine; if true; then echo ok; fi | tr a b", image)     # valid: nothing said
    with pytest.raises(CommandError, match="^checked before booting: .*; command: case x in$"):
        console.check_syntax("case x in", image)
