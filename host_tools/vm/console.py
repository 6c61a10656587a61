"""The guest's serial console as pfcxl drives it, through pexpect.

Everything read is appended to the console log. Searches are for literal markers only
(`expect_exact`): pexpect then looks at each new read plus the marker's length of what came
before, so capturing N bytes of output costs O(N), not O(N^2) as re-matching a growing buffer
with a regular expression does. QEMU's serial port writes each byte to the socket on its own, so
reads are a few bytes: pexpect's default pause after every read (`delayafterread`) is off, and a
pause to batch them does not help either: the socket fills with one-byte packets and QEMU, then
the guest, wait (tried: a 2 ms pause per read halved the throughput).

Commands are not typed: busybox's line editor drops lines past ~1,000 characters, and a typed
quote that never closes leaves the shell waiting. A command becomes a script file (its bytes in
base64, in lines short enough to type), checked with `sh -n`, and run with stdin from /dev/null,
as a job of its own beside a watchdog that kills its process group at the command's limit.
"""

from __future__ import annotations

import base64
import os
import secrets
import shlex
import shutil
import socket
import time
from typing import BinaryIO, Sequence

import pexpect
from pexpect import fdpexpect

from pfcxl import process
from pfcxl.errors import CommandError, VMError
from pfcxl.host_tools.image import DEFAULT_IMAGE

READ = 1 << 16
SHORT = 600             # base64 characters that fit on the one line that also starts the script
CHUNK = 800             # base64 characters per typed line (busybox's line editor holds 1,024)
BATCH = 4               # lines typed ahead before waiting for the shell (under the tty's 4 KiB)


class ConsoleClosed(VMError):
    """QEMU closed the console: the guest is gone (VM turns it into a worded VMError)."""


class ConsoleTimeout(VMError):
    """Nothing matched before the deadline (VM turns it into a worded VMError)."""


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


def not_shell(who: str, said: str, command: str) -> CommandError:
    """A command that is not valid shell, in the words of the shell's `sh -n`."""
    return CommandError(f"{who}: the command is not valid shell syntax (sh -n): {' '.join(said.split())}; "
                        f"command: {command[:200]}")


def check_syntax(command: str, image: str = DEFAULT_IMAGE) -> None:
    """`sh -n` of the command on the host, before a guest boots to find it out: in the guest's own
    shell, busybox's ash (the image's busybox is the host's static /bin/busybox) or, for the Debian
    image, dash. CommandError in one line when it is not valid shell. Where that shell is missing
    on the host, or does not answer, nothing is said: the guest's own check still runs."""
    from pfcxl.host_tools.image.initramfs import BUSYBOX
    shell = [str(BUSYBOX), "sh"] if image == "busybox" else [shutil.which("dash") or ""]
    if not os.access(shell[0], os.X_OK):
        return
    try:       # the script on stdin: -n reads it and runs nothing; no argument size limit
        done = process.capture([*shell, "-n"], input=command.encode(), timeout=30)
    except (OSError, process.TimeoutExpired):
        return
    if done.returncode != 0:
        raise not_shell("checked before booting", done.stderr.decode(errors="replace") or f"exit {done.returncode}", command)


def line_markers(marker: str) -> list[bytes]:
    """`marker` as a whole line, as the tty sends it (CR LF) or as written (LF): literal strings,
    so a search never re-reads the output before them."""
    return [marker.encode() + b"\r\n", marker.encode() + b"\n"]


class Console:
    """pexpect over the console socket (QEMU's end is the guest's serial port). The socket stays
    the caller's to close: pexpect never closes it."""

    def __init__(self, sock: socket.socket, log: BinaryIO | None) -> None:
        self._sock = sock
        self._child: fdpexpect.fdspawn[bytes] = fdpexpect.fdspawn(sock.fileno(), timeout=None, maxread=READ, use_poll=True)
        self._child.delayafterread = None
        self._child.logfile_read = log

    def send(self, line: str) -> None:
        self._sock.sendall(line.encode() + b"\n")

    def expect_exact(self, markers: list[bytes], timeout: float) -> tuple[int, bytes]:
        """Wait for the first of the literal `markers`; return its index and what came between the
        previous match and it. The console is consumed through the match."""
        try:
            index = self._child.expect_exact(markers, timeout=max(timeout, 0))
        except pexpect.TIMEOUT as exc:
            raise ConsoleTimeout from exc
        except pexpect.EOF as exc:
            raise ConsoleClosed from exc
        return index, self._child.before or b""          # None only before the first match

    def line(self, timeout: float) -> bytes:
        """The rest of the current line (without its CR LF)."""
        return self.expect_exact([b"\n"], timeout)[1].removesuffix(b"\r")


class CommandRunner:
    """Runs command scripts on a Console; see the module docstring for how. With `output` (the
    virtio-serial port guest/init opened as descriptor 9 of the console shell) a command's
    stdout and stderr go there, followed by its end marker, byte for byte; the serial line then
    carries only the markers and the status."""

    def __init__(self, console: Console, output: Console | None = None) -> None:
        self.console, self.output = console, output

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
                    self.console.expect_exact(line_markers(f"{tag}w{n}"), timeout)
        # Over the port: the syntax check's and the script's output, then the end marker (nothing
        # echoes on the port, so the marker needs no $((...))).
        to, end = (" >&9 2>&9", f"; printf %s {tag}2 >&9") if self.output else ("", "")
        # The script runs as a background job of the console's interactive shell, so job control
        # gives it a process group of its own (pgid $c); a watchdog job kills that group when the
        # limit passes and leaves $p.late behind to say so. Job notices ("[1]+ Done") only come
        # at the next prompt, after the status marker.
        self.console.send(
            f"{first}base64 -d $p.b64 > $p; echo {tag}$((0)); "
            f"if sh -n $p{' 2>&9' if self.output else ''}; then sh $p </dev/null{to} & c=$!; "
            f"(sleep {limit:.3f}; : > $p.late; kill -KILL -$c) "
            f"2>/dev/null & w=$!; wait $c; r=$?; kill -KILL -$w 2>/dev/null; [ -e $p.late ] && r=late; "
            f"else r=syntax; fi{end}; rm -f $p $p.b64 $p.late; echo {tag}$((1))=$r")
        return tag

    def finish(self, tag: str, timeout: float) -> tuple[bytes, str]:
        """The script's output, byte for byte, and its status: a number, 'syntax', or 'late' (the
        guest killed it at its limit)."""
        deadline = time.monotonic() + timeout
        self.console.expect_exact(line_markers(f"{tag}0"), timeout)
        if self.output:     # read it all first: the guest's writes wait for the host to read
            _, output = self.output.expect_exact([f"{tag}2".encode()], deadline - time.monotonic())
        _, text = self.console.expect_exact([f"{tag}1=".encode()], deadline - time.monotonic())
        status = self.console.line(deadline - time.monotonic()).decode()
        # the serial line's tty turns LF into CR LF
        return (output if self.output else text.replace(b"\r\n", b"\n")), status
