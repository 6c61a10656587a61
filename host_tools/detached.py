"""A Machine that stays up between commands: `pfcxl up`, `exec`, `ps`, `down`, `run --reuse`.

`up` starts a daemon process (`python -m pfcxl.host_tools.detached DIR`) in its own session. It
owns one pfcxl.Machine booted exactly as `pfcxl run` boots it, with DIR as its run directory,
and answers on DIR/control.sock. DIR is $PFCXL_CACHE/machines/<name>/ and holds:

    request.json   what `up` asked for: topology file, Machine options, their key (--reuse)
    daemon.json    the daemon's pid and start time, written first thing by the daemon
    control.sock   the control socket
    error          why the boot failed (then the daemon has exited; the logs stay for a look)
    daemon.log     the daemon's own output; and the Machine's files (guest.console.log, ...)

Protocol: one JSON line each way per connection. {"op": "status"} -> state and pids;
{"op": "exec", "command": str | [argv], "timeout": s} -> {"status", "output"} or {"error"};
{"op": "down"} -> {"ok": true}, then the daemon shuts the guest down, removes DIR and exits.
Commands run one at a time (the console is one shell); a second exec waits for the first.
QEMU dies with the daemon (PR_SET_PDEATHSIG, host_tools/process.py), so a killed daemon leaves
no guest running; a client then finds no one on the socket and says the machine is dead.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from pfcxl.errors import PfcxlError, VMError

from . import cache

SOCKET, REQUEST, DAEMON, ERROR, LOG = "control.sock", "request.json", "daemon.json", "error", "daemon.log"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Options that change what boots: two machines match for --reuse when these and the topology
# file's bytes are equal. Timeouts, progress and where files go do not change the guest.
BOOT_OPTIONS = ("timing", "image", "host", "appliance", "cedt", "append", "inject_profile", "baseline_ns", "lean",
                "qemu", "qemu_args", "kernel", "modules")


def machines_dir() -> Path:
    return cache.cache_dir() / "machines"


def machine_dir(name: str) -> Path:
    if not NAME_RE.match(name):
        raise PfcxlError(f"machine name '{name}' must be 1-64 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return machines_dir() / name


def boot_key(topology_path: Path, options: dict) -> str:
    """What --reuse matches on: the topology file's content and the boot options."""
    chosen = {k: options.get(k) for k in BOOT_OPTIONS}
    chosen["lean"] = chosen["lean"] is not False         # lean unless asked otherwise, as Machine
    text = Path(topology_path).read_bytes() + json.dumps(chosen, sort_keys=True).encode()
    return hashlib.sha256(text).hexdigest()


def _alive(pid: int | None) -> bool:
    """A process that exists and is not a zombie."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


# --------------------------------------------------------------------------- client side

def call(name: str, request: dict, timeout: float | None = 30) -> dict:
    """One request to machine `name`'s daemon; its reply. A daemon that is gone, or that dies
    before it answers, is a VMError naming the machine, never a hang."""
    where = machine_dir(name)
    if not where.is_dir():
        raise VMError(f"no machine '{name}' is up (pfcxl ps lists them)")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(str(where / SOCKET))
            s.sendall(json.dumps(request).encode() + b"\n")
            data = s.makefile("rb").readline()
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise VMError(f"machine '{name}' is {describe(name)['state']}; pfcxl down {name} removes it") from exc
        except socket.timeout as exc:
            raise VMError(f"machine '{name}' did not answer '{request['op']}' within {timeout:.0f}s") from exc
    if not data:
        raise VMError(f"machine '{name}' died while answering '{request['op']}': "
                      f"{describe(name)['state']}; pfcxl down {name} removes it")
    return json.loads(data)


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
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(10)
                s.connect(str(where / SOCKET))
                s.sendall(b'{"op": "status"}\n')
                info.update(json.loads(s.makefile("rb").readline() or b"{}"))
        except (OSError, json.JSONDecodeError):
            pass         # between the daemon's start and its socket: still "starting"
    return info


def names() -> list[str]:
    base = machines_dir()
    return sorted(p.name for p in base.iterdir() if p.is_dir() and NAME_RE.match(p.name)) if base.is_dir() else []


def up(name: str, topology_path: Path, topology_name: str, options: dict, wait: float = 900) -> dict:
    """Start machine `name` in the background and wait until it is ready; its description.
    A boot that fails raises VMError with the reason; its directory stays for `down`."""
    where = machine_dir(name)
    if where.exists():
        raise VMError(f"machine '{name}' exists ({describe(name)['state']}): pfcxl down {name} first, or "
                      "choose another --name")
    where.parent.mkdir(parents=True, exist_ok=True)
    where.mkdir(mode=0o700)
    request = {"topology": str(Path(topology_path).absolute()), "topology_name": topology_name,
               "options": options, "key": boot_key(topology_path, options)}
    (where / REQUEST).write_text(json.dumps(request, indent=1))
    with open(where / LOG, "ab") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "pfcxl.host_tools.detached", str(where)],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    deadline = time.monotonic() + wait
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
    raise VMError(f"machine '{name}' was not ready within {wait:.0f}s ({describe(name)['state']}); "
                  f"pfcxl down {name} stops it")


def exec_command(name: str, command: str | list[str], timeout: float = 600) -> tuple[int, str]:
    """Run a command in machine `name`: (exit status, output), as Machine.run gives them."""
    reply = call(name, {"op": "exec", "command": command, "timeout": timeout}, timeout=None)
    if "error" in reply:
        raise VMError(f"machine '{name}': {reply['error']}")
    return reply["status"], reply["output"]


def down(name: str, wait: float = 60) -> None:
    """Stop machine `name` (whatever its state) and remove its directory: no process, no file."""
    where = machine_dir(name)
    if not where.is_dir():
        raise VMError(f"no machine '{name}' is up (pfcxl ps lists them)")
    pid = _read_json(where / DAEMON).get("pid")
    if _alive(pid):
        try:
            call(name, {"op": "down"}, timeout=10)
        except VMError:
            pass                      # not answering: the signals below decide
        deadline = time.monotonic() + wait
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and _alive(pid):
                os.kill(pid, sig)
                deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not _alive(pid):
                break
    shutil.rmtree(where, ignore_errors=True)


def find_reusable(topology_path: Path, options: dict) -> str | None:
    """The name of a ready machine booted from the same topology content and boot options."""
    key = boot_key(topology_path, options)
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
        self.machine = None
        self.lock = threading.Lock()          # one command at a time on the console
        self.stopping = threading.Event()

    def status(self) -> dict:
        machine = self.machine
        state = self.state
        qemu_pid = machine.pid if machine is not None else None
        if state == "ready" and not _alive(qemu_pid):
            state = "crashed (QEMU exited; its log: " + str(machine.vm.qemu_log) + ")"
        return {"state": state, "qemu_pid": qemu_pid, "daemon_pid": os.getpid(),
                "regions": (machine.ready.get("regions", []) if self.state == "ready" else [])}

    def handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                request = json.loads(conn.makefile("rb").readline() or b"{}")
                reply = self.answer(request)
            except Exception as exc:          # a reply, not a dead daemon
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            try:
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError:
                pass                          # the client went away
        if reply.get("down"):
            self.stopping.set()

    def answer(self, request: dict) -> dict:
        op = request.get("op")
        if op == "status":
            return self.status()
        if op == "down":
            return {"ok": True, "down": True}
        if op == "inject":
            return self.inject(request)
        if op != "exec":
            return {"error": f"unknown op '{op}' (status, exec, down, inject)"}
        with self.lock:
            state = self.status()["state"]
            if state != "ready":
                return {"error": f"the guest is {state}"}
            try:
                result = self.machine.run(request["command"], timeout=float(request.get("timeout", 600)))
            except PfcxlError as exc:
                return {"error": str(exc).splitlines()[0], "state": self.status()["state"]}
            return {"status": result.status, "output": result.output}

    def inject(self, request: dict) -> dict:
        """pfcxl inject: Machine.inject in the machine this daemon keeps up."""
        with self.lock:
            if self.status()["state"] != "ready":
                return {"error": f"the guest is {self.status()['state']}"}
            try:
                return {"injected": self.machine.inject(**request["inject"])}
            except PfcxlError as exc:
                return {"error": str(exc).splitlines()[0]}

    def serve(self) -> int:
        from pfcxl.machine import Machine      # the daemon only: keeps `pfcxl ps` light

        (self.where / DAEMON).write_text(json.dumps({"pid": os.getpid(), "started": time.time()}))
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.where / SOCKET))
        listener.listen(16)
        listener.settimeout(0.5)
        accept = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        accept.start()
        signal.signal(signal.SIGTERM, lambda *a: self.stopping.set())
        options = dict(self.request["options"], run_dir=self.where, keep=True, name="guest")
        try:
            self.machine = Machine(self.request["topology"], **options)
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
            except OSError:
                return
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    sys.exit(Daemon(Path(sys.argv[1])).serve())
