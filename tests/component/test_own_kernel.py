"""--kernel / --modules: a kernel of one's own (a bzImage file with its INSTALL_MOD_PATH tree, or a
build tree) is checked before anything boots: its release read from its own boot header, the
modules tree matched to it, a missing CXL module named in one line (modules.builtin honoured)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pfcxl.errors import ImageError
from pfcxl.guest import plan
from pfcxl import cache
from pfcxl.host_tools.image import elf_deps
from pfcxl.host_tools.image import kernel_pvh
from pfcxl.host_tools.image import own_kernel
from pfcxl.machine import Machine

MANIFEST = cache.read_manifest()
RELEASE = MANIFEST["kernel_release"]
VMLINUZ = Path(MANIFEST["vmlinuz"])
MODULES = Path(MANIFEST["modules_dir"])

pytestmark = pytest.mark.component


def install_tree(where: Path, drop: tuple[str, ...] = (), builtin: tuple[str, ...] = ()) -> Path:
    """An INSTALL_MOD_PATH tree of setup's modules (files linked, not copied), without the
    modules in `drop`, with `builtin` added to modules.builtin."""
    root = where / "lib" / "modules" / RELEASE
    shutil.copytree(MODULES, root, copy_function=os.symlink)
    for path in (root / "kernel").rglob("*.ko*"):
        if elf_deps.module_name(path) in drop:
            path.unlink()
    listing = root / "modules.builtin"
    text = listing.read_text()
    listing.unlink()
    listing.write_text(text + "".join(f"kernel/drivers/cxl/{name}.ko\n" for name in builtin))
    return where


def fake_bzimage(path: Path, version: str) -> Path:
    head = bytearray(0x1000)
    head[0x202:0x206] = b"HdrS"
    head[0x20E:0x210] = (0x800 - 0x200).to_bytes(2, "little")
    head[0x800:0x800 + len(version) + 1] = version.encode() + b"\0"
    path.write_bytes(bytes(head))
    return path


def test_the_release_is_read_from_the_kernels_own_boot_header():
    assert own_kernel.bzimage_release(VMLINUZ) == RELEASE


@pytest.mark.parametrize("release", ["6.12.0", "6.18.0-rc3+", "7.0.1-pfcxl_test~1", "6.1.0-28-amd64", "5.10.99"])
def test_any_release_string_is_read(tmp_path, release):
    bz = fake_bzimage(tmp_path / "bzImage", f"{release} (me@host) #1 SMP PREEMPT_DYNAMIC")
    assert own_kernel.bzimage_release(bz) == release


@pytest.mark.parametrize("body", [b"", b"\x7fELF" + bytes(0x300), bytes(0x1000)])
def test_a_file_that_is_not_a_bzimage_is_one_line(tmp_path, body):
    (tmp_path / "k").write_bytes(body)
    with pytest.raises(ImageError, match=r"^--kernel .*/k: not a bzImage[^\n]*$"):
        own_kernel.own(tmp_path / "k", tmp_path)


def test_arguments_are_checked_in_one_line(tmp_path):
    with pytest.raises(ImageError, match="no such file or directory"):
        own_kernel.own(tmp_path / "absent", None)
    with pytest.raises(ImageError, match="a kernel file needs --modules DIR"):
        own_kernel.own(VMLINUZ, None)
    with pytest.raises(ImageError, match=r"--modules .*/nothing: no such directory"):
        own_kernel.own(VMLINUZ, tmp_path / "nothing")
    with pytest.raises(ImageError, match=f"no lib/modules/{re.escape(RELEASE)}"):
        own_kernel.own(VMLINUZ, tmp_path)
    (tmp_path / "lib" / "modules" / "6.1.0-other").mkdir(parents=True)
    with pytest.raises(ImageError, match=f"holds modules for 6.1.0-other, but the kernel is {re.escape(RELEASE)}$"):
        own_kernel.own(VMLINUZ, tmp_path)


@pytest.mark.parametrize("missing", ["cxl_mem", "cxl_pci", "dax_cxl"])
def test_a_tree_missing_a_module_the_topology_needs_is_refused_in_one_line(tmp_path, missing):
    tree = install_tree(tmp_path / "mods", drop=(missing,))
    machine = Machine("pf-nic", kernel=VMLINUZ, modules=tree)
    with pytest.raises(ImageError) as caught:
        machine.boot_image()
    assert f"kernel module '{missing}'" in str(caught.value) and "\n" not in str(caught.value)
    assert "nor built in" in str(caught.value)


def test_a_module_built_in_is_not_needed_from_the_tree(tmp_path):
    tree = install_tree(tmp_path / "mods", drop=("cxl_mem",), builtin=("cxl_mem",))
    img = Machine("pf-nic", kernel=VMLINUZ, modules=tree).boot_image()
    planned = [line.split()[1] for line in _plan_lines(img.initrd) if line.startswith("module ")]
    assert "cxl_mem" not in planned and "cxl_acpi" in planned
    assert img.kernel_release == RELEASE and img.kernel_origin == f"--kernel {VMLINUZ}"


def _plan_lines(initrd: Path) -> list[str]:
    data = initrd.read_bytes()
    at = data.rindex(b"# pfcxl plan for topology")
    return data[at:].split(b"\0")[0].decode(errors="replace").splitlines()


def test_the_cli_refuses_a_tree_without_cxl_mem_before_boot(tmp_path):
    tree = install_tree(tmp_path / "mods", drop=("cxl_mem",))
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", "run", "--kernel", str(VMLINUZ),
                           "--modules", str(tree), "--run-dir", str(run_dir), "--", "true"],
                          capture_output=True, text=True)
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1 and "kernel module 'cxl_mem'" in done.stderr, done.stderr
    assert not list(run_dir.glob("*.qemu.log")) and not list(run_dir.glob("*.mem"))


def test_a_build_tree_boots_its_vmlinux_and_takes_its_modules(tmp_path):
    """A build tree: arch/x86/boot/bzImage, vmlinux (with the PVH note), modules.builtin and the
    .ko files beside their sources."""
    tree = tmp_path / "linux"
    (tree / "arch/x86/boot").mkdir(parents=True)
    (tree / "arch/x86/boot/bzImage").symlink_to(VMLINUZ)
    (tree / "vmlinux").symlink_to(kernel_pvh.uncompressed(VMLINUZ))
    shutil.copytree(MODULES / "kernel", tree, copy_function=os.symlink, dirs_exist_ok=True)
    shutil.copy(MODULES / "modules.builtin", tree / "modules.builtin")
    machine = Machine("pf-nic", kernel=tree)
    argv = machine.plan().argv
    assert argv[argv.index("-kernel") + 1] == str(tree / "vmlinux")
    assert machine.own_kernel.modules_dir == tree
    wanted = elf_deps.module_closure(elf_deps.ModuleTree(tree), plan.modules_needed(machine.topology))
    assert {m.name for m in wanted} >= {"cxl_mem", "cxl_acpi", "cxl_pci"}
    assert all(str(m.path).startswith(str(tree)) for m in wanted)


def test_a_newline_in_a_kernel_modules_or_qemu_path_keeps_the_error_on_one_line(tmp_path):
    from pfcxl.errors import VMError
    from pfcxl.host_tools.vm import qemu_binary
    odd = tmp_path / "line\nbreak"
    odd.mkdir()
    (odd / "bzImage").write_bytes(b"not a kernel")
    cases = [(lambda: own_kernel.own(odd / "absent", None), ImageError, "no such file or directory"),
             (lambda: own_kernel.own(odd, None), ImageError, "a directory but no"),
             (lambda: own_kernel.own(odd / "bzImage", None), ImageError, "needs --modules DIR"),
             (lambda: own_kernel.own(odd / "bzImage", odd / "mods"), ImageError, "no such directory"),
             (lambda: own_kernel.own(odd / "bzImage", odd), ImageError, "not a bzImage"),
             (lambda: qemu_binary.version(str(odd / "qemu")), VMError, "no such file")]
    for call, error, words in cases:
        with pytest.raises(error) as caught:
            call()
        message = str(caught.value)
        assert "\n" not in message and "line\\nbreak" in message and words in message, message
