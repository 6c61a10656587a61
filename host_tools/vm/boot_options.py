"""The options that change the booted machine, in one frozen set, each defined once: its field
carries its default and its command-line option (`Flag`: spelling, help, choices, type), and the
parser's boot options are generated from the fields (`add_arguments`). The parser fills the set
(`from_args`), pfcxl.Machine takes it (or keywords that are its fields), `--dry-run` prints it and
`run --reuse` hashes it with the topology file's bytes (host_tools/fleet/detached.py). Every other
option of a boot command is named in NOT_BOOT_OPTIONS with why it does not change the guest;
tests/unit/test_boot_options.py fails when a boot command grows an option that is in neither, or
writes a boot option by hand. Light: the CLI imports it to parse."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pfcxl.device.fabric.constants import PROFILES
from pfcxl.device.fabric.model import Params, idle_ns      # light: constants and dataclasses
from pfcxl.device.fabric.modes import ISSUES
from pfcxl.device.topology.data_path import DATA_PATHS
from pfcxl.errors import PfcxlError
from pfcxl.firmware_tables import CEDT_MODES
from pfcxl.host_tools import argtypes
from pfcxl.host_tools.image import DEFAULT_IMAGE, IMAGE_KINDS
from pfcxl.host_tools.image.debian_packages import parse_names
from pfcxl.host_tools.timing import CLOCKS, FABRICS, MODES as TIMING_MODES


@dataclass(frozen=True)
class Flag:
    """A field's command-line option. flags: its spellings (default --field-name); dest: the
    parsed name when it is not the field's; repeat: given once per value (a tuple field);
    exclusive: the name of a group of fields of which one may be given."""

    help: str
    flags: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    dest: str | None = None
    repeat: bool = False
    exclusive: str | None = None


def option(default: Any, help: str, **flag: Any) -> Any:
    """A BootOptions field with its command-line option."""
    return field(default=default, metadata={"flag": Flag(help, **flag)})


def api_only(default: Any, why: str) -> Any:
    """A BootOptions field the command line does not offer, and why."""
    return field(default=default, metadata={"api_only": why})


# QEMU options that would take QEMU away from pfcxl, which spawned it and shuts it down. QEMU
# reads each with one dash or two.
DETACHING_QEMU_ARGS = {
    "daemonize": "QEMU would fork into the background and detach (the guest would outlive the run, "
                 "orphaned, and its run directory be removed under it)",
}

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
        "hosts": "the loaded-latency curve: how many timed guests boot, each the same but for its host id",
        "quantum": "the loaded-latency curve: the quantum of its temporary appliance's timeline",
        "gaps": "the loaded-latency curve: the traffic hosts' paces, one round each in the booted guests",
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
    "kv replay": {
        "run_dir": "the appliance's run directory, whose pool holds the store (not a guest's)",
        "fabric": "the fabric the appliance models every guest's traffic on (--clock virtual: each "
                  "guest's charges too, which kv replay sets in the guests' options)",
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

    timing: Any = option(None, "load the TCG plugin: count (CXL requests), trace (every request, modelled on "
                         "the PF and electrical fabrics afterwards) or inject (slow the vCPU by the modelled "
                         "latency)", choices=TIMING_MODES)
    image: str = option(DEFAULT_IMAGE, "guest image: busybox (small) or debian (trixie with python3 and the "
                        "pfcxl_guest module; built once with mmdebstrap)", choices=IMAGE_KINDS)
    inject_profile: str = option("pf", "inject: whose idle latency to add (the fabric model's: "
                                 + ", ".join(f"{p} {idle_ns(p, False)} ns read, {idle_ns(p, True)} ns write"
                                             for p in PROFILES) + ")",
                                 choices=tuple(PROFILES))
    baseline_ns: float | None = option(None, "inject: the emulator's own cost per CXL request (default: "
                                       "measured first in a count-mode guest)", type=float)
    issue: str = option("dependent", "trace: model each vCPU's requests as dependent (pointer chase) or "
                        "independent", choices=ISSUES)
    host: int = option(0, "host id on the appliance, for topologies whose devices it serves", type=int)
    appliance: Any = option(None, "run directory of the appliance to attach to (default: "
                            "$PFCXL_CACHE/appliance/<topology name>)", flags=("--appliance-dir",),
                            dest="appliance_dir")
    run_dir: str | None = option(None, "directory for backing files and logs (kept; reused by a later boot, "
                                 "so memory contents persist)")
    cedt: str = option("auto", "whose CEDT the guest sees: QEMU's, or ours through the initrd table upgrade; "
                       "auto uses ours only when the topology sets fields QEMU cannot write", choices=CEDT_MODES)
    append: str = option("", "extra kernel command line")
    lean: bool = api_only(True, "the classic kernel command line is for the boot experiment "
                          "(host_tools/experiments/boot.py), not a user's choice")
    data_path: str | None = option(None, "how the guest reaches the memory: cxl (the CXL region, emulated "
                                   "I/O), direct (the same bytes as an NVDIMM devdax device at guest-RAM speed) "
                                   "or both (default: the topology's [guest] data_path, itself cxl by default)",
                                   choices=DATA_PATHS)
    qemu: str | None = option(None, "the QEMU binary to boot with (10.0 or newer; default "
                              "qemu-system-x86_64 from setup)", metavar="PATH")
    qemu_args: tuple[str, ...] = option((), "one more QEMU argument, appended after pfcxl's own (repeatable); "
                                        "one that starts with '-' is written with '=': --qemu-arg=-name "
                                        "--qemu-arg=mine", flags=("--qemu-arg",), metavar="ARG", repeat=True)
    kernel: str | None = option(None, "boot this kernel: a bzImage/vmlinuz file, or a kernel build tree (its "
                                "arch/x86/boot/bzImage, and vmlinux for the lean PVH entry)", metavar="PATH",
                                exclusive="kernel")
    modules: str | None = option(None, "the kernel's modules: an INSTALL_MOD_PATH tree (lib/modules/RELEASE); "
                                 "default for a build tree: the tree; the image takes the CXL, DAX, NVDIMM and "
                                 "kmem modules and their dependencies from it", metavar="DIR")
    kernel_package: str | None = option(None, "boot a Debian kernel package instead: a version (6.12.117, "
                                        "6.12.117-1 or 6.12.117+deb13-amd64) or latest, from bookworm-backports, "
                                        "trixie or trixie-backports; downloaded and unpacked into the cache once, "
                                        "each version kept", metavar="VERSION", exclusive="kernel")
    packages: tuple[str, ...] = option((), "more Debian trixie packages in the Debian image (with --image "
                                       "debian), with their dependencies, e.g. numactl; downloaded into the "
                                       "cache, the image reused for the same list", type=argtypes.packages,
                                       metavar="A,B")
    clock: str = option("emulator", "whose time the guest's clock keeps: emulator (the host's; TCG's cost, "
                        "never fabric latency) or virtual (the timed QEMU under -icount, one vCPU, 1 ns per "
                        "instruction: the plugin charges every memory request the modelled cache and fabric "
                        "latency, so guest programs read fabric time; needs `make setup-timed`)", choices=CLOCKS)
    fabric: str = option("pf", "--clock virtual: the fabric CXL requests are charged by: pf (the appliance's "
                         "DDR5 path), pf_hbm (with its HBM3E cache) or electrical (the switched pool)",
                         choices=FABRICS)
    fabric_params: tuple[str, ...] = option((), "what-if: change one figure of the fabric model, for --clock "
                                            "virtual's charges and for the offline model of a trace alike "
                                            "(repeatable). Names: module_read_ns, module_write_ns, hbm_hit_ns, "
                                            "port_mbs, host_link_mbs, switch_hop_ns, switch_link_mbs, hbm_cache "
                                            "(bytes a module); positive whole numbers", flags=("--fabric-param",),
                                            metavar="NAME=VALUE", repeat=True)

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
        for f in dataclasses.fields(self):
            choices = _flag(f).choices if "flag" in f.metadata else None
            value = getattr(self, f.name)
            if choices is not None and value is not None and not dataclasses.is_dataclass(value) \
                    and value not in choices:
                raise PfcxlError(f"{f.name} '{value}' is not one of {', '.join(choices)}")
        if isinstance(self.fabric_params, (str, bytes)):
            raise PfcxlError(f"fabric_params must be a list of NAME=VALUE strings, not {self.fabric_params!r}")
        object.__setattr__(self, "fabric_params", tuple(self.fabric_params))
        try:
            Params.parse(self.fabric_params)
        except ValueError as exc:
            raise PfcxlError(str(exc)) from None
        object.__setattr__(self, "lean", self.lean is not False)

    def check_bootable(self) -> None:
        """The options together, as a boot needs them (each alone is checked as it is set: a
        --reuse key or a --dry-run may hold any one)."""
        if self.packages and self.image != "debian":
            raise PfcxlError(f"--packages {','.join(self.packages)}: packages go into the Debian image; "
                             "add --image debian")
        if self.modules is not None and self.kernel is None:
            raise PfcxlError("modules: give them with the kernel they belong to (--kernel PATH --modules DIR)")
        if self.kernel_package is not None and self.kernel is not None:
            raise PfcxlError("kernel_package and kernel: give one kernel (--kernel-package or --kernel)")

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
    def of(cls, **fields: Any) -> "BootOptions":
        """BootOptions from keywords (Machine's, multihost's), a name that is no field refused in one line."""
        unknown = sorted(set(fields) - _FIELDS)
        if unknown:
            raise PfcxlError(f"{', '.join(unknown)}: not a boot option (the boot options: {', '.join(sorted(_FIELDS))})")
        return cls(**fields)

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


def _flag(f: dataclasses.Field) -> Flag:
    return f.metadata["flag"]


# The boot options by what they are about, for the commands that offer some of them
IMAGE = ("image", "packages")
PLACE = ("run_dir", "data_path", "append", "host", "appliance")
OWN_QEMU = ("qemu", "qemu_args", "kernel", "kernel_package", "modules")
PLUGIN = ("timing", "inject_profile", "baseline_ns", "issue")
CLOCK = ("clock", "fabric", "fabric_params")


def default_text(value: Any) -> str:
    """How help shows a field's default (None, "" and () show none: the help says what happens)."""
    return "" if value in (None, "", ()) else f" (default {value})"


def add_arguments(p: argparse.ArgumentParser, names: tuple[str, ...], *,
                  spellings: dict[str, tuple[str, ...]] | None = None, helps: dict[str, str] | None = None) -> None:
    """The command-line options of the fields `names`, made from each field's Flag and default.
    spellings, helps: a command's own spelling and words for a field's option (its choices, type
    and default stay the field's), e.g. multihost's --run-dir for the appliance."""
    spellings, helps = spellings or {}, helps or {}
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for name in names:
        f = _BY_NAME[name]
        flag = _flag(f)
        where: Any = p
        if flag.exclusive is not None:
            if flag.exclusive not in groups:
                groups[flag.exclusive] = p.add_mutually_exclusive_group()
            where = groups[flag.exclusive]
        words = spellings.get(name) or flag.flags or ("--" + name.replace("_", "-"),)
        kwargs: dict[str, Any] = {"help": helps.get(name, flag.help) + default_text(f.default), "dest": flag.dest or name}
        if flag.repeat:
            kwargs.update(action="append", default=[])
        else:
            kwargs.update(default=f.default, choices=flag.choices, type=flag.type)
        if flag.metavar is not None:
            kwargs["metavar"] = flag.metavar
        action = where.add_argument(*words, **kwargs)
        action.boot_field = name  # type: ignore[attr-defined]  # generated: test_option_contract.py


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


_BY_NAME = {f.name: f for f in dataclasses.fields(BootOptions)}
_FIELDS = set(_BY_NAME)
# the parsed name of an option whose name is not the field's
FIELD_OF_DEST = {_flag(f).dest: f.name for f in _BY_NAME.values() if "flag" in f.metadata and _flag(f).dest}
