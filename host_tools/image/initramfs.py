"""The guest image: a busybox-static initramfs with the CXL kernel modules, pfcxl's static C
tools, trixie's cxl/daxctl (ndctl 81) with their libraries and loader, and the init script.

The image is a pure function of its inputs. Its name is the hash of the archive's contents, so
an unchanged input reuses the cached file and any changed input (a module, a library, a tool's
source, the init script, the topology's plan) builds a new one.
"""

from __future__ import annotations

import hashlib
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from pfcxl.device.topology import Topology
from pfcxl.errors import ImageError
from pfcxl.guest import plan

from pfcxl import cache
from pfcxl.host_tools.image import DEFAULT_IMAGE, IMAGE_KINDS, cpio
from pfcxl.host_tools.image import debian as debian_image
from pfcxl.host_tools.image import debian_packages
from pfcxl.compile import compile_cached
from pfcxl.process import run

if TYPE_CHECKING:
    from pfcxl.host_tools.image.elf_deps import Module
    from pfcxl.host_tools.image.own_kernel import Kernel

GUEST_DIR = Path(__file__).resolve().parents[2] / "guest"
GUEST_SOURCES = GUEST_DIR / "src"
GUEST_INIT = GUEST_DIR / "init"
BUSYBOX = Path("/bin/busybox")
# ndctl: namespaces on pmem regions (ndctl create-namespace)
USERSPACE_PROGRAMS = ("usr/bin/cxl", "usr/bin/daxctl", "usr/bin/ndctl")
# Merged /usr, as in Debian: the top-level names are links into usr/.
MERGED_USR = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
EMPTY_DIRS = ("proc", "sys", "dev", "tmp", "run", "root", "mnt", "etc/pfcxl")
CFLAGS = ("-static", "-O2", "-Wall", "-Wextra", "-Werror")


@dataclass(frozen=True)
class BootImage:
    kernel: Path
    initrd: Path
    kernel_release: str
    rebuilt: bool
    kernel_origin: str = ""
    pvh: Path | None = None        # a lean boot's ELF, when known (own kernels); else unpacked from kernel


def _usr(path: str) -> str:
    """'lib64/ld-linux-x86-64.so.2' -> 'usr/lib64/ld-linux-x86-64.so.2' (merged /usr)."""
    head, _, rest = path.lstrip("/").partition("/")
    return f"{MERGED_USR[head]}/{rest}" if head in MERGED_USR and rest else path.lstrip("/")


def _manifest() -> dict:
    m = cache.read_manifest()
    needed = ("kernel_release", "vmlinuz", "modules_dir", "guest_root")
    if not all(k in m for k in needed):
        raise ImageError(f"setup has not run (no complete {cache.manifest_path()}): run 'make setup'")
    for key in ("vmlinuz", "modules_dir", "guest_root"):
        if not Path(m[key]).exists():
            raise ImageError(f"{m[key]} from {cache.manifest_path()} is missing: run 'make setup' again")
    return m


def tool_inputs(src: Path) -> list[Path]:
    """What a guest tool's binary depends on: its source and the shared guest/include headers."""
    return [src, *sorted((GUEST_DIR / "include").glob("*.h"))]


def build_tool(name: str, out_dir: Path) -> Path:
    """guest/src/<name>.c as a static binary, cached by the hash of its inputs and flags."""
    src = GUEST_SOURCES / f"{name}.c"
    return compile_cached(src, tool_inputs(src), CFLAGS, out_dir, name)


def build_tools(out_dir: Path) -> dict[str, Path]:
    """Every guest/src/*.c as a static binary (build_tool)."""
    return {src.stem: build_tool(src.stem, out_dir) for src in sorted(GUEST_SOURCES.glob("*.c"))}


def _busybox_entries() -> list[cpio.Entry]:
    from pfcxl.host_tools.image import elf_deps     # pyelftools, only when an image is built
    if not BUSYBOX.exists():
        raise ImageError(f"{BUSYBOX} is missing: run 'make setup' (package busybox-static)")
    if elf_deps.interpreter(BUSYBOX) is not None:
        # The image has no host libc: a dynamic busybox would not start as init.
        raise ImageError(f"{BUSYBOX} is dynamically linked: install busybox-static ('make setup')")
    applets = run([str(BUSYBOX), "--list-full"], what="listing busybox's applets", error=ImageError)
    entries = [cpio.Entry.file("usr/bin/busybox", BUSYBOX.read_bytes(), 0o755)]
    for applet in sorted(set(applets.split())):
        if PurePosixPath(applet).name in ("busybox", "linuxrc"):
            continue   # the binary itself, and an initrd-era init name we do not use
        entries.append(cpio.Entry.symlink(_usr(applet), "/usr/bin/busybox"))
    return entries


def base_entries(manifest: dict, modules: list[Module], kernel: Kernel | None = None) -> list[cpio.Entry]:
    """Everything but the topology's plan."""
    from pfcxl.host_tools.image import elf_deps
    release = kernel.release if kernel else manifest["kernel_release"]
    files: dict[str, cpio.Entry] = {}

    def add(entry: cpio.Entry) -> None:
        files[entry.path] = entry   # later entries win: real files replace busybox applet links

    for e in _busybox_entries():
        add(e)
    root = Path(manifest["guest_root"])
    for needed in elf_deps.library_closure(root, list(USERSPACE_PROGRAMS)):
        add(cpio.Entry.file(_usr(needed.image_path), needed.source.read_bytes(), 0o755))
    for name, binary in build_tools(cache.images_dir() / "tools").items():
        add(cpio.Entry.file(f"usr/bin/{name}", binary.read_bytes(), 0o755))
    for script in sorted(GUEST_INIT.iterdir()):
        target = "init" if script.name == "init" else f"usr/bin/{script.name}"
        add(cpio.Entry.file(target, script.read_bytes(), 0o755))
    for module in modules:
        add(cpio.Entry.file(f"usr/lib/modules/{module.name}.ko", module.elf, 0o644))
    add(cpio.Entry.file("etc/pfcxl/kernel-release", (release + "\n").encode()))
    if kernel is not None:     # init puts it in PFCXL-READY's JSON: no quote or backslash may reach it
        origin = kernel.origin.replace("\\", "/").replace('"', "'")
        add(cpio.Entry.file("etc/pfcxl/kernel-origin", (origin + "\n").encode()))
    return _with_directories(list(files.values()))


def _with_directories(entries: list[cpio.Entry]) -> list[cpio.Entry]:
    """Add every parent directory and the merged-/usr links, parents first."""
    dirs = set(EMPTY_DIRS) | set(MERGED_USR.values())
    for e in entries:
        dirs.update(str(p) for p in PurePosixPath(e.path).parents if str(p) != ".")
    out = [cpio.Entry.directory(d) for d in sorted(dirs)]
    out += [cpio.Entry.symlink(link, target) for link, target in MERGED_USR.items()]
    return out + sorted(entries, key=lambda e: e.path)


def _debian_rootfs(say, packages: tuple[str, ...] = ()) -> tuple[bytes, set[str]]:
    """The Debian rootfs, with `packages` (--packages) laid over it, as a gzipped archive (cached
    by the tarballs it is made of) and the set of paths it holds."""
    tar = debian_image.rootfs_tar(say)
    tars = [tar] + ([debian_packages.layer(packages, tar, say)] if packages else [])
    cached = cache.images_dir() / f"rootfs-{'+'.join(t.stem for t in tars)}.cpio.gz"
    listing = cached.with_suffix(".paths")          # what it holds, so the tar is read only once
    if not (cached.exists() and listing.exists()):
        say(f"packing the Debian rootfs ({sum(t.stat().st_size for t in tars) >> 20} MiB)")
        entries = [e for t in tars for e in debian_image.rootfs_entries(t)]
        cached.parent.mkdir(parents=True, exist_ok=True)
        for path, data in ((cached, cpio.gzipped(cpio.archive(entries))),
                           (listing, "\n".join(e.path for e in entries).encode())):
            cache.write_whole(path, data)
    return cached.read_bytes(), set(listing.read_text().splitlines())


def acpi_override_archive(tables: dict[str, bytes]) -> bytes:
    """The kernel's initrd ACPI table upgrade: an uncompressed cpio, first in the initrd, holding
    kernel/firmware/acpi/<signature>.dat (file size equal to the table's length)."""
    entries = [cpio.Entry.directory(d) for d in ("kernel", "kernel/firmware", "kernel/firmware/acpi")]
    entries += [cpio.Entry.file(f"kernel/firmware/acpi/{sig}.dat", data) for sig, data in sorted(tables.items())]
    return cpio.archive(entries)


def build(topo: Topology, progress=None, acpi_tables: dict[str, bytes] | None = None,
          kind: str = DEFAULT_IMAGE, kernel: Kernel | None = None, packages: tuple[str, ...] = ()) -> BootImage:
    """The kernel and initrd to boot `topo`, from the cache when nothing changed.

    `acpi_tables` (signature -> bytes) replace QEMU's tables through the initrd table upgrade.
    kind "debian" lays pfcxl's files over a Debian rootfs with python3 (host_tools/image/debian.py).
    `kernel`: the user's (own_kernel.own); default setup's Debian kernel. `packages`: more Debian
    packages in the "debian" image (host_tools/image/debian_packages.py).
    """
    try:
        return _build(topo, progress, acpi_tables, kind, kernel, packages)
    except OSError as exc:   # typically a read-only or full PFCXL_CACHE
        raise ImageError(f"building the guest image: {exc.filename or cache.images_dir()}: {exc.strerror} "
                         f"(the image cache is {cache.images_dir()}: PFCXL_CACHE must be writable)") from exc


def _build(topo: Topology, progress, acpi_tables: dict[str, bytes] | None, kind: str,
           kernel: Kernel | None, packages: tuple[str, ...]) -> BootImage:
    if kind not in IMAGE_KINDS:
        raise ImageError(f"image kind '{kind}' must be one of {', '.join(IMAGE_KINDS)}")
    if packages and kind != "debian":
        raise ImageError(f"--packages {','.join(packages)} needs the Debian image (--image debian)")
    from pfcxl.host_tools.image import elf_deps
    from pfcxl.host_tools.image import own_kernel
    manifest = _manifest()
    kernel = kernel or own_kernel.setup_kernel(manifest)
    say = progress or (lambda message: None)
    say("collecting guest image inputs")
    tree = elf_deps.ModuleTree(kernel.modules_dir)
    modules = elf_deps.module_closure(tree, plan.modules_needed(topo))
    entries = base_entries(manifest, modules, kernel)
    rootfs = b""
    if kind == "debian":
        rootfs, present = _debian_rootfs(say, packages)
        # keep Debian's own programs; busybox fills in only what the rootfs lacks (cttyhack, insmod)
        entries = [e for e in entries if not (stat.S_ISLNK(e.mode) and e.data == b"/usr/bin/busybox"
                                              and e.path in present)]
        entries += debian_image.python_module_entries()
    plan_text = plan.render(topo, [m.name for m in modules])
    plan_entry = cpio.Entry.file("etc/pfcxl/plan", plan_text.encode())
    body = cpio.archive(entries + [plan_entry])
    prefix = acpi_override_archive(acpi_tables) if acpi_tables else b""
    digest = hashlib.sha256(prefix + hashlib.sha256(rootfs).digest() + body).hexdigest()[:20]
    images = cache.images_dir()
    images.mkdir(parents=True, exist_ok=True)
    # Uncompressed: the guest's gunzip of these ~20 MiB under TCG cost ~0.25 s of kernel time on a
    # quiet machine (gzip against plain, one run of 4 boots each), a copy costs little. The Debian
    # rootfs before it stays gzipped: the kernel reads both.
    initrd = images / f"initrd-{digest}.cpio"
    rebuilt = not initrd.exists()
    if rebuilt:
        say(f"writing guest image ({len(body) >> 20} MiB)")
        head = prefix + rootfs
        # Linux takes an uncompressed archive after a compressed one only at a 4-byte aligned
        # offset, and skips zeros up to it ("invalid magic at start of compressed archive" else).
        cache.write_whole(initrd, head + bytes(-len(head) % 4) + body)
    return BootImage(kernel.vmlinuz, initrd, kernel.release, rebuilt, kernel.origin, kernel.pvh)

