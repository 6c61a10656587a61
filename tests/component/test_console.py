"""How pfcxl turns a command into what the guest runs, and how it reads the console back.
Booted behaviour is in tests/integration/test_console.py."""

import socket
import threading

import pexpect.expect
import pytest

from pfcxl.host_tools.fleet import multihost
from pfcxl.host_tools.vm.console import Console, ConsoleClosed, line_markers, shell_command

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


def test_markers_split_across_reads_are_found_and_output_is_exact():
    body = bytes(range(256)) * 4096
    console = feed([b"noise tag0\r", b"\n" + body[:5000], body[5000:] + b"ta", b"g1=42\r\nafter"])
    console.expect_exact(line_markers("tag0"), 10)
    _, before = console.expect_exact([b"tag1="], 10)
    assert before == body and console.line(10) == b"42"
    with pytest.raises(ConsoleClosed):
        console.expect_exact([b"never"], 10)


@pytest.mark.parametrize("read", [1, 7, 4096, 1 << 16])
def test_capture_searches_each_byte_a_bounded_number_of_times(monkeypatch, read):
    """Whatever size the reads come in, the searches of a capture look at O(N) bytes in all: each
    byte once plus a marker's length of overlap per read, never the whole buffer again on every
    read (which is what made 3 MiB take minutes)."""
    size = (8 << 20) if read >= 4096 else (64 << 10)
    searched = []
    original = pexpect.expect.searcher_string.search

    def counting(self, buffer, freshlen, searchwindowsize=None):
        searched.append(len(buffer))
        return original(self, buffer, freshlen, searchwindowsize)
    monkeypatch.setattr(pexpect.expect.searcher_string, "search", counting)
    data = b"x" * size + b"END\n"
    console = feed([data[i:i + read] for i in range(0, len(data), read)])
    _, before = console.expect_exact([b"END\n"], 600)
    assert before == b"x" * size
    assert size <= sum(searched) < 3 * size + 8 * len(searched)


def test_multihost_api_refuses_no_hosts_before_starting_anything(tmp_path):
    from pfcxl.device import topology
    from pfcxl.errors import PfcxlError
    from pfcxl.host_tools.vm.boot_options import BootOptions
    path = topology.resolve("pf-appliance")
    with pytest.raises(PfcxlError, match="0 hosts: multihost needs at least 1"):
        multihost.run(topology.load(path), path, 0, "true", options=BootOptions(run_dir=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []


BACKGROUND_BOOT = """
import os, subprocess, sys
os.setsid()
tty = os.open(sys.argv[1], os.O_RDWR)         # the pty becomes this session's terminal, our group in front
child = subprocess.Popen([sys.executable, "-m", "pfcxl.host_tools.cli.main", "boot"], stdin=tty,
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
