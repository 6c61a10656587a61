"""Lean boots start the kernel's own ELF at its PVH entry: unpacked once from vmlinuz, checked
to carry the PVH note, refused in one line when it cannot be."""

import subprocess

import pytest

from pfcxl.errors import ImageError
from pfcxl import cache
from pfcxl.host_tools.image import kernel_pvh
from pfcxl.machine import Machine

pytestmark = pytest.mark.component


def values(argv, flag):
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_the_shipped_kernel_unpacks_to_an_elf_with_a_pvh_entry():
    vmlinuz = sorted((cache.kernel_dir() / "boot").glob("vmlinuz-*"))[0]
    elf = kernel_pvh.uncompressed(vmlinuz)
    assert elf.parent == vmlinuz.parent and elf.name.startswith("vmlinux-")
    assert kernel_pvh.has_pvh_entry(elf.read_bytes())
    stamp = elf.stat().st_mtime_ns
    assert kernel_pvh.uncompressed(vmlinuz) == elf and elf.stat().st_mtime_ns == stamp   # cached


def test_lean_boots_the_elf_and_classic_the_bzimage():
    lean = Machine("pf-nic").plan().argv
    classic = Machine("pf-nic", lean=False).plan().argv
    assert values(lean, "-kernel")[0].endswith(".pvh") and "vmlinuz-" in values(classic, "-kernel")[0]
    assert "mitigations=off" in values(lean, "-append")[0].split()
    assert "mitigations=off" not in values(classic, "-append")[0].split()


@pytest.mark.parametrize("payload", [b"", b"not an ELF at all"])
def test_a_kernel_it_cannot_unpack_is_refused_and_nothing_is_written(tmp_path, payload):
    vmlinuz = tmp_path / "vmlinuz-test"
    body = subprocess.run(["zstd", "-q", "-c"], input=payload, capture_output=True, check=True).stdout if payload else b""
    vmlinuz.write_bytes(b"MZ bzImage header" + body)
    with pytest.raises(ImageError, match="vmlinuz-test: (no zstd payload|its payload is not an ELF with a PVH)"):
        kernel_pvh.uncompressed(vmlinuz)
    assert [p.name for p in tmp_path.iterdir()] == ["vmlinuz-test"]
