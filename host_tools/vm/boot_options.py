"""The options that change the booted machine, in one frozen set: the parser fills it
(`from_args`), pfcxl.Machine takes it, `--dry-run` prints it and `run --reuse` hashes it with the
topology file's bytes (host_tools/fleet/detached.py). Every other option of a boot command is named in
NOT_BOOT_OPTIONS with why it does not change the guest; tests/unit/test_boot_options.py fails
when a boot command grows an option that is in neither. Light: the CLI imports it to parse."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pfcxl.device.fabric.modes import ISSUES
from pfcxl.errors import PfcxlError
from pfcxl.host_tools.image.debian_packages import parse_names
from pfcxl.host_tools.timing import CLOCKS, FABRICS

# QEMU options that would take QEMU away from pfcxl, which spawned it and shuts it down. QEMU
# reads each with one dash or two.
DETACHING_QEMU_ARGS = {
    "daemonize": "QEMU would fork into the background and detach (the guest would outlive the run, "
                 "orphaned, and its run directory be removed under it)",
}

# A command-line option whose name is not the field's.
FIELD_OF_DEST = {"appliance_dir": "appliance"}

# Options of the boot commands that do not change the booted machine, and why. "*": every boot
# command; a command's own entries say what its option means there.
NOT_BOOT_OPTIONS: dict[str, dict[str, str]] = {
    "*": {
        "topology": "the topology file: --reuse hashes its bytes, not its name or path",
        "topology_name": "the topology, given as a positional argument",
        "keep": "whether a temporary run directory stays afterwards",
        "timeout": "how long to wait for the guest to become ready",
        "command_timeout": "how long a guest command may take",
        "command": "the guest command, run in the booted machine",
        "dry_run": "prints the plan and starts nothing",
        "report": "where a timing report is written, after the run",
        "trace_out": "where captured trace records are saved, after the run",
        "reuse": "whether to look for a matching machine: the match is on these options",
        "lines": "qemu-args: how the argv is printed",
        "name": "up: the machine's name in pfcxl ps, not what it boots",
    },
    "bench": {
        "timing": "bench always boots in trace mode; --timing trace adds the whole-trace model afterwards",
        "suite": "which benchmarks run in the booted guest",
        "out": "the results directory",
    },
    "multihost": {
        "hosts": "how many machines boot; each is the same but for its host id",
        "parallel_boots": "how many boot at once",
        "timing": "the appliance's timing: a temporary appliance is started timed (each host's plugin "
                  "then traces into its ring, which Machine decides from the attachment)",
        "fabric": "the fabric a temporary appliance models",
        "issue": "the issue mode a temporary appliance models",
        "capture": "where a timed appliance keeps the drained records",
        "quantum": "the quantum of the timeline a temporary appliance keeps for its timed hosts "
                   "(the appliance's setting: each guest boots the same)",
    },
}


@dataclass(frozen=True)
class BootOptions:
    """What a Machine boots besides its topology. timing: None, "count", "trace", "inject" (or a
    host_tools.timing.TimingConfig); inject_profile / baseline_ns: inject's latencies and the
    emulator's cost per request (None: measured at boot); issue: how a trace is modelled
    (dependent or independent requests). image: "busybox" or "debian". host / appliance: the host
    id and the appliance (an Appliance or its run directory) for devices it serves. run_dir: kept
    backing files and logs (their contents persist into the guest's memory). cedt: "auto", "qemu" or
    "ours". append: extra kernel command line. lean: the lean kernel command line. data_path:
    "cxl", "direct", "both" or None (the topology's). qemu, qemu_args: a QEMU of one's own and
    more arguments. kernel, modules: a kernel of one's own and its modules; kernel_package: a Debian
    kernel by version or "latest" instead (host_tools/image/kernel_package.py). packages: more Debian
    packages in the Debian image, e.g. ("numactl",) (host_tools/image/debian_packages.py). clock:
    "emulator" (the guest's clock is the host's) or "virtual" (the timed QEMU under icount: the
    plugin charges the guest's clock the modelled latencies, host_tools/timing/vtime.py); fabric:
    which fabric a virtual clock is charged by, "pf", "pf_hbm" or "electrical"."""

    timing: Any = None
    inject_profile: str = "pf"
    baseline_ns: float | None = None
    issue: str = "dependent"
    image: str = "busybox"
    host: int = 0
    appliance: Any = None
    run_dir: str | None = None
    cedt: str = "auto"
    append: str = ""
    lean: bool = True
    data_path: str | None = None
    qemu: str | None = None
    qemu_args: tuple[str, ...] = ()
    kernel: str | None = None
    modules: str | None = None
    kernel_package: str | None = None
    packages: tuple[str, ...] = ()
    clock: str = "emulator"
    fabric: str = "pf"
    fabric_params: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # paths as absolute text: a daemon in another directory, and the key, see the same file
        for name in ("run_dir", "qemu", "kernel", "modules") + (
                () if _is_appliance(self.appliance) else ("appliance",)):
            value = getattr(self, name)
            if value is not None:
                text = str(value)
                object.__setattr__(self, name, str(Path(text).absolute()) if "/" in text or name != "qemu"
                                   else text)
        if isinstance(self.qemu_args, (str, bytes)) or not all(isinstance(a, str) for a in self.qemu_args):
            raise PfcxlError(f"qemu_args must be a list of strings, not {self.qemu_args!r}")
        object.__setattr__(self, "qemu_args", tuple(self.qemu_args))
        for arg in self.qemu_args:
            if arg.startswith("-") and arg.lstrip("-") in DETACHING_QEMU_ARGS:
                raise PfcxlError(f"--qemu-arg {arg}: {DETACHING_QEMU_ARGS[arg.lstrip('-')]}; pfcxl must stay QEMU's "
                                 "parent to shut it down")
        object.__setattr__(self, "packages", parse_names(self.packages))
        if self.issue not in ISSUES:
            raise PfcxlError(f"issue '{self.issue}' is not one of {', '.join(ISSUES)}")
        if self.clock not in CLOCKS:
            raise PfcxlError(f"clock '{self.clock}' is not one of {', '.join(CLOCKS)}")
        if self.fabric not in FABRICS:
            raise PfcxlError(f"fabric '{self.fabric}' is not one of {', '.join(FABRICS)}")
        if isinstance(self.fabric_params, (str, bytes)):
            raise PfcxlError(f"fabric_params must be a list of NAME=VALUE strings, not {self.fabric_params!r}")
        object.__setattr__(self, "fabric_params", tuple(self.fabric_params))
        from pfcxl.device.fabric.model import Params     # light: constants and dataclasses
        try:
            Params.parse(self.fabric_params)
        except ValueError as exc:
            raise PfcxlError(str(exc)) from None
        object.__setattr__(self, "lean", self.lean is not False)

    def as_dict(self) -> dict:
        """The fields as JSON values (request.json of a kept-up machine; --dry-run)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["qemu_args"] = list(self.qemu_args)
        values["packages"] = list(self.packages)
        values["fabric_params"] = list(self.fabric_params)
        if dataclasses.is_dataclass(self.timing) and not isinstance(self.timing, type):   # a TimingConfig
            values["timing"] = dataclasses.asdict(self.timing)
        if _is_appliance(self.appliance):
            values["appliance"] = str(self.appliance.run_dir)
        return values

    @classmethod
    def from_dict(cls, values: dict) -> "BootOptions":
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})

    def key(self, topology_path: str | Path) -> str:
        """What --reuse matches on: the topology file's bytes and every field."""
        text = Path(topology_path).read_bytes() + json.dumps(self.as_dict(), sort_keys=True).encode()
        return hashlib.sha256(text).hexdigest()

    def lines(self) -> list[str]:
        """--dry-run: one `name value` line per field."""
        return [f"  {name:15} {json.dumps(value)}" for name, value in self.as_dict().items()]


def _is_appliance(value: object) -> bool:
    return hasattr(value, "run_dir") and not isinstance(value, (str, Path))


def from_args(args) -> BootOptions:
    """The boot options a command's parsed arguments give; an option the command does not have
    keeps the field's default (demo has no timing options, so it boots without the plugin)."""
    values = {}
    own = NOT_BOOT_OPTIONS.get(getattr(args, "command_name", ""), {})   # e.g. multihost's --timing
    for dest, value in vars(args).items():
        name = FIELD_OF_DEST.get(dest, dest)
        if name in _FIELDS and dest not in own and value is not None:
            values[name] = value
    if values.get("qemu"):
        from pfcxl.host_tools.vm.qemu_binary import resolve      # a bare name: found on PATH now, as a shell would
        values["qemu"] = resolve(values["qemu"])
    return BootOptions(**values)


_FIELDS = {f.name for f in dataclasses.fields(BootOptions)}
