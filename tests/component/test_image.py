"""The guest image: cached by content, rebuilt when an input changes, and holding what init needs."""

import shutil
import stat
from pathlib import Path

import pytest

from pfcxl.device import topology
from pfcxl.guest import plan
from pfcxl import cache
from pfcxl.host_tools.image import cpio
from pfcxl.host_tools.image import elf_deps
from pfcxl.host_tools.image import initramfs as image

pytestmark = pytest.mark.component


def load(name: str) -> topology.Topology:
    return topology.load(topology.resolve(name))


def entries_of(initrd: Path) -> dict[str, cpio.Entry]:
    entries = cpio.read(initrd.read_bytes())      # uncompressed: no gunzip in the guest's boot
    names = [e.path for e in entries]
    assert len(names) == len(set(names)), "an entry is in the archive twice"
    return {e.path: e for e in entries}


def closure_names(topo: topology.Topology) -> list[str]:
    tree = elf_deps.ModuleTree(Path(cache.read_manifest()["modules_dir"]))
    return [m.name for m in elf_deps.module_closure(tree, plan.modules_needed(topo))]


@pytest.fixture(scope="module")
def pf_nic():
    topo = load("pf-nic")
    first = image.build(topo)
    second = image.build(topo)
    return topo, first, second


@pytest.fixture(scope="module")
def pf_nic_entries(pf_nic):
    return entries_of(pf_nic[2].initrd)


def is_file(e: cpio.Entry) -> bool:
    return stat.S_ISREG(e.mode)


def is_link(e: cpio.Entry, target: str) -> bool:
    return stat.S_ISLNK(e.mode) and e.data.decode() == target


def resolve_in_archive(entries: dict[str, cpio.Entry], path: str) -> str:
    """Follow the archive's own symlinks the way the guest would; returns the final entry name."""
    parts = [p for p in path.split("/") if p]
    for _ in range(40):
        for i in range(1, len(parts) + 1):
            e = entries.get("/".join(parts[:i]))
            if e is not None and stat.S_ISLNK(e.mode):
                target = e.data.decode()
                base = [] if target.startswith("/") else parts[:i - 1]
                parts = base + [p for p in target.split("/") if p] + parts[i:]
                break
        else:
            return "/".join(parts)
    raise AssertionError(f"symlink loop at {path}")


def test_same_topology_reuses_the_image(pf_nic):
    topo, first, second = pf_nic
    assert second.initrd == first.initrd and second.initrd.exists()
    assert second.rebuilt is False
    assert second.initrd.parent == cache.images_dir()
    manifest = cache.read_manifest()
    assert second.kernel == Path(manifest["vmlinuz"]) and second.kernel_release == manifest["kernel_release"]


def test_different_plan_gives_different_image(pf_nic):
    two = image.build(load("two-hb-interleave"))
    assert two.initrd != pf_nic[1].initrd
    plans = [entries_of(i)["etc/pfcxl/plan"].data for i in (pf_nic[1].initrd, two.initrd)]
    assert plans[0] != plans[1]


def test_init_and_tools(pf_nic_entries):
    e = pf_nic_entries
    assert is_file(e["init"]) and stat.S_IMODE(e["init"].mode) & 0o111 == 0o111
    assert e["init"].data == (image.GUEST_INIT / "init").read_bytes()
    assert e["usr/bin/pfcxl-discover"].data == (image.GUEST_INIT / "pfcxl-discover").read_bytes()
    for name in ("usr/bin/busybox", "usr/bin/cxl", "usr/bin/daxctl", "usr/bin/daxio", "usr/bin/pfcxl-discover"):
        assert is_file(e[name]), name
        assert stat.S_IMODE(e[name].mode) & 0o111, f"{name} is not executable"
    assert e["usr/bin/busybox"].data == image.BUSYBOX.read_bytes()
    for name in ("usr/bin/busybox", "usr/bin/cxl", "usr/bin/daxctl", "usr/bin/daxio"):
        assert e[name].data[:4] == b"\x7fELF", name
    assert is_link(e["usr/bin/sh"], "/usr/bin/busybox")
    assert e["etc/pfcxl/kernel-release"].data == (cache.read_manifest()["kernel_release"] + "\n").encode()


def test_loader_and_libraries_are_where_the_programs_look(pf_nic_entries):
    e = pf_nic_entries
    root = Path(cache.read_manifest()["guest_root"])
    interp = elf_deps.interpreter(root / "usr/bin/daxctl")
    # /lib64 is a link to usr/lib64 in the image; the loader must be a real file behind it
    loader = resolve_in_archive(e, interp)
    assert loader != interp.lstrip("/") and is_file(e[loader]), interp
    assert e[loader].data[:4] == b"\x7fELF"
    assert resolve_in_archive(e, "/bin/sh") == "usr/bin/busybox"
    libs = {Path(p).name for p, x in e.items() if p.startswith("usr/lib/x86_64-linux-gnu/") and is_file(x)}
    assert {"libcxl.so.1", "libdaxctl.so.1", "libc.so.6"} <= libs


def test_merged_usr_links(pf_nic_entries):
    e = pf_nic_entries
    for link, target in {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin"}.items():
        assert is_link(e[link], target), link
        assert stat.S_ISDIR(e[target].mode), target
    # nothing is stored under a link: everything goes through usr/
    assert not [p for p in e if p.split("/")[0] in ("bin", "lib", "lib64", "sbin") and "/" in p]


def test_modules_are_the_closure_uncompressed(pf_nic, pf_nic_entries):
    topo = pf_nic[0]
    names = closure_names(topo)
    kos = {p for p in pf_nic_entries if p.startswith("usr/lib/modules/")}
    assert kos == {f"usr/lib/modules/{n}.ko" for n in names}
    for n in names:
        elf = pf_nic_entries[f"usr/lib/modules/{n}.ko"].data
        assert elf[:4] == b"\x7fELF", n
        assert elf_deps.modinfo(elf)["name"] == [n]


def test_plan_is_rendered_with_the_closure_order(pf_nic, pf_nic_entries):
    topo = pf_nic[0]
    assert pf_nic_entries["etc/pfcxl/plan"].data == plan.render(topo, closure_names(topo)).encode()


def test_parents_come_before_children(pf_nic_entries):
    seen_dirs: set[str] = set()
    for path, e in pf_nic_entries.items():   # dict keeps archive order
        parent = str(Path(path).parent)
        assert parent == "." or parent in seen_dirs, f"{path} comes before its directory {parent}"
        if stat.S_ISDIR(e.mode):
            seen_dirs.add(path)
    for d in image.EMPTY_DIRS:
        assert stat.S_ISDIR(pf_nic_entries[d].mode), d


@pytest.fixture
def changed_init(tmp_path, monkeypatch):
    """guest/init copied with one byte changed; the image built from it is removed afterwards."""
    copy = tmp_path / "init"
    shutil.copytree(image.GUEST_INIT, copy)
    script = bytearray((copy / "init").read_bytes())
    at = script.index(b"pfcxl guest init")
    script[at] = ord("P")
    (copy / "init").write_bytes(bytes(script))
    monkeypatch.setattr(image, "GUEST_INIT", copy)
    built: list[Path] = []
    yield copy, built
    for path in built:
        path.unlink(missing_ok=True)


def test_changed_input_builds_a_new_image(pf_nic, changed_init):
    copy, built = changed_init
    topo, original, _ = pf_nic
    changed = image.build(topo)
    built.append(changed.initrd)
    assert changed.initrd != original.initrd and changed.initrd.exists()
    assert original.initrd.exists()
    assert entries_of(changed.initrd)["init"].data == (copy / "init").read_bytes()
    # the name is a function of the contents: removing it and building again gives the same name
    changed.initrd.unlink()
    again = image.build(topo)
    assert again.initrd == changed.initrd and again.rebuilt is True
    assert image.build(topo).rebuilt is False


def test_the_image_is_an_uncompressed_newc_archive(pf_nic):
    # the guest's kernel copies it instead of gunzipping ~20 MiB under TCG
    initrd = pf_nic[2].initrd
    assert initrd.suffix == ".cpio"
    assert initrd.read_bytes()[:6] == b"070701"


def test_the_pfcxl_archive_after_a_gzipped_rootfs_starts_4_byte_aligned(tmp_path, monkeypatch):
    # Linux reads an uncompressed archive after a compressed one only at a 4-byte aligned offset
    # (else: "Initramfs unpacking failed: invalid magic at start of compressed archive").
    real_manifest, real_tools = cache.manifest_path(), cache.images_dir() / "tools"
    monkeypatch.setenv("PFCXL_CACHE", str(tmp_path))
    shutil.copy(real_manifest, cache.manifest_path())
    shutil.copytree(real_tools, cache.images_dir() / "tools")
    rootfs = cpio.gzipped(cpio.archive([cpio.Entry.file("etc/os-release", b"ID=debian\n", 0o644)]) + b"x")
    rootfs += b"\0" if len(rootfs) % 4 == 0 else b""            # make it end off a 4-byte boundary
    monkeypatch.setattr(image, "_debian_rootfs", lambda say, packages=(): (rootfs, set()))
    data = image.build(load("pf-nic"), kind="debian").initrd.read_bytes()
    start = len(rootfs) + (-len(rootfs) % 4)
    assert data[:len(rootfs)] == rootfs and data[len(rootfs):start] == bytes(start - len(rootfs))
    assert data[start:start + 6] == b"070701"
