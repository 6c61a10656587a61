"""An interactive serial console: the user's terminal wired to the guest's console socket."""

from __future__ import annotations

import os
import select
import sys
import termios
import tty

from pfcxl.errors import PfcxlError

ESCAPE = b"\x1d"   # Ctrl-]: leave the console (the VM is then shut down)


def check_foreground() -> None:
    """The console puts the terminal in raw mode, which the kernel stops a process for (SIGTTOU)
    unless it is in the terminal's foreground process group (`timeout pfcxl boot` is not): say so
    before anything boots."""
    stdin = sys.stdin.fileno()
    if os.isatty(stdin) and os.tcgetpgrp(stdin) != os.getpgrp():
        raise PfcxlError("pfcxl boot needs the terminal in the foreground (it is not: under `timeout`, give "
                         "`timeout --foreground`); pfcxl up and pfcxl exec run without a terminal")


def interact(console_fd: int, banner: str = "") -> None:
    """Copy keys to the guest and its output to stdout until Ctrl-] or the guest goes away."""
    stdin = sys.stdin.fileno()
    if banner:
        sys.stderr.write(banner + "\r\n")
        sys.stderr.flush()
    saved = termios.tcgetattr(stdin) if os.isatty(stdin) else None
    try:
        if saved is not None:
            tty.setraw(stdin)
        while True:
            readable, _, _ = select.select([stdin, console_fd], [], [])
            if console_fd in readable:
                data = os.read(console_fd, 65536)
                if not data:
                    return
                os.write(sys.stdout.fileno(), data)
            if stdin in readable:
                data = os.read(stdin, 1024)
                if not data or ESCAPE in data:
                    before = data.split(ESCAPE, 1)[0] if data else b""
                    if before:
                        os.write(console_fd, before)
                    return
                os.write(console_fd, data)
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        sys.stderr.write("\r\n")   # whatever the guest printed last, pfcxl's next words start a line
