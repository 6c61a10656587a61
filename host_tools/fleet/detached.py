"""A Machine that stays up between commands: `pfcxl up`, `exec`, `ps`, `down`, `run --reuse`.

`up` starts a daemon process (`python -m pfcxl.host_tools.fleet.detached DIR`) in its own session. It
owns one pfcxl.Machine booted exactly as `pfcxl run` boots it, with DIR as its run directory,
and answers on DIR/control.sock. DIR is $PFCXL_CACHE/machines/<name>/ and holds:

    request.json   what `up` asked for: topology file, Machine options, their key (--reuse)
    daemon.json    the daemon's pid and start time, written first thing by the daemon
    control.sock   the control socket
    error          why the boot failed (then the daemon has exited; the logs stay for a look)
    daemon.log     the daemon's own output; and the Machine's files (guest.console.log, ...)

Protocol: one JSON line each way per connection. {"op": "status"} -> state and pids;
{"op": "exec", "command": str | [argv], "timeout": s} -> {"status", "output": base64 of the
bytes} or {"error"}; {"op": "down"} -> {"ok": true}, then the daemon shuts the guest down,
removes DIR and exits. Commands run one at a time (the console is one shell); a second exec
waits for the first, as long as its own timeout. The appliance's limits hold here too: a request
line of at most MAX_LINE bytes, sent within IDLE_TIMEOUT of connecting, and at most
MAX_CONNECTIONS connections served at once; a connection closed for breaking them gets one line
{"error": "...", "closed": "idle" | "refused"}. Clients never wait without a timeout.
QEMU dies with the daemon (PR_SET_PDEATHSIG, pfcxl/process.py), so a killed daemon leaves
no guest running; a client then finds no one on the socket and says the machine is dead.
"""

from __future__ import annotations

import base64
import dataclasses
import errno
import json
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

from pfcxl.device.appliance.protocol import IDLE_TIMEOUT, MAX_LINE
from pfcxl.errors import PfcxlError, VMError

from pfcxl import cache, process

from pfcxl.host_tools.vm.boot_options import BootOptions

if TYPE_CHECKING:                        # imported by the daemon alone at run time (serve)
    from pfcxl.machine import Machine

SOCKET, REQUEST, DAEMON, ERROR, LOG = "control.sock", "request.json", "daemon.json", "error", "daemon.log"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")   # fullmatch: `$` lets "x\n" through
MAX_CONNECTIONS = 16        # served at once (each a thread); more are refused, saying so
STATUS_TIMEOUT = 10         # seconds a client waits for status or down
EXEC_SLACK = 120            # seconds an exec's client waits beyond its command's own timeouts
INJECT_TIMEOUT = 600        # seconds an injection waits for the console, and its guest commands take
# accept() failures that pass once connections end: a daemon out of descriptors must go on
_TRANSIENT = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EINTR)


def machines_dir() -> Path:
    return cache.cache_dir() / "machines"


def machine_dir(name: str) -> Path:
    if not NAME_RE.fullmatch(name):
        raise PfcxlError(f"machine name {name!r} must be 1-64 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return machines_dir() / name


def _alive(pid: int | None) -> TypeGuard[int]:
    """A process that exists and is not a zombie."""
    return process.is_running(pid)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


# --------------------------------------------------------------------------- client side

def _exchange(path: Path, request: dict, timeout: float) -> dict:
    """One request line to the control socket at `path` and its reply; OSError (socket.timeout
    included) or ValueError as they come."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        try:
            s.sendall(json.dumps(request).encode() + b"\n")
        except (BrokenPipeError, ConnectionResetError):
            pass    # a daemon that refuses a connection says why and closes before reading: read its line
        data = s.makefile("rb").readline()
    if not data:
        raise ConnectionResetError(errno.ECONNRESET, "closed without an answer")
    reply = json.loads(data)
    if not isinstance(reply, dict):
        raise ValueError(f"not a JSON object: {data[:80]!r}")
    return reply


def call(name: str, request: dict, timeout: float = STATUS_TIMEOUT) -> dict:
    """One request to machine `name`'s daemon; its reply. A daemon that is gone, dies before it
    answers, refuses the connection or does not answer within `timeout` is a VMError naming the
    machine, never a hang or a traceback."""
    where = machine_dir(name)
    if not where.is_dir():
        raise PfcxlError(f"no machine '{name}' is up (pfcxl ps lists them)")   # a wrong name, not a QEMU failure
    op = request["op"]
    try:
        reply = _exchange(where / SOCKET, request, timeout)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise VMError(f"machine '{name}' is {describe(name)['state']}; pfcxl down {name} removes it") from exc
    except socket.timeout as exc:
        raise VMError(f"machine '{name}' did not answer '{op}' within {timeout:g}s") from exc
    except ConnectionResetError as exc:
        raise VMError(f"machine '{name}' died while answering '{op}': "
                      f"{describe(name)['state']}; pfcxl down {name} removes it") from exc
    except OSError as exc:
        why = "accepts no connections (its queue is full)" if exc.errno == errno.EAGAIN else exc.strerror
        raise VMError(f"machine '{name}' did not take '{op}': {why}") from exc
    except ValueError as exc:
        raise VMError(f"machine '{name}' answered '{op}' with something other than a JSON line: {exc}") from exc
    if "closed" in reply:
        raise VMError(f"machine '{name}' closed the connection: {reply.get('error')}")
    return reply


def describe(name: str) -> dict:
    """What `ps` shows of one machine, whether or not its daemon is alive."""
    where = machine_dir(name)
    request, daemon = _read_json(where / REQUEST), _read_json(where / DAEMON)
    info = {"name": name, "topology": request.get("topology_name", "?"), "started": daemon.get("started"),
            "daemon_pid": daemon.get("pid"), "qemu_pid": None, "state": "starting"}
    if (where / ERROR).exists():
        info["state"] = "failed: " + (where / ERROR).read_text().splitlines()[0]
    elif daemon and not _alive(daemon.get("pid")):
        info["state"] = f"dead (its daemon, pid {daemon.get('pid')}, is gone, and its guest with it)"
    elif daemon:
        try:
            reply = _exchange(where / SOCKET, {"op": "status"}, STATUS_TIMEOUT)
        except (FileNotFoundError, ConnectionRefusedError):
            return info           # between the daemon's start and its socket: still "starting"
        except (OSError, ValueError) as exc:
            info["state"] = f"not answering ({exc})"
            return info
        if "closed" in reply:
            info["state"] = f"busy ({reply.get('error')})"
        else:
            info.update({k: reply[k] for k in ("state", "qemu_pid", "daemon_pid", "regions") if k in reply})
    return info


def names() -> list[str]:
    base = machines_dir()
    return sorted(p.name for p in base.iterdir() if p.is_dir() and NAME_RE.fullmatch(p.name)) if base.is_dir() else []


def up(name: str, topology_path: Path, topology_name: str, options: BootOptions, ready_timeout: float = 300,
       wait: float = 900) -> dict:
    """Start machine `name` in the background and wait until it is ready; its description.
    A boot that fails raises VMError with the reason; its directory stays for `down`."""
    where = machine_dir(name)
    if where.exists():
        raise VMError(f"machine '{name}' exists ({describe(name)['state']}): pfcxl down {name} first, or "
                      "choose another --name")
    where.parent.mkdir(parents=True, exist_ok=True)
    where.mkdir(mode=0o700)
    request = {"topology": str(Path(topology_path).absolute()), "topology_name": topology_name,
               "options": options.as_dict(), "ready_timeout": ready_timeout, "key": options.key(topology_path)}
    (where / REQUEST).write_text(json.dumps(request, indent=1))
    with open(where / LOG, "ab") as log:
        daemon = process.start([sys.executable, "-m", "pfcxl.host_tools.fleet.detached", str(where)],
                               stdin=process.DEVNULL, stdout=log, stderr=process.STDOUT,
                               start_new_session=True)
    deadline = time.monotonic() + wait
    try:
        while time.monotonic() < deadline:
            info = describe(name)
            if info["state"] == "ready":
                return info
            if daemon.poll() is not None or info["state"].startswith(("failed", "dead")):
                daemon.wait()
                reason = (where / ERROR).read_text() if (where / ERROR).exists() else \
                    f"its daemon exited with status {daemon.returncode}; see {where / LOG}"
                raise VMError(f"machine '{name}' did not come up: {reason.strip()}\n"
                              f"its files stay in {where} until: pfcxl down {name}")
            time.sleep(0.2)
    except KeyboardInterrupt:
        # Ctrl-C, or SIGTERM/SIGHUP to `up` (host_tools/cli/main.py): the daemon is in a session of
        # its own, so no signal reached it; the boot asked for is abandoned, the guest shut down
        down(name)
        raise
    raise VMError(f"machine '{name}' was not ready within {wait:.0f}s ({describe(name)['state']}); "
                  f"pfcxl down {name} stops it")


def exec_command(name: str, command: str | list[str], timeout: float = 600) -> tuple[int, bytes]:
    """Run a command in machine `name`: (exit status, output bytes), as Machine.run gives them.
    The daemon waits at most `timeout` for the console and the guest kills the command after
    `timeout`, so this waits twice that and some slack, never for ever."""
    reply = call(name, {"op": "exec", "command": command, "timeout": timeout}, timeout=2 * timeout + EXEC_SLACK)
    if "error" in reply:
        raise VMError(f"machine '{name}': {reply['error']}")
    return reply["status"], base64.b64decode(reply["output"])


def down(name: str, wait: float = 60) -> None:
    """Stop machine `name` (whatever its state) and remove its directory: no process, no file."""
    where = machine_dir(name)
    if not where.is_dir():
        raise PfcxlError(f"no machine '{name}' is up (pfcxl ps lists them)")   # a wrong name, not a QEMU failure
    pid = _read_json(where / DAEMON).get("pid")
    if _alive(pid):
        try:
            call(name, {"op": "down"})
            deadline = time.monotonic() + wait
        except VMError:
            deadline = time.monotonic()       # not answering: the signals below decide, at once
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and _alive(pid):
                os.kill(pid, sig)
                deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not _alive(pid):
                break
    shutil.rmtree(where, ignore_errors=True)


def find_reusable(topology_path: Path, options: BootOptions) -> str | None:
    """The name of a ready machine booted from the same topology content and boot options."""
    key = options.key(topology_path)
    for name in names():
        if _read_json(machine_dir(name) / REQUEST).get("key") == key and describe(name)["state"] == "ready":
            return name
    return None


# --------------------------------------------------------------------------- the daemon

class Daemon:
    """Owns one Machine; serves the control socket until `down` or SIGTERM."""

    def __init__(self, where: Path) -> None:
        self.where = where
        self.request = _read_json(where / REQUEST)
        self.state = "booting"
        self.machine: Machine | None = None
        self.lock = threading.Lock()          # one command at a time on the console
        self.stopping = threading.Event()
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def status(self) -> dict:
        machine = self.machine
        state = self.state
        qemu_pid = machine.pid if machine is not None else None
        if state == "ready" and machine is not None and machine.vm is not None and not _alive(qemu_pid):
            state = "crashed (QEMU exited; its log: " + str(machine.vm.qemu_log) + ")"
        return {"state": state, "qemu_pid": qemu_pid, "daemon_pid": os.getpid(),
                "regions": (machine.ready.get("regions", []) if self.state == "ready" and machine is not None else [])}

    def handle(self, conn: socket.socket) -> None:
        """One connection, in its own thread, holding one of the slots."""
        reply: dict = {}
        try:
            with conn:
                reply = self._reply_to(conn)
                try:
                    conn.settimeout(IDLE_TIMEOUT)     # a client that does not read is dropped
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                except OSError:
                    pass                              # the client went away
        finally:
            self.slots.release()
        if reply.get("down"):
            self.stopping.set()

    def _reply_to(self, conn: socket.socket) -> dict:
        conn.settimeout(IDLE_TIMEOUT)
        try:
            line = conn.makefile("rb").readline(MAX_LINE + 1)
        except OSError:                               # socket.timeout included
            return {"error": f"closed: no request within {IDLE_TIMEOUT:g}s", "closed": "idle"}
        if len(line) > MAX_LINE:
            return {"error": f"request line longer than {MAX_LINE} bytes; closing", "closed": "refused"}
        try:
            request = json.loads(line or b"{}")
        except (ValueError, RecursionError) as exc:
            return {"error": f"not JSON: {exc}"}
        if not isinstance(request, dict):
            return {"error": f"a request is a JSON object, got {type(request).__name__}"}
        try:
            return self.answer(request)
        except Exception as exc:              # a reply, not a dead daemon
            return {"error": f"{type(exc).__name__}: {exc}"}

    def answer(self, request: dict) -> dict:
        op = request.get("op")
        if op == "status":
            return self.status()
        if op == "down":
            return {"ok": True, "down": True}
        if op == "inject":
            return self.inject(request)
        if op != "exec":
            return {"error": f"unknown op {str(op)[:40]!r} (status, exec, down, inject)"}
        timeout = request.get("timeout", 600)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < 1e9:
            return {"error": f"exec: timeout {timeout!r} must be a number of seconds above 0"}
        if not self.lock.acquire(timeout=timeout):
            return {"error": f"another command held the console for all of this one's {timeout:g}s"}
        try:
            machine, state = self.machine, self.status()["state"]
            if state != "ready" or machine is None:
                return {"error": f"the guest is {state}"}
            try:
                result = machine.run(request["command"], timeout=timeout)
            except PfcxlError as exc:
                return {"error": str(exc).splitlines()[0], "state": self.status()["state"]}
            return {"status": result.status, "output": base64.b64encode(result.data).decode()}
        finally:
            self.lock.release()

    def listen(self) -> socket.socket:
        """Bind the control socket and answer on it from a thread of its own; the listener."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.where / SOCKET))
        listener.listen(16)
        listener.settimeout(0.5)
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return listener

    def inject(self, request: dict) -> dict:
        """pfcxl inject: Machine.inject in the machine this daemon keeps up."""
        if not self.lock.acquire(timeout=INJECT_TIMEOUT):
            return {"error": f"another command held the console for all of {INJECT_TIMEOUT}s"}
        try:
            machine, state = self.machine, self.status()["state"]
            if state != "ready" or machine is None:
                return {"error": f"the guest is {state}"}
            try:
                return {"injected": machine.inject(**request["inject"])}
            except PfcxlError as exc:
                return {"error": str(exc).splitlines()[0]}
        finally:
            self.lock.release()

    def serve(self) -> int:
        from pfcxl.machine import Machine      # the daemon only: keeps `pfcxl ps` light

        (self.where / DAEMON).write_text(json.dumps({"pid": os.getpid(), "started": time.time()}))
        listener = self.listen()
        signal.signal(signal.SIGTERM, lambda *a: self.stopping.set())
        options = BootOptions.from_dict(self.request["options"])
        try:
            self.machine = Machine(self.request["topology"], keep=True, name="guest",
                                   ready_timeout=self.request.get("ready_timeout", 300),
                                   options=dataclasses.replace(options, run_dir=str(self.where)))
            self.machine.start()               # main thread: QEMU dies with it (PDEATHSIG)
            self.state = "ready"
        except BaseException as exc:
            (self.where / ERROR).write_text(str(exc) + "\n")
            self.state = "failed"
            listener.close()
            return 1
        try:
            while not self.stopping.wait(0.5):     # a timed wait lets SIGTERM's handler run
                pass
        finally:
            with self.lock:                    # a running exec finishes first
                self.state = "stopping"
                self.machine.close()
            listener.close()
            shutil.rmtree(self.where, ignore_errors=True)
        return 0

    def _accept(self, listener: socket.socket) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                if exc.errno in _TRANSIENT:    # out of descriptors: wait for some to be freed
                    self.stopping.wait(0.1)
                    continue
                return                         # the listener is closed: the daemon is stopping
            if not self.slots.acquire(blocking=False):
                _refuse(conn, f"all {MAX_CONNECTIONS} connections to this machine are in use")
                continue
            try:
                threading.Thread(target=self.handle, args=(conn,), daemon=True).start()
            except RuntimeError:               # no thread to be had
                self.slots.release()
                _refuse(conn, "the daemon cannot start a thread for this connection")


def _refuse(conn: socket.socket, why: str) -> None:
    """One line saying why, without waiting on the client, then close."""
    with conn:
        try:
            conn.setblocking(False)
            conn.send(json.dumps({"error": why, "closed": "refused"}).encode() + b"\n")
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(Daemon(Path(sys.argv[1])).serve())
