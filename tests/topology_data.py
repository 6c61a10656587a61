"""Shared by unit/test_topology_pmem, unit/test_qemu_qtest_machine and component/test_data_path:
the topologies kept in tests/data, and the QEMU options a topology renders to."""

from __future__ import annotations

import tomllib
from pathlib import Path

from pfcxl.host_tools.vm import qemu

DATA = Path(__file__).resolve().parent / "data"
PMEM = DATA / "topologies" / "pmem.toml"
QTEST = DATA / "topologies" / "qemu-qtest-cxl.toml"
GOLDEN_CEDT = DATA / "golden" / "CEDT.cxl"     # QEMU 10.0.2 tests/data/acpi/x86/q35/CEDT.cxl


def doc_of(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def argv_of(topo, run_dir="RUN") -> list[str]:
    boot = qemu.BootFiles(Path("VMLINUZ"), Path("INITRD"), "console=ttyS0")
    return qemu.argv(topo, boot, qemu.backing_paths(topo, Path(run_dir)), console_fd=3, qmp_fd=4)


def values_of(argv: list[str], option: str, prefix: str) -> list[str]:
    """The values of every `option` in argv that start with `prefix`."""
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == option and argv[i + 1].startswith(prefix)]
