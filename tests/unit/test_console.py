"""How pfcxl turns a command into what the guest runs, and how it reads the console back.
Booted behaviour is in tests/integration/test_console.py."""

import re
import socket
import threading

import pytest

from pfcxl.host_tools import multihost
from pfcxl.host_tools.console import Console, ConsoleClosed, shell_command

pytestmark = pytest.mark.component


@pytest.mark.parametrize("command, expected", [
    ("cxl list -R | head", "cxl list -R | head"),                 # one string: shell syntax, as typed
    (["cxl list -R | head"], "cxl list -R | head"),               # one word after --: the same
    (["sh", "-c", "exit 3"], "sh -c 'exit 3'"),                   # argv: each word quoted
    (["echo", "a  b", "$HOME", "it's"], "echo 'a  b' '$HOME' 'it'\"'\"'s'"),
])
def test_one_meaning_for_a_command(command, expected):
    assert shell_command(command) == expected


def test_multihost_keeps_the_quoting_of_run():
    argv = ["sh", "-c", "exit {host}"]
    assert multihost.expand(argv, 3, 4) == shell_command(["sh", "-c", "exit 3"]) == "sh -c 'exit 3'"
    # substitution happens per word, before quoting: a value can never break the quoting
    assert multihost.expand(["echo", "{host} of {hosts}"], 1, 16) == "echo '1 of 16'"
    assert multihost.expand("slices --host {host} --hosts {hosts}", 2, 4) == "slices --host 2 --hosts 4"


def feed(chunks: list[bytes]):
    """A console whose 'guest' sends `chunks` and then closes."""
    ours, theirs = socket.socketpair()

    def guest():
        for c in chunks:
            theirs.sendall(c)
        theirs.close()
    threading.Thread(target=guest, daemon=True).start()
    return Console(ours, open("/dev/null", "wb"))


class CountingPattern:
    """A compiled pattern that counts how many bytes its searches had to look at."""

    def __init__(self, pattern: bytes) -> None:
        self.pattern, self.looked_at = re.compile(pattern), 0

    def search(self, buf, pos=0):
        self.looked_at += len(buf) - pos
        return self.pattern.search(buf, pos)


def test_markers_split_across_reads_are_found_and_output_is_exact():
    body = bytes(range(256)) * 4096
    console = feed([b"noise tag0\r", b"\n" + body[:5000], body[5000:] + b"ta", b"g1=42\r\nafter"])
    console.expect(re.compile(rb"tag0\r?\n"), 10)
    found = console.expect(re.compile(rb"tag1=(\d+)\r?\n"), 10)
    assert found.before == body and found.groups == (b"42",)
    with pytest.raises(ConsoleClosed):
        console.expect(re.compile(rb"never"), 10)


def test_capture_reads_each_byte_a_bounded_number_of_times():
    size = 8 << 20
    chunks = [b"x" * 4096] * (size // 4096) + [b"END\n"]
    console = feed(chunks)
    end = CountingPattern(rb"END\n")
    found = console.expect(end, 60)
    assert len(found.before) == size
    # linear: each byte is searched once plus one window of overlap per read, never the whole
    # buffer again on every read (which is what made 3 MiB take minutes)
    assert end.looked_at < 3 * size



def test_multihost_api_refuses_no_hosts_before_starting_anything(tmp_path):
    from pfcxl.device import topology
    from pfcxl.errors import PfcxlError
    path = topology.resolve("pf-appliance")
    with pytest.raises(PfcxlError, match="0 hosts: multihost needs at least 1"):
        multihost.run(topology.load(path), path, 0, "true", run_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


BACKGROUND_BOOT = """
import os, subprocess, sys
os.setsid()
tty = os.open(sys.argv[1], os.O_RDWR)         # the pty becomes this session's terminal, our group in front
child = subprocess.Popen([sys.executable, "-m", "pfcxl.host_tools.cli", "boot"], stdin=tty,
                         stderr=subprocess.PIPE, text=True, process_group=0)   # a background group, as under timeout
try:
    _, err = child.communicate(timeout=120)
except subprocess.TimeoutExpired:
    os.killpg(child.pid, 9)
    child.wait()
    err = "(stopped silently)"
print(child.returncode, err.strip())
"""


def test_boot_outside_the_terminals_foreground_group_says_so_and_exits():
    """`timeout pfcxl boot` runs pfcxl in a background process group of the terminal: raw mode would
    stop it (SIGTTOU) without a word. It must say so in one line, before building or booting."""
    import os
    import subprocess
    import sys
    leader, follower = os.openpty()
    try:
        done = subprocess.run([sys.executable, "-c", BACKGROUND_BOOT, os.ttyname(follower)], capture_output=True,
                              text=True, timeout=300)
    finally:
        os.close(leader)
        os.close(follower)
    status, _, message = done.stdout.strip().partition(" ")
    assert status == "1", done.stdout + done.stderr
    assert message.startswith("pfcxl: error: pfcxl boot needs the terminal in the foreground")
    assert len(message.splitlines()) == 1
