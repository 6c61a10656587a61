"""The guest's serial console as pfcxl drives it.

Everything read is appended to the console log and to a buffer. A search for a marker only
re-reads as much of what was already searched as the marker can be long, so capturing N bytes of
output costs O(N), not O(N^2) as re-matching a growing buffer does. QEMU's serial port writes
each byte to the socket on its own, so reads are a few bytes: re-reading even 64 KiB per read
cost seconds of CPU per MiB. Reading late does not batch them: the socket fills with one-byte
packets and QEMU, then the guest, wait (tried: a 2 ms pause per read halved the throughput).

Commands are not typed: busybox's line editor drops lines past ~1,000 characters, and a typed
quote that never closes leaves the shell waiting. A command becomes a script file (its bytes in
base64, in lines short enough to type), checked with `sh -n`, and run with stdin from /dev/null,
as a job of its own beside a watchdog that kills its process group at the command's limit.
"""

from __future__ import annotations

import base64
import re
import secrets
import select
import shlex
import socket
import time
from dataclasses import dataclass
from typing import BinaryIO, Sequence

READ = 1 << 16
LINE = 4096             # longest marker line a search finds, unless told otherwise
SHORT = 600             # base64 characters that fit on the one line that also starts the script
CHUNK = 800             # base64 characters per typed line (busybox's line editor holds 1,024)
BATCH = 4               # lines typed ahead before waiting for the shell (under the tty's 4 KiB)


class ConsoleClosed(Exception):
    """QEMU closed the console: the guest is gone."""


class ConsoleTimeout(Exception):
    """Nothing matched before the deadline."""


@dataclass(frozen=True)
class Found:
    before: bytes           # what came between the previous match and this one
    groups: tuple


def shell_command(command: str | Sequence[str], substitutions: dict[str, str] | None = None) -> str:
    """The shell command line for `command`: a string is shell syntax already; a list is argv, each
    word quoted. `substitutions` ({host} -> 3, ...) are applied per word, before quoting."""
    subs = substitutions or {}

    def sub(word: str) -> str:
        for key, value in subs.items():
            word = word.replace(key, value)
        return word

    if isinstance(command, str):
        return sub(command)
    words = [sub(w) for w in command]
    return words[0] if len(words) == 1 else shlex.join(words)


class Console:
    def __init__(self, sock: socket.socket, log: BinaryIO) -> None:
        self._sock, self._log = sock, log
        self._buf = bytearray()

    def send(self, line: str) -> None:
        self._sock.sendall(line.encode() + b"\n")

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([self._sock], [], [], remaining)[0]:
            raise ConsoleTimeout
        data = self._sock.recv(READ)
        if not data:
            raise ConsoleClosed
        self._log.write(data)
        self._buf += data

    def expect(self, pattern: re.Pattern, timeout: float, longest: int = LINE) -> Found:
        """Wait for `pattern`, whose matches are at most `longest` bytes; consume the buffer
        through the match."""
        deadline = time.monotonic() + timeout
        start = 0
        while True:
            m = pattern.search(self._buf, start)
            if m:
                # take what we need before resizing: the match's groups read the live buffer
                found = Found(bytes(self._buf[:m.start()]), m.groups())
                del self._buf[:m.end()]
                return found
            start = max(0, len(self._buf) - longest)
            self._fill(deadline)


class CommandRunner:
    """Runs command scripts on a Console; see the module docstring for how."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def start(self, command: str, limit: float, timeout: float = 60) -> str:
        """Write the script and start it; return its tag (for finish). The guest kills the
        script's process group (SIGKILL) once it has run `limit` seconds: a command that
        overruns ends, the shell and the guest stay."""
        tag = secrets.token_hex(4)
        path = f"/tmp/pfcxl-{tag}"
        encoded = base64.b64encode(command.encode()).decode()
        # The markers only appear once the shell expands $((...)): the echo of a typed line cannot
        # be mistaken for them.
        first = f"p={path}; "
        if len(encoded) <= SHORT:       # the usual case: one line writes and starts the script
            first += f"echo {encoded} >> $p.b64; "
        else:
            chunks = [encoded[i:i + CHUNK] for i in range(0, len(encoded), CHUNK)]
            for n, chunk in enumerate(chunks):
                ack = n % BATCH == BATCH - 1 or n == len(chunks) - 1
                self.console.send(f"echo {chunk} >> {path}.b64" + (f"; echo {tag}w$(({n}))" if ack else ""))
                if ack:
                    self.console.expect(re.compile(rf"{tag}w{n}\r?\n".encode()), timeout)
        # The script runs as a background job of the console's interactive shell, so job control
        # gives it a process group of its own (pgid $c); a watchdog job kills that group when the
        # limit passes and leaves $p.late behind to say so. Job notices ("[1]+ Done") only come
        # at the next prompt, after the status marker.
        self.console.send(
            f"{first}base64 -d $p.b64 > $p; echo {tag}$((0)); "
            f"if sh -n $p; then sh $p </dev/null & c=$!; (sleep {limit:.3f}; : > $p.late; kill -KILL -$c) "
            f"2>/dev/null & w=$!; wait $c; r=$?; kill -KILL -$w 2>/dev/null; [ -e $p.late ] && r=late; "
            f"else r=syntax; fi; rm -f $p $p.b64 $p.late; echo {tag}$((1))=$r")
        return tag

    def finish(self, tag: str, timeout: float) -> tuple[bytes, str]:
        """The script's output (console bytes) and its status: a number, 'syntax', or 'late' (the
        guest killed it at its limit)."""
        self.console.expect(re.compile(rf"{tag}0\r?\n".encode()), timeout)
        found = self.console.expect(re.compile(rf"{tag}1=(\d+|syntax|late)\r?\n".encode()), timeout, longest=64)
        return found.before, found.groups[0].decode()
