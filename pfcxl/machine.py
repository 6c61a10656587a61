"""pfcxl's public API: one booted appliance host (`Machine`). The appliance service (`Appliance`) is
in pfcxl/appliance.py, what commands give back: `Result` (host_tools/vm/host.py) and `TracedRun`
(host_tools/timing/traced_run.py).

    import pfcxl
    with pfcxl.Machine("two-hb-interleave") as m:
        print(m.ready["regions"])                      # the guest's PFCXL-READY record
        result = m.run("cxl list -R")                 # Result(status, data): .data bytes, .output text
        m.qmp("query-status")

Every boot in pfcxl goes through `Machine`: the CLI (`run`, `boot`, `demo`, `bench`,
`multihost`), the tests and users' own scripts. The steps of a boot, in order:

    topology file -> Topology                       (device.topology: load and validate)
    Topology -> firmware tables                     (firmware_tables.generate.tables_for)
    CEDT policy -> guest image (+ our CEDT)         (firmware_tables.boot_policy.cedt_for_boot, host_tools.image)
    timing mode -> plugin options                   (host_tools.timing.plugin_args)
    all of it -> QEMU argv                          (host_tools.vm.VM.planned_argv; `pfcxl qemu-args`)
    argv -> QEMU, console, QMP, PFCXL-READY         (host_tools.vm.VM.launch / wait_ready)

`plan()` stops before QEMU starts: what `pfcxl qemu-args` and `pfcxl run --dry-run` print.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from pfcxl.device.topology import data_path as data_path_mod
from pfcxl.device.fabric import constants as fabric_constants
from pfcxl.device.fabric import model as fabric_model
from pfcxl.device import topology as topology_mod
from pfcxl.device.appliance import timeline as timeline_mod
from pfcxl.device.topology import Topology
from pfcxl.errors import PfcxlError, VMError
from pfcxl.firmware_tables import boot_policy, generate
from pfcxl.host_tools import appliance_client as appliance_mod
from pfcxl.host_tools.image import initramfs as image_mod
from pfcxl.host_tools.argtypes import writable_dir
from pfcxl.host_tools import timeouts
from pfcxl.host_tools.vm.boot_options import BootOptions
from pfcxl.host_tools.vm.guest_names import guest_name
from pfcxl.host_tools.image import kernel_package as kernel_package_mod
from pfcxl.host_tools.image import own_kernel
from pfcxl.host_tools.vm import qemu as qemu_mod
from pfcxl.host_tools.vm import qemu_binary
from pfcxl.host_tools.vm import timed_qemu
from pfcxl.host_tools.timing import calibration
from pfcxl.host_tools.timing import plugin as timing_plugin
from pfcxl.host_tools.timing import config as timing_mod
from pfcxl.host_tools.vm import host as vm_mod
from pfcxl.host_tools.vm.host import VM, Result
from pfcxl.host_tools.timing.traced_run import Started, Tracer, TracedRun

DEFAULT_NAME = "guest"
# What a plan shows for a run directory that does not exist yet (a temporary one per boot).
RUN_DIR_PLACEHOLDER = Path("RUN_DIR")


@dataclass(frozen=True)
class Plan:
    """Everything a boot will use, decided before anything starts."""

    topology: Topology
    image: image_mod.BootImage
    tables: generate.TableSet
    cedt_override: bool            # our CEDT replaces QEMU's through the initrd table upgrade
    run_dir: Path
    argv: list[str]
    kernel: Path                   # the file argv boots: the image's vmlinuz, or its PVH vmlinux (lean)
    files: dict[str, Path] = field(default_factory=dict)   # what launch writes, by role


def load_topology(value: str | Path | Topology | None) -> tuple[Topology, Path | None]:
    """A topology argument (shipped name, TOML path or Topology) -> (Topology, its file or None)."""
    if isinstance(value, Topology):
        return value, None
    path = topology_mod.resolve(value)
    return topology_mod.load(path), path


def timing_config(mode: str | timing_mod.TimingConfig | None, *, profile: str = "pf",
                  baseline_ns: float | None = None) -> timing_mod.TimingConfig | None:
    """None, a TimingConfig, or a mode name. Inject adds `profile`'s idle latencies from the fabric
    constants and `baseline_ns` (0 when not given: Machine measures it at boot then)."""
    if mode is None or isinstance(mode, timing_mod.TimingConfig):
        return mode
    if mode != "inject":
        return timing_mod.TimingConfig(mode)
    if profile not in fabric_constants.PROFILES:
        raise PfcxlError(f"inject profile '{profile}' is unknown (known: {', '.join(fabric_constants.PROFILES)})")
    return timing_mod.TimingConfig("inject", read_ns=fabric_model.idle_ns(profile, False),
                                   write_ns=fabric_model.idle_ns(profile, True),
                                   baseline_ns=baseline_ns or 0.0)


class Machine:
    """One emulated host booted from a topology; a context manager. See the module docstring.

    topology: shipped name, TOML path or Topology (default pf-nic). What it boots besides: `options`,
    a BootOptions (what the CLI builds and `run --reuse` matches on), or its fields as keywords, e.g.
    Machine("pf-nic", timing="trace", image="debian", clock="virtual"); each field is described
    once, in host_tools/vm/boot_options.py (timing, image, host, appliance, run_dir, cedt, append,
    data_path, qemu, qemu_args, kernel, modules, kernel_package, packages, issue, clock, fabric,
    fabric_params, lean, inject_profile, baseline_ns). A name that is no field is refused in one line.
    On the appliance: `appliance` is an Appliance or its run directory (default: the topology's
    default appliance directory), or `attachment` one the caller made on its own connection
    (appliance.Client.attach); on a timed appliance the plugin traces into the ring it hands out
    (appliance_stats() reads its figures). keep: keep a temporary run directory (it is kept anyway
    when the boot failed). ready_timeout: seconds to PFCXL-READY. name: what the guest's logs and
    files are called (default: "guest", or "guest-1", ... when other live guests share the run
    directory). prebuilt: the boot_image() of another Machine with the same topology and options,
    to skip the cache check. progress: called with a line per step.

    The constructor only stores and checks settings: resolve() (called by plan(), boot_image()
    and launch()) finds the QEMU and probes its version, checks an own kernel and downloads a
    kernel package, once.
    """

    def __init__(self, topology: str | Path | Topology | None = None, *, options: BootOptions | None = None,
                 attachment: appliance_mod.Attachment | None = None, keep: bool = False,
                 ready_timeout: float = timeouts.READY_S, name: str | None = None,
                 prebuilt: image_mod.BootImage | None = None, progress: Callable[[str], None] | None = None,
                 **fields: Any) -> None:
        """Stores and checks the settings; starts, probes and downloads nothing (plan() and
        launch() do, once: the QEMU's version, a kernel package, the image)."""
        if options is not None and fields:
            raise PfcxlError("give the boot options once: as options=BootOptions(...) or as keywords")
        self.options = options = options if options is not None else BootOptions.of(**fields)
        options.check_bootable()
        self.issue = options.issue
        self.topology, self.topology_path = load_topology(topology)
        self.topology = data_path_mod.with_data_path(self.topology, options.data_path)
        if ready_timeout <= 0:
            raise PfcxlError(f"ready timeout must be positive, not {ready_timeout}")
        self.clock, self.fabric = options.clock, options.fabric
        timing = options.timing
        if self.clock == "virtual":
            timing = _virtual_timing(self.topology, timing)
        self.timing_config = timing_config(timing, profile=options.inject_profile, baseline_ns=options.baseline_ns)
        if self.timing_config is not None and (self.clock == "virtual" or options.fabric_params):
            self.timing_config = dataclasses.replace(self.timing_config, clock=self.clock, fabric=self.fabric,
                                                     fabric_params=options.fabric_params)
        # inject named by mode without a baseline: measured first, in a count-mode guest, at launch
        self._calibrate = timing == "inject" and options.baseline_ns is None
        self.image_kind, self.host, self.cedt, self.append = options.image, options.host, options.cedt, options.append
        self.lean = options.lean
        self.appliance = options.appliance
        # resolved by _resolve_qemu() (plan, launch): the timed QEMU's path and firmware, a version probe
        self.qemu: str | None = None
        self.qemu_version: str | None = None
        self.qemu_args = list(options.qemu_args)
        self.own_kernel: own_kernel.Kernel | None = None        # by _resolve_kernel(): checks files, may download
        self._resolved = False
        self.run_dir_arg = Path(options.run_dir) if options.run_dir is not None else None
        self.keep, self.ready_timeout = keep, ready_timeout
        self.name = name or DEFAULT_NAME
        self._pick_name = name is None
        self.say = progress or (lambda message: None)
        self.run_dir: Path | None = None
        self.vm: VM | None = None
        self.timing: timing_mod.TimingSession | None = None
        self.attachment = attachment
        self._image = prebuilt      # an image another Machine of the same topology built (multihost)
        self._stack: contextlib.ExitStack | None = None
        self._appliance_dir: Path | None = None
        self._boot_failed = False      # launch or wait_ready failed (not an interrupt)

    def resolve(self) -> "Machine":
        """Find the QEMU and the kernel a boot uses, once: a missing or too old QEMU, a timed QEMU
        not built, a kernel that is not one, in one line before anything is built or started.
        plan(), boot_image() and launch() call it; a kernel package is downloaded here."""
        if self._resolved:
            return self
        options = self.options
        if options.qemu is not None:
            self.qemu = qemu_binary.resolve(options.qemu)
            self.qemu_version = qemu_binary.version(self.qemu, min(qemu_binary.VERSION_TIMEOUT, self.ready_timeout))
        elif self.clock == "virtual":
            self.qemu = timed_qemu.binary()
            self.qemu_args = timed_qemu.firmware_args() + list(options.qemu_args)
        else:
            self.qemu = qemu_mod.qemu_binary()
        if options.kernel is not None:
            self.own_kernel = own_kernel.own(options.kernel, options.modules)
        elif options.kernel_package is not None:
            self.own_kernel = kernel_package_mod.kernel(options.kernel_package, self.say)
        self._resolved = True
        return self

    # ------------------------------------------------------------------ plan

    def boot_image(self, progress: Callable[[str], None] | None = None) -> image_mod.BootImage:
        """The guest image (built once, then cached by the hash of its inputs)."""
        self.resolve()
        if self._image is None:
            ours = boot_policy.cedt_for_boot(self.topology, self.cedt)
            self._image = image_mod.build(self.topology, progress=progress or self.say, kind=self.image_kind,
                                          acpi_tables={"CEDT": ours} if ours else None, kernel=self.own_kernel,
                                          packages=self.options.packages)
        return self._image

    def _vm(self, run_dir: Path, plugin_args: list[str], appliance_fds: dict[str, int] | None = None,
            ring_fd: int | None = None) -> VM:
        return VM(self.topology, self.boot_image(), run_dir, name=self.name, extra_cmdline=self.append,
                  appliance_fds=appliance_fds, extra_args=plugin_args, lean=self.lean, ring_fd=ring_fd,
                  qemu_path=self.qemu, qemu_args=self.qemu_args)

    def _plugin_args(self, run_dir: Path, config: timing_mod.TimingConfig | None) -> list[str]:
        if config is None:
            return []
        return timing_mod.plugin_args(timing_plugin.build_plugin(), self.topology, run_dir, config, self.name)

    def plan(self) -> Plan:
        """What a boot would use (image, tables, argv, files), without starting anything."""
        self.resolve()
        run_dir = self.run_dir or self.run_dir_arg or RUN_DIR_PLACEHOLDER
        config = self.timing_config   # a baseline still to measure is shown as 0
        vm = self._vm(run_dir, self._plugin_args(run_dir, config))
        files = {f"backing {k}": v for k, v in qemu_mod.backing_paths(self.topology, run_dir).items()}
        files.update({f"CDAT {k}": vm.tables_dir() / f"{k}.cdat"
                      for k in {**vm.tables.device_cdat, **vm.tables.switch_cdat}})
        files.update({"console log": vm.console_log, "QEMU log": vm.qemu_log})
        ours = boot_policy.cedt_for_boot(self.topology, self.cedt)
        return Plan(self.topology, self.boot_image(), vm.tables, ours is not None, run_dir,
                    vm.planned_argv(), vm.kernel, files)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> "Machine":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> "Machine":
        """Boot and wait for PFCXL-READY; on failure nothing is left running."""
        self.launch()
        try:
            self.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def launch(self) -> None:
        """Start QEMU and return at once (several Machines can then boot side by side)."""
        if self._stack is not None:
            raise VMError(f"{self.name}: this Machine was already started")
        self.resolve()
        stack = self._stack = contextlib.ExitStack()
        try:
            self.run_dir = stack.enter_context(_run_directory(self.run_dir_arg, self.keep, self.say,
                                                              lambda: self._boot_failed))
            if self._pick_name:   # guests sharing a run directory each get their own log names
                self.name = stack.enter_context(guest_name(self.run_dir, self.name))
            fds = self._attach(stack)
            self.boot_image()
            config = self.timing_config = self._in_timeline(self.timing_config)
            if self._calibrate and config is not None:      # inject mode without a baseline
                config = self.timing_config = _with_baseline(config, self._measure_baseline())
                self._calibrate = False
            attachment = self.attachment
            ring_fd = attachment.ring_fd if attachment is not None else None
            if attachment is not None and ring_fd is not None:    # the appliance drains and models this host's trace
                plugin_args = self._appliance_plugin_args(config, attachment.ring or {}, self.run_dir)
            elif config is not None:
                self.timing = stack.enter_context(timing_mod.TimingSession(self.topology, self.run_dir, config,
                                                                           name=self.name))
                plugin_args = self.timing.qemu_args()
            else:
                plugin_args = []
            self.vm = self._vm(self.run_dir, plugin_args, fds, ring_fd)
            stack.callback(self.vm.shutdown)
            self.vm.launch(self.ready_timeout)      # QEMU's monitor answers within it, or the boot fails
        except Exception:
            self._boot_failed = True       # a temporary run directory is kept: the error names its logs
            self.close()
            raise
        except BaseException:
            self.close()
            raise

    def wait_ready(self) -> dict:
        try:
            info = self._booted().wait_ready(self.ready_timeout)
        except Exception:
            self._boot_failed = True
            raise
        if self.timing is not None:
            self.timing.start()
        return info

    def close(self) -> None:
        """Shut the guest down and release everything, in reverse order; harmless twice."""
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    def _attach(self, stack: contextlib.ExitStack) -> dict[str, int] | None:
        served = [(d.id, d.appliance) for d in self.topology.devices if d.appliance]
        if not served:
            return None
        if self.attachment is not None:
            return {dev: self.attachment.region(part).fd for dev, part in served}
        if self.appliance is None:
            where = appliance_mod.default_dir(self.topology)
        elif isinstance(self.appliance, (str, Path)):
            where = Path(self.appliance)
        else:                                   # a pfcxl.Appliance
            where = self.appliance.directory
        self._appliance_dir = where
        client = stack.enter_context(appliance_mod.Client(where))
        attachment = self.attachment = client.attach(self.host)
        self.say(f"attached as host {attachment.host} at appliance port {attachment.port} ({where})")
        return {dev: attachment.region(part).fd for dev, part in served}

    def _in_timeline(self, config: timing_mod.TimingConfig | None) -> timing_mod.TimingConfig | None:
        """An appliance that keeps a timeline (--clock virtual): a timed guest joins it as its host id;
        one on the emulator's clock stays out, and is told so in one line."""
        if self._appliance_dir is None or self.attachment is None:
            return config
        path = timeline_mod.path_in(self._appliance_dir)
        if not path.exists():
            return config
        if config is None or config.clock != "virtual":
            self.say(f"host {self.attachment.host} runs on the emulator's clock, so it stays out of the "
                     f"appliance's timeline ({path}): boot it with --clock virtual to join")
            return config
        return dataclasses.replace(config, timeline=str(path), timeline_host=self.attachment.host)

    def _appliance_plugin_args(self, config: timing_mod.TimingConfig | None, ring: dict, run_dir: Path) -> list[str]:
        """A timed appliance (`pfcxl appliance start --fabric`) owns this host's trace ring: the
        plugin runs in trace mode into it, and no timing of this Machine's own can run beside it."""
        if config is not None and config.mode != "trace":
            raise PfcxlError(f"the appliance models every host's traffic ({ring.get('system')} timing), so its "
                             f"hosts' plugin runs in trace mode: timing '{config.mode}' cannot run beside it "
                             "(start the appliance without --fabric, or drop --timing here)")
        ring_path = f"/proc/self/fd/{vm_mod.ring_fd_number(self.topology)}"
        return timing_mod.plugin_args(timing_plugin.build_plugin(), self.topology, run_dir,
                                      timing_mod.TimingConfig("trace"), self.name, ring=ring_path)

    def appliance_stats(self, sync: bool = True, timeout: float = timeouts.STATS_SYNC_S) -> dict:
        """The timed appliance's telemetry (op stats): with `sync`, once everything this host's
        plugin has written so far is modelled."""
        if not self.on_timed_appliance or self._appliance_dir is None:
            raise PfcxlError(f"{self.name}: not attached to a timed appliance (pfcxl appliance start --fabric pf)")
        with appliance_mod.Client(self._appliance_dir, timeout=timeout) as client:
            return client.call("stats", sync=sync)

    def _measure_baseline(self) -> float:
        """Inject mode: the emulator's own cost per CXL request, from a count-mode guest."""
        self.say("calibrating the emulator's cost per CXL request (a count-mode guest)")
        # the same boot options (data path, lean, append... included) in count mode
        probe = Machine(self.topology, ready_timeout=self.ready_timeout, name="calibrate", progress=self.say,
                        options=dataclasses.replace(self.options, timing="count", baseline_ns=None,
                                                    run_dir=str(self._run_dir() / "calibrate")))
        # two inject runs on one --run-dir calibrate side by side: calibrate, calibrate-1, ... (the
        # logs and the plugin's event log, which the baseline is read from, are named after it)
        probe._pick_name = True
        with probe:
            return calibration.calibrate_baseline(probe)["baseline_ns"]

    # ------------------------------------------------------------------ the booted guest

    @property
    def argv(self) -> list[str]:
        """Exactly what was exec'd."""
        return list(self._booted().argv)

    @property
    def tables(self) -> generate.TableSet:
        return self._booted().tables

    @property
    def ready(self) -> dict:
        """The guest's PFCXL-READY record (kernel, regions and their DAX devices)."""
        return self._booted().ready_info

    @property
    def console(self) -> int:
        """The console socket's descriptor, for an interactive session (host_tools.terminal)."""
        return self._booted().console_fd

    @property
    def pid(self) -> int | None:
        return self.vm.pid if self.vm else None

    @property
    def state(self):
        """The VM's state (host_tools.vm.VMState), or None before launch."""
        return self.vm.state if self.vm else None

    def run(self, command: str | Sequence[str], timeout: float = timeouts.COMMAND_S) -> Result:
        """Run a command in the guest: a string is shell syntax, a list is argv (each word quoted);
        stdin is /dev/null. Its exit status and output. A command still running after `timeout`
        seconds is killed in the guest (VMError); the guest stays up for the next."""
        return self._booted().run(command, timeout)

    def check(self, command: str, timeout: float = timeouts.COMMAND_S) -> str:
        """Run a command that must succeed; its output."""
        return self._booted().check(command, timeout)

    def start_command(self, command: str | Sequence[str], timeout: float = timeouts.COMMAND_S):
        """Type a command and return at once; finish_command() collects it (killed at `timeout`)."""
        return self._booted().start_command(command, timeout)

    def finish_command(self, started, timeout: float = timeouts.COMMAND_S) -> Result:
        return self._booted().finish_command(started, timeout)

    def traced_run(self, command: str | Sequence[str], timeout: float = timeouts.COMMAND_S, *,
                   bracket: bool | None = None) -> TracedRun:
        """Run a command with the timing plugin watching (host_tools/timing/traced_run.py): bracketed by the phase
        markers (bracket None: when something traces this machine and the command does not mark
        its rows itself), its phase waited for, the trace drained (trace mode) for .model() or
        .rows(n); on a timed appliance, .appliance_figures()."""
        return self.finish_traced(self.start_traced(command, timeout, bracket=bracket), timeout)

    def start_traced(self, command: str | Sequence[str], timeout: float = timeouts.COMMAND_S, *,
                     bracket: bool | None = None) -> Started:
        """traced_run's first half: type the command and return at once (several hosts at a time)."""
        return self._tracer().start(command, timeout, bracket)

    def finish_traced(self, started: Started, timeout: float = timeouts.COMMAND_S) -> TracedRun:
        return self._tracer().finish(started, timeout)

    def _tracer(self) -> Tracer:
        """What the traced-run sequence needs of this guest: its session, or the timed appliance
        that models its trace."""
        config, attachment = self.timing_config, self.attachment

        def figures() -> dict:
            from pfcxl.host_tools.timing.telemetry_view import for_host
            assert attachment is not None
            return for_host(self.appliance_stats(sync=True), attachment.host)

        return Tracer(self._booted(), self.timing, self.topology, config.fabric_params if config is not None else (),
                      figures if self.on_timed_appliance else None)

    @property
    def on_timed_appliance(self) -> bool:
        """Does a timed appliance drain and model this host's trace?"""
        return self.attachment is not None and self.attachment.ring_fd is not None

    def qmp(self, command: str, **arguments: object) -> object:
        return self._booted().qmp(command, **arguments)

    def inject(self, kind: str, device: str, *, expect: bool = False, timeout: float = timeouts.EXPECT_S, **fields) -> dict:
        """Inject a CXL error into `device` (the topology's name) through QMP: kind is one of
        host_tools.inject.KINDS; fields are the QMP command's (dpa, length, log, type, ...; '_' for
        '-'), checked first (PfcxlError, one line, nothing injected). With `expect`, wait for the
        guest's record of it (poison list, CXL trace event, AER message) and return it as "guest"."""
        from pfcxl.host_tools.vm import inject as inject_mod
        return inject_mod.inject_into(self, kind, device, expect=expect, timeout=timeout, **fields)

    def _run_dir(self) -> Path:
        if self.run_dir is None:
            raise VMError(f"{self.name}: not started (use `with Machine(...) as m:` or m.start())")
        return self.run_dir

    def _booted(self) -> VM:
        if self.vm is None:
            raise VMError(f"{self.name}: not booted (use `with Machine(...) as m:` or m.start())")
        return self.vm


def _virtual_timing(topo: Topology, timing):
    """The plugin mode a virtual clock runs with: the plugin charges the clock, so it is always
    loaded (count unless trace was asked); one vCPU, since every vCPU shares one virtual clock."""
    if topo.guest.cpus > 1:
        raise PfcxlError(f"--clock virtual: topology '{topo.name}' gives its guest {topo.guest.cpus} vCPUs "
                         "([guest] cpus), but all vCPUs share one virtual clock, so charges are exact for one "
                         "vCPU only: use a topology with cpus = 1")
    mode = timing.mode if isinstance(timing, timing_mod.TimingConfig) else timing
    if mode == "inject":
        raise PfcxlError("--clock virtual charges the guest's own clock; --timing inject spins on host time "
                         "instead: use one of them")
    return timing if timing is not None else "count"


def _with_baseline(config: timing_mod.TimingConfig, baseline_ns: float) -> timing_mod.TimingConfig:
    return timing_mod.TimingConfig(config.mode, read_ns=config.read_ns, write_ns=config.write_ns,
                                   baseline_ns=baseline_ns, capacity=config.capacity, doorbell=config.doorbell)


@contextlib.contextmanager
def _run_directory(path: Path | None, keep: bool, say: Callable[[str], None],
                   boot_failed: Callable[[], bool] = lambda: False):
    """The directory for backing files and logs: given (kept), or temporary (removed afterwards,
    kept with its logs, less the guest's memory, when something failed: an exception through it,
    or `boot_failed()` when it is closed, as Machine closes its stack without the exception after a
    failed boot; a failure before anything was written there leaves nothing to keep)."""
    if path is not None:
        writable_dir(path, "run directory")       # 0700: it holds guest memory
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix="pfcxl-run-"))
    failed = True
    try:
        yield path
        failed = False
    finally:
        if keep or failed or boot_failed():
            if not keep:
                for f in path.glob("*.mem"):
                    f.unlink()
            if keep or any(path.iterdir()):
                say(f"run directory kept: {path}")
            else:
                path.rmdir()
        else:
            shutil.rmtree(path, ignore_errors=True)

