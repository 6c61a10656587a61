"""`pfcxl.Appliance`: the appliance service of a topology in its run directory (the API of
host_tools/appliance_client.py, which talks to and starts device/appliance/service.py).

    with pfcxl.Appliance("pf-appliance", fabric="pf") as a:     # the running one, or one started here
        m = a.machine(host=0)
    pfcxl.Appliance("pf-appliance").serve()                     # stays up: `pfcxl appliance start`
    pfcxl.Appliance("pf-appliance").status()                    # the running one: `pfcxl appliance status`
    pfcxl.Appliance("pf-appliance").stop()                      # `pfcxl appliance stop`

It takes every option of the service (scan_interval, idle_timeout, fabric, issue, capture,
foreground, temporary), checked when it is made: a bad one is one line and nothing starts.
(`timing=` is fabric's old spelling: still taken, with a DeprecationWarning.)
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import warnings
from pathlib import Path

from pfcxl.device.topology import Topology
from pfcxl.errors import PfcxlError
from pfcxl.host_tools import appliance_client as appliance_mod, timeouts
from pfcxl.machine import Machine, load_topology
from pfcxl.renamed import renamed


class Appliance:
    """The appliance service for a topology (default pf-appliance) in `run_dir`; a context manager.

    start() (or `with`): the service already running in run_dir is used and left running (if it
    was started with the `fabric` and `capture` asked for); otherwise one is started there and
    stopped at close. run_dir None: a temporary directory and a temporary service.
    serve(): start one that outlives this process (an error if one runs); with `foreground` this
    process becomes the service (it does not return).
    stop(), call(), status(), where(): the service in run_dir, whoever started it; run_dir None
    there is the topology's default directory ($PFCXL_CACHE/appliance/<name>, `pfcxl appliance`'s).

    Options, those of device/appliance/service.py: scan_interval (seconds between change scans),
    idle_timeout (seconds a connection without an attachment may stay silent; default 60),
    fabric (pf | electrical: model every host's traffic on that fabric system), issue (dependent |
    independent, with fabric), capture (with fabric: keep every host's drained records in this absent or empty
    folder), quantum_ns (keep the timed hosts, --clock virtual, in one timeline in quanta of that
    many ns: device/appliance/timeline.py), foreground (serve in this process), temporary (the service dies with this process,
    however it dies, and removes run_dir as it exits).
    """

    def __init__(self, topology: str | Path | Topology | None = "pf-appliance", *,
                 run_dir: str | Path | None = None, scan_interval: float = 5.0, idle_timeout: float | None = None,
                 fabric: str | None = None, issue: str = "dependent", capture: str | Path | None = None,
                 quantum_ns: int | None = None, foreground: bool = False, temporary: bool = False,
                 timing: str | None = None) -> None:
        fabric = renamed("Appliance", "timing", timing, "fabric", fabric)
        self.topology, self.topology_path = load_topology(topology)
        self.capture = Path(capture).absolute() if capture is not None else None
        appliance_mod.check_options(self.topology, scan_interval=scan_interval, idle_timeout=idle_timeout,
                                    fabric=fabric, issue=issue, capture=self.capture, quantum_ns=quantum_ns)
        self.quantum_ns = quantum_ns                     # a timeline for timed hosts (--clock virtual)
        self.run_dir_arg = Path(run_dir) if run_dir is not None else None
        self.scan_interval, self.idle_timeout = scan_interval, idle_timeout
        self.fabric, self.issue = fabric, issue          # pf | electrical (call("stats"))
        self.foreground = foreground
        self.temporary = temporary or run_dir is None
        self.run_dir: Path | None = None
        self.pid: int | None = None
        self.started_here = False
        self._stack: contextlib.ExitStack | None = None

    @property
    def timing(self) -> str | None:
        """fabric's old name (a DeprecationWarning)."""
        warnings.warn("Appliance.timing is now Appliance.fabric; the old name will go", DeprecationWarning,
                      stacklevel=2)
        return self.fabric

    @property
    def directory(self) -> Path:
        """Where the service this object talks to runs (see the class docstring)."""
        return self.run_dir or self.run_dir_arg or appliance_mod.default_dir(self.topology)

    def __enter__(self) -> "Appliance":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> "Appliance":
        if self._stack is not None:
            raise PfcxlError("this Appliance was already started")
        if self.foreground:
            raise PfcxlError("foreground: the service runs in this process, so use serve(), not start()")
        stack = self._stack = contextlib.ExitStack()
        try:
            if self.run_dir_arg is None:
                self.run_dir = Path(tempfile.mkdtemp(prefix="pfcxl-appliance-"))
            else:
                self.run_dir = self.run_dir_arg
            self.pid = appliance_mod.running_pid(self.run_dir)
            if self.pid is None:
                if self.temporary:   # the service removes it as it exits; this, if it never started
                    stack.callback(shutil.rmtree, self.run_dir, ignore_errors=True)
                self.pid = self._start_service()
                self.started_here = True
                stack.callback(appliance_mod.stop, self.run_dir)
            if not self.started_here:
                self.check_running()
        except BaseException:
            self.close()
            raise
        return self

    def serve(self) -> int:
        """Start the service in run_dir and leave it running; its pid (foreground: never returns)."""
        self.run_dir = self.directory
        self.pid = self._start_service()
        return self.pid

    def stop(self) -> str:
        """Stop the service in run_dir, whoever started it; with none running, clean up what a
        crashed one left. What was done, in words."""
        return appliance_mod.stop(self.directory)

    def close(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    def _start_service(self) -> int:
        if self.topology_path is None:
            raise PfcxlError("the appliance service reads its topology from a file: give a "
                             "shipped name or a TOML path, not a Topology object")
        return appliance_mod.start(self.topology, self.topology_path, self.directory, foreground=self.foreground,
                                   scan_interval=self.scan_interval, idle_timeout=self.idle_timeout,
                                   temporary=self.temporary, fabric=self.fabric, issue=self.issue,
                                   capture=self.capture, quantum_ns=self.quantum_ns)

    def check_running(self) -> None:
        """The service running in run_dir is used as it is: it must time (and capture) as asked
        (PfcxlError, one line, if not)."""
        timed = self.call("hello")["appliance"].get("timing")
        if self.fabric is not None and timed is None:
            raise PfcxlError(f"the appliance running in {self.directory} models no traffic: stop it, or start it "
                             f"with 'pfcxl appliance start --fabric {self.fabric}'")
        if self.capture is not None and (timed or {}).get("capture") != str(self.capture):
            raise PfcxlError(f"the appliance running in {self.directory} captures into "
                             f"{(timed or {}).get('capture')}, not {self.capture}: stop it, or start it with "
                             f"'--capture {self.capture}'")

    def running_pid(self) -> int | None:
        """The pid of the service in run_dir, None if none runs there."""
        return appliance_mod.running_pid(self.directory)

    def call(self, op: str, *, timeout: float = timeouts.SERVICE_S, **fields: object) -> dict:
        """One control request (hello, status, layout, where, stats, ...) on a connection of its
        own (held connections count against the service's limit per process); its reply."""
        with appliance_mod.Client(self.directory, timeout=timeout) as client:
            return client.call(op, **fields)

    def status(self) -> dict:
        return self.call("status")

    def where(self, offset: int) -> dict:
        """The module (and offset inside it) and region that serve a pool offset."""
        return self.call("where", offset=offset)

    def machine(self, host: int, **options) -> Machine:
        """A Machine for `host` on this appliance (not yet booted)."""
        options.setdefault("name", f"host{host}")
        return Machine(self.topology_path or self.topology, host=host, appliance=self, **options)
