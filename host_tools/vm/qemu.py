"""The QEMU command line of a topology, rendered from templates/qemu.args.j2.

Nothing here is written per topology: every device, bus number and window comes from the
`Topology`. `pfcxl qemu-args` prints the result (the --show-command of virtme-ng).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import jinja2

from pfcxl.device.topology import data_path
from pfcxl.device.topology import BACKEND_PREFIX, DIRECT_PREFIX, LSA_PREFIX, Topology
from pfcxl.device.topology.units import MiB
from pfcxl.errors import VMError

TEMPLATES = Path(__file__).parent / "templates"
QEMU_BINARY = "qemu-system-x86_64"
# Kernel command line every guest gets; topology and CLI add to it.
# no_timer_check: Linux checks at boot that the IO-APIC timer interrupt arrives within a few ticks,
# and panics ("IO-APIC + timer doesn't work!") when it does not; under TCG on a loaded host the
# vCPU thread can be kept from a CPU through that window (seen once in a test run here).
BASE_CMDLINE = "console=ttyS0 panic=-1 quiet no_timer_check"
# What a lean boot adds (Linux 6.12, Documentation/admin-guide/kernel-parameters.txt), each cutting
# work a CXL test guest does not need; host_tools/experiments/boot.py measures lean against classic.
# A lean boot also starts the uncompressed kernel at its PVH entry (host_tools/image/kernel_pvh.py).
LEAN_CMDLINE = " ".join((
    "mitigations=off",          # no speculation mitigations: far less alternatives/return-thunk patching
    "tsc=reliable",             # no clocksource watchdog on TCG's TSC
    "nowatchdog",               # no soft/hard lockup detectors (TCG stalls would only trip them)
    "audit=0",
    "lsm=capability",           # no AppArmor/IMA/EVM/landlock set-up; capabilities are all init uses
    "8250.nr_uarts=1",          # the one serial port the console uses
    "rcupdate.rcu_expedited=1",  # module loading waits on RCU grace periods; expedite them
    # Boot-time self-tests and set-up the guest never uses (initcall_debug showed them among the
    # slowest initcalls under TCG): the crypto algorithms' self-tests, the jitter entropy source's
    # (~0.25 s), the SP800-108 KDF's and the encrypted-keys type.
    "cryptomgr.notests=1",
    # trace_eval_init (~60 ms) maps enums for trace event formats, which nobody reads here;
    # load_system_certificate_list (~35 ms) parses the kernel's X.509 keys, which only module
    # signature checks use: the image's modules carry no signature (elf_deps.unsigned_module),
    # so each loads without the RSA check and taints the kernel 'E' (unsigned module), nothing else
    "initcall_blacklist=jent_mod_init,crypto_kdf108_init,init_encrypted,trace_eval_init,"
    "load_system_certificate_list",
    "ipv6.disable=1",           # the guest has no network; inet6_init was the second-slowest initcall (~0.2 s)
    "rodata=off",               # no read-only kernel text/data and no W+X page-table walk (~0.15 s)
))
# Firmware stays SeaBIOS: qboot (-bios qboot.rom) boots the kernel but leaves the pxb-cxl root
# ports without bus numbers and bridge windows, so no memdev ever appears (tried).


def qemu_opt(value: object) -> str:
    """QEMU option values separate keys with commas; a literal comma is written twice."""
    return str(value).replace(",", ",,")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=False, autoescape=False)
    env.filters["opt"] = qemu_opt
    env.filters["mib"] = lambda n: n // MiB
    return env


def render_lines(template: str, **context: object) -> list[str]:
    """Render a one-option-per-line template into argv: '-opt value' -> ['-opt', 'value']."""
    text = _environment().get_template(template).render(**context)
    argv: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line:
            argv.extend(line.split(" ", 1))
    return argv


@dataclass(frozen=True)
class BootFiles:
    kernel: Path
    initrd: Path
    cmdline: str


def kernel_cmdline(topo: Topology, extra: str = "", lean: bool = True) -> str:
    return " ".join(part for part in (BASE_CMDLINE, LEAN_CMDLINE if lean else "", topo.guest.cmdline, extra)
                    if part)


def backing_paths(topo: Topology, run_dir: Path) -> dict[str, Path]:
    """Device id -> the file that holds its memory (shared with other QEMUs and the host).
    Devices the appliance serves are not here: their memory comes as descriptors (inherited_backing)."""
    return {d.id: run_dir / f"{d.id}.mem" for d in topo.devices if d.appliance is None}


def inherited_backing(fds: dict[str, int]) -> dict[str, str]:
    """Device id -> descriptor QEMU inherits (same number) -> mem-path=/proc/self/fd/N.

    memory-backend-file opens mem-path with a plain open(), so /dev/fdset paths do not work
    there; reopening the inherited descriptor through /proc maps the very same memfd or file."""
    return {dev_id: f"/proc/self/fd/{fd}" for dev_id, fd in fds.items()}


def lsa_path(memory_path: Path | str) -> Path:
    """A persistent device's label storage area lives beside its memory: <device>.lsa."""
    return Path(memory_path).with_suffix(".lsa")


def prepare_backing(topo: Topology, run_dir: Path) -> dict[str, Path]:
    """Create missing backing files (sparse) and refuse ones of the wrong size: never truncate data."""
    paths = backing_paths(topo, run_dir)
    wanted = [(paths[d.id], d.capacity, d.id) for d in topo.devices if d.id in paths]
    wanted += [(lsa_path(paths[d.id]), d.lsa, d.id) for d in topo.devices if d.id in paths and d.lsa]
    for path, size, dev_id in wanted:      # every size checked before anything is created
        if path.exists() and path.stat().st_size not in (0, size):
            raise VMError(f"backing file {path} holds {path.stat().st_size} bytes but device '{dev_id}' "
                          f"needs {size}: use another --run-dir or remove the file")
    for path, size, dev_id in wanted:
        # Create without O_EXCL: two boots on one fresh --run-dir may both get here, and the later
        # one opens the file the other made. Growing an empty file loses nothing. 0600: guest memory.
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            have = os.fstat(fd).st_size
            if have == 0:
                os.ftruncate(fd, size)
            elif have != size:
                raise VMError(f"backing file {path} holds {have} bytes but device '{dev_id}' needs "
                              f"{size}: use another --run-dir or remove the file")
        finally:
            os.close(fd)
    return paths


# The virtio-serial port's name: guest/init finds it by this name in /sys/class/virtio-ports
OUTPUT_PORT = "pfcxl.out"


def argv(topo: Topology, boot: BootFiles, backing: dict[str, Path | str], *, console_fd: int, qmp_fd: int,
         output_fd: int | None = None, qemu: str = QEMU_BINARY, cdat: dict[str, Path] | None = None,
         numa_args: list[str] | None = None, extra_args: list[str] | None = None) -> list[str]:
    """QEMU's argv. `cdat` maps device/switch ids to CDAT files; `numa_args` are generic-port and
    HMAT options (firmware_tables.generate), given together when the topology has timing.
    `extra_args` are appended verbatim (e.g. the TCG plugin options of host_tools/timing/config.py).
    `output_fd` is the socket of the virtio-serial port commands write their output to
    (OUTPUT_PORT in the guest; host_tools/vm/console.py)."""
    for w in topo.windows:
        if w.arithmetic != "modulo":
            raise VMError(f"window '{w.id}' uses {w.arithmetic} arithmetic, but QEMU 10 routes CXL windows "
                          "by modulo only; such a topology can be turned into tables (pfcxl tables), not booted")
    return [qemu] + render_lines("qemu.args.j2", topo=topo, guest=topo.guest, kernel=boot.kernel,
                                 initrd=boot.initrd, cmdline=boot.cmdline, backing=backing,
                                 lsa_backing={d.id: lsa_path(backing[d.id]) for d in topo.devices if d.lsa},
                                 console_fd=console_fd, qmp_fd=qmp_fd, output_fd=output_fd,
                                 output_port=OUTPUT_PORT, backend_prefix=BACKEND_PREFIX,
                                 lsa_prefix=LSA_PREFIX, direct=data_path.has_direct(topo), direct_prefix=DIRECT_PREFIX,
                                 cdat=cdat or {}, numa_args=numa_args or []) + list(extra_args or [])


def show(argv_list: list[str]) -> str:
    """A command line a person can paste into a shell."""
    return shlex.join(argv_list)


def qemu_binary() -> str:
    return os.environ.get("PFCXL_QEMU", QEMU_BINARY)
