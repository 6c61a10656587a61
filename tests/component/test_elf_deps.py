"""Module and shared-library dependency walks, on the real cache setup unpacked and on small
synthetic trees (for the failure paths)."""

import lzma
import os
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from pfcxl.errors import ImageError
from pfcxl.guest import plan
from pfcxl import cache
from pfcxl.host_tools.image import elf_deps

PROGRAMS = ["usr/bin/cxl", "usr/bin/daxctl"]

pytestmark = pytest.mark.component


@pytest.fixture(scope="module")
def manifest() -> dict:
    m = cache.read_manifest()
    assert {"modules_dir", "guest_root"} <= set(m), f"setup has not run: {cache.manifest_path()}"
    return m


@pytest.fixture(scope="module")
def tree(manifest) -> elf_deps.ModuleTree:
    return elf_deps.ModuleTree(Path(manifest["modules_dir"]))


@pytest.fixture(scope="module")
def guest_root(manifest) -> Path:
    return Path(manifest["guest_root"])


def own_depends(module: elf_deps.Module) -> list[str]:
    return elf_deps.module_depends(elf_deps.modinfo(module.elf, str(module.path)))


def assert_dependencies_first(modules: list[elf_deps.Module], builtin: set[str]) -> None:
    position = {m.name: i for i, m in enumerate(modules)}
    assert len(position) == len(modules), "a module is listed twice"
    for m in modules:
        for dep in own_depends(m):
            if dep in builtin:
                assert dep not in position
                continue
            assert dep in position, f"{m.name} depends on {dep}, which is missing"
            assert position[dep] < position[m.name], f"{dep} comes after {m.name}, which needs it"


# --------------------------------------------------------------------------- kernel modules (real cache)


def test_module_name():
    assert elf_deps.module_name(Path("drivers/cxl/cxl_acpi.ko.xz")) == "cxl_acpi"
    assert elf_deps.module_name(Path("kernel/net/nf-nat.ko")) == "nf_nat"
    assert elf_deps.module_name(Path("x/dax_cxl.ko.zst")) == "dax_cxl"


@pytest.mark.parametrize("name", ["cxl_mem", "cxl_acpi"])
def test_modinfo_of_real_modules(tree, name):
    path = tree.index()[name]
    elf = elf_deps.module_bytes(path)
    assert elf[:4] == b"\x7fELF"
    info = elf_deps.modinfo(elf, str(path))
    assert info["name"] == [name]
    assert "depends" in info and len(info["depends"]) == 1
    assert isinstance(elf_deps.module_depends(info), list)
    assert info["license"], "every kernel module has a license= entry"


def test_modinfo_errors(tmp_path, guest_root):
    with pytest.raises(ImageError, match="not-elf.ko is not an ELF kernel module"):
        elf_deps.modinfo(b"definitely not ELF" * 8, "not-elf.ko")
    program = guest_root / "usr/bin/daxctl"
    with pytest.raises(ImageError, match="has no .modinfo section"):
        elf_deps.modinfo(program.read_bytes(), str(program))
    broken = tmp_path / "broken.ko.xz"
    broken.write_bytes(b"\xfd7zXZ\0garbage")
    with pytest.raises(ImageError, match="broken.ko.xz is not valid xz"):
        elf_deps.module_bytes(broken)


def test_closure_of_dax_cxl(tree):
    builtin = tree.builtin()
    modules = elf_deps.module_closure(tree, ["dax_cxl"])
    names = [m.name for m in modules]
    assert names[-1] == "dax_cxl"
    assert not set(names) & builtin
    assert all(m.elf[:4] == b"\x7fELF" and m.path == tree.index()[m.name] for m in modules)
    assert_dependencies_first(modules, builtin)


def test_closure_orders_real_dependencies(tree):
    # cxl_pmem needs libnvdimm (a module in this kernel): the order check is not vacuous.
    builtin = tree.builtin()
    modules = elf_deps.module_closure(tree, list(plan.CXL_MODULES) + [plan.KMEM_MODULE, "cxl_pmem"])
    assert any(own_depends(m) for m in modules), "no module with dependencies: ordering untested"
    assert_dependencies_first(modules, builtin)


def test_closure_skips_builtin_modules(tree):
    builtin = tree.builtin()
    assert builtin, "modules.builtin is empty"
    wanted = list(plan.CXL_MODULES) + [plan.KMEM_MODULE]
    names = [m.name for m in elf_deps.module_closure(tree, wanted)]
    assert not set(names) & builtin
    # every wanted module is either loaded or built in, and the built-in ones are really built in
    for name in wanted:
        assert (name in names) != (name in builtin), name
    assert [n for n in wanted if n in builtin], "no built-in CXL module: skipping untested"
    assert elf_deps.module_closure(tree, sorted(builtin)[:5]) == []


def test_unknown_module_is_named(tree):
    with pytest.raises(ImageError, match="kernel module 'no_such_mod_xyz' is neither in"):
        elf_deps.module_closure(tree, ["dax_cxl", "no-such-mod-xyz"])


# --------------------------------------------------------------------------- kernel modules (synthetic)


def make_module(path: Path, name: str, depends: str) -> None:
    """A relocatable ELF with a .modinfo section, as real .ko files have."""
    source = (f'__attribute__((section(".modinfo"), used)) static const char a[] = "name={name}";\n'
              f'__attribute__((section(".modinfo"), used)) static const char b[] = "depends={depends}";\n')
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-c", "-x", "c", "-", "-o", str(path)], input=source.encode(), check=True)


@pytest.fixture
def fake_tree(tmp_path) -> elf_deps.ModuleTree:
    root = tmp_path / "lib/modules/9.9.9"
    mods = root / "kernel"
    # top -> mid, core_bi (built in); mid -> leaf-a, leaf_b; leaf_b -> leaf_a; loop1 <-> loop2; orphan -> ghost
    make_module(mods / "top.ko", "top", "mid,core_bi")
    make_module(mods / "a/mid.ko", "mid", "leaf-a,leaf_b")
    make_module(mods / "a/b/leaf_a.ko", "leaf_a", "")
    make_module(mods / "leaf_b.ko", "leaf_b", "leaf_a")
    make_module(mods / "loop1.ko", "loop1", "loop2")
    make_module(mods / "loop2.ko", "loop2", "loop1")
    make_module(mods / "orphan.ko", "orphan", "ghost")
    xz = mods / "packed.ko.xz"
    make_module(mods / "packed.tmp", "packed", "leaf_b")
    xz.write_bytes(lzma.compress((mods / "packed.tmp").read_bytes(), format=lzma.FORMAT_XZ))
    (mods / "packed.tmp").unlink()
    (root / "modules.builtin").write_text("kernel/core/core_bi.ko\n\n")
    return elf_deps.ModuleTree(root)


def test_fake_tree_builtin_listing(fake_tree):
    assert fake_tree.builtin() == {"core_bi"}
    assert set(fake_tree.index()) == {"top", "mid", "leaf_a", "leaf_b", "loop1", "loop2", "orphan", "packed"}


def test_fake_tree_order_and_builtin(fake_tree):
    names = [m.name for m in elf_deps.module_closure(fake_tree, ["top", "packed"])]
    assert names == ["leaf_a", "leaf_b", "mid", "top", "packed"]
    assert_dependencies_first(elf_deps.module_closure(fake_tree, ["packed", "top"]), {"core_bi"})


def test_fake_tree_builtin_module_is_not_loaded_even_if_a_file_exists(fake_tree):
    # 'mid' has a .ko file but modules.builtin lists it: it and its own dependencies are skipped.
    (fake_tree.root / "modules.builtin").write_text("kernel/core/core_bi.ko\nkernel/drivers/mid.ko\n")
    assert [m.name for m in elf_deps.module_closure(fake_tree, ["top"])] == ["top"]


def test_fake_tree_cycle_and_missing_dependency(fake_tree):
    with pytest.raises(ImageError, match="cycle through 'loop1'"):
        elf_deps.module_closure(fake_tree, ["loop1"])
    with pytest.raises(ImageError, match=r"kernel module 'ghost' \(needed by orphan\)"):
        elf_deps.module_closure(fake_tree, ["orphan"])


# --------------------------------------------------------------------------- shared libraries


def dt_needed(path: Path) -> list[str]:
    with open(path, "rb") as f:
        return [t.needed for s in ELFFile(f).iter_sections() if isinstance(s, DynamicSection)
                for t in s.iter_tags() if t.entry.d_tag == "DT_NEEDED"]


def test_library_closure_of_cxl_and_daxctl(guest_root):
    closure = elf_deps.library_closure(guest_root, PROGRAMS)
    image_paths = [n.image_path for n in closure]
    assert image_paths == sorted(image_paths) and len(set(image_paths)) == len(image_paths)
    assert set(PROGRAMS) <= set(image_paths)
    for prog in PROGRAMS:
        interp = elf_deps.interpreter(guest_root / prog)
        assert interp and interp.startswith("/")
        assert interp.lstrip("/") in image_paths
    names = {PurePosixPath(p).name for p in image_paths}
    assert {"libcxl.so.1", "libdaxctl.so.1", "libc.so.6"} <= names
    # every DT_NEEDED of every file in the closure is in it, by soname
    for n in closure:
        missing = set(dt_needed(n.source)) - names
        assert not missing, f"{n.image_path} needs {missing}"


def test_library_sources_are_inside_the_root(guest_root):
    root = guest_root.resolve()
    for n in elf_deps.library_closure(guest_root, PROGRAMS):
        assert n.source.is_file() and not n.source.is_symlink(), n
        assert n.source.resolve().is_relative_to(root), f"{n.source} is outside {root}"
        assert n.source == elf_deps.resolve_in_root(guest_root, n.image_path)


def test_missing_library_is_named(tmp_path, guest_root):
    (tmp_path / "usr/bin").mkdir(parents=True)
    shutil.copy2(guest_root / "usr/bin/daxctl", tmp_path / "usr/bin/daxctl")
    with pytest.raises(ImageError) as info:
        elf_deps.library_closure(tmp_path, ["usr/bin/daxctl"])
    message = str(info.value)
    assert str(tmp_path) in message
    for soname in dt_needed(guest_root / "usr/bin/daxctl"):
        assert f"{soname} (needed by usr/bin/daxctl)" in message
    interp = elf_deps.interpreter(guest_root / "usr/bin/daxctl").lstrip("/")
    assert f"{interp} (needed by usr/bin/daxctl)" in message


def test_missing_program_is_named(tmp_path):
    with pytest.raises(ImageError, match=r"usr/bin/nothing \(needed by the image\)"):
        elf_deps.library_closure(tmp_path, ["/usr/bin/nothing"])


def test_interpreter_of_static_binary_is_none(tmp_path):
    static = tmp_path / "static"
    src = tmp_path / "s.c"
    src.write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-static", "-o", str(static), str(src)], check=True)
    assert elf_deps.interpreter(static) is None
    with pytest.raises(ImageError, match="cannot read ELF file"):
        elf_deps.interpreter(src)


# --------------------------------------------------------------------------- resolve_in_root


@pytest.fixture
def fake_root(tmp_path) -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("guest passwd\n")
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (root / "usr/lib/x86_64-linux-gnu/libfoo.so.1.2.3").write_text("foo")
    os.symlink("libfoo.so.1.2.3", root / "usr/lib/x86_64-linux-gnu/libfoo.so.1")
    os.symlink("usr/lib", root / "lib")
    os.symlink("/etc/passwd", root / "abs-passwd")
    os.symlink("../../etc/passwd", root / "usr/lib/rel-passwd")
    os.symlink("../../../../../../../../etc/passwd", root / "usr/lib/escape-passwd")
    os.symlink(str(Path(__file__).resolve()), root / "host-only")   # exists on the host, not in root
    os.symlink("/lib/x86_64-linux-gnu", root / "usr/lib64")  # absolute link through a relative one
    os.symlink("loop-b", root / "loop-a")
    os.symlink("loop-a", root / "loop-b")
    return root


@pytest.mark.parametrize("path,expected", [
    ("abs-passwd", "etc/passwd"),
    ("/abs-passwd", "etc/passwd"),
    ("usr/lib/rel-passwd", "etc/passwd"),
    ("lib/rel-passwd", "etc/passwd"),
    ("usr/lib/escape-passwd", "etc/passwd"),
    ("lib/x86_64-linux-gnu/libfoo.so.1", "usr/lib/x86_64-linux-gnu/libfoo.so.1.2.3"),
    ("usr/lib64/libfoo.so.1", "usr/lib/x86_64-linux-gnu/libfoo.so.1.2.3"),
    ("etc/passwd", "etc/passwd"),
])
def test_resolve_in_root_stays_in_root(fake_root, path, expected):
    resolved = elf_deps.resolve_in_root(fake_root, path)
    assert resolved == fake_root / expected
    assert resolved.read_text() == (fake_root / expected).read_text()


def test_resolve_in_root_never_uses_the_host(fake_root):
    assert Path("/etc/passwd").exists()
    (fake_root / "etc/passwd").unlink()
    assert elf_deps.resolve_in_root(fake_root, "abs-passwd") is None
    assert elf_deps.resolve_in_root(fake_root, "host-only") is None
    assert elf_deps.resolve_in_root(fake_root, "usr/lib/nothing.so") is None


def test_resolve_in_root_symlink_loop(fake_root):
    with pytest.raises(ImageError, match="too many symlinks resolving loop-a"):
        elf_deps.resolve_in_root(fake_root, "loop-a")


def test_real_modules_are_signed_and_the_image_gets_them_unsigned(tree):
    """Debian signs its modules; the closure (what the image carries) has each one's ELF alone:
    the same sections, the marker and signature gone, the very bytes up to the signature."""
    for module in elf_deps.module_closure(tree, ["cxl_acpi", "dax_cxl"]):
        signed = elf_deps.module_bytes(module.path)
        assert signed.endswith(elf_deps.SIGNATURE_MARKER), module.path
        assert len(module.elf) < len(signed) and signed.startswith(module.elf)
        assert elf_deps.SIGNATURE_MARKER not in module.elf
        assert elf_deps.modinfo(module.elf) == elf_deps.modinfo(signed)   # still a whole ELF


def test_unsigned_module_cuts_exactly_the_trailer():
    elf = b"\x7fELF" + bytes(range(200))
    signature = b"S" * 77
    info = bytes(8) + len(signature).to_bytes(4, "big")
    assert elf_deps.unsigned_module(elf + signature + info + elf_deps.SIGNATURE_MARKER) == elf
    assert elf_deps.unsigned_module(elf) == elf                       # none: unchanged
    lying = bytes(8) + (10**6).to_bytes(4, "big")
    with pytest.raises(ImageError, match="claims 1000000 bytes"):
        elf_deps.unsigned_module(elf + lying + elf_deps.SIGNATURE_MARKER, "m.ko")
