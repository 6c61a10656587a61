"""Dependency walks over ELF files for the guest image, read with pyelftools.

* Kernel modules: each module's `.modinfo` section holds `depends=a,b`; the closure of the
  modules a topology needs, in load order (dependencies first).
* Programs: PT_INTERP and DT_NEEDED entries, resolved inside a foreign root (trixie's
  userspace unpacked in the cache), never against the host's libraries.
"""

from __future__ import annotations

import io
import lzma
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.segments import InterpSegment

from pfcxl import process
from pfcxl.errors import ImageError


# --------------------------------------------------------------------------- kernel modules


def module_name(path: Path) -> str:
    """'drivers/cxl/cxl_acpi.ko.xz' -> 'cxl_acpi' (the kernel treats '-' and '_' alike)."""
    name = path.name
    for suffix in (".xz", ".zst", ".gz", ".ko"):
        name = name.removesuffix(suffix)
    return name.replace("-", "_")


def module_bytes(path: Path) -> bytes:
    """A module file's ELF bytes, decompressed when it ends in .xz."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        import gzip
        return gzip.decompress(data)
    if path.suffix == ".zst":     # CONFIG_MODULE_COMPRESS_ZSTD; zstd is a host package (make setup)
        done = process.capture(["zstd", "-d", "-c", "-q"], input=data)
        if done.returncode != 0:
            raise ImageError(f"module {path} is not valid zstd: {done.stderr.decode(errors='replace').strip()}")
        return done.stdout
    if path.suffix == ".xz":
        try:
            return lzma.decompress(data)
        except lzma.LZMAError as exc:
            raise ImageError(f"module {path} is not valid xz: {exc}") from exc
    return data


# Linux appends a module's signature as: signature, struct module_signature (12 bytes, the
# signature's length big-endian in its last 4), then this marker (scripts/sign-file, module_signature.h).
SIGNATURE_MARKER = b"~Module signature appended~\n"
SIGNATURE_INFO_BYTES = 12


def unsigned_module(data: bytes, origin: str = "<module>") -> bytes:
    """The module without its appended signature (unchanged when it has none). Under TCG the
    guest kernel's SHA-512 and RSA check of each signed module is a noticeable share of the boot;
    an unsigned module loads all the same where signatures are not enforced (Debian's default)."""
    if not data.endswith(SIGNATURE_MARKER):
        return data
    info_end = len(data) - len(SIGNATURE_MARKER)
    sig_len = int.from_bytes(data[info_end - 4:info_end], "big")
    elf_end = info_end - SIGNATURE_INFO_BYTES - sig_len
    if elf_end <= 0:
        raise ImageError(f"{origin}: its signature trailer claims {sig_len} bytes, more than the module holds")
    if data[:4] != b"\x7fELF":
        raise ImageError(f"{origin}: has a module signature trailer but is not an ELF file")
    return data[:elf_end]


def modinfo(elf_bytes: bytes, origin: str = "<module>") -> dict[str, list[str]]:
    """The key=value pairs of a module's .modinfo section (keys may repeat, e.g. alias)."""
    try:
        section = ELFFile(io.BytesIO(elf_bytes)).get_section_by_name(".modinfo")
    except ELFError as exc:
        raise ImageError(f"{origin} is not an ELF kernel module: {exc}") from exc
    if section is None:
        raise ImageError(f"{origin} has no .modinfo section")
    info: dict[str, list[str]] = {}
    for record in section.data().split(b"\0"):
        if b"=" in record:
            key, _, value = record.decode(errors="replace").partition("=")
            info.setdefault(key, []).append(value)
    return info


def module_depends(info: dict[str, list[str]]) -> list[str]:
    return [d.replace("-", "_") for v in info.get("depends", []) for d in v.split(",") if d]


@dataclass(frozen=True)
class ModuleTree:
    """The modules of one kernel release: lib/modules/<release>/."""

    root: Path

    def index(self) -> dict[str, Path]:
        # an installed tree keeps modules under kernel/; a build tree has them beside their sources
        base = self.root / "kernel" if (self.root / "kernel").is_dir() else self.root
        return {module_name(p): p for p in base.rglob("*.ko*") if p.name.endswith((".ko", ".ko.xz", ".ko.zst", ".ko.gz"))}

    def builtin(self) -> set[str]:
        listing = self.root / "modules.builtin"
        if not listing.exists():
            return set()
        return {module_name(Path(line.strip())) for line in listing.read_text().splitlines() if line.strip()}


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    elf: bytes


def module_closure(tree: ModuleTree, wanted: list[str]) -> list[Module]:
    """`wanted` and everything they depend on, dependencies first; built-in ones are skipped."""
    index, builtin = tree.index(), tree.builtin()
    order: list[Module] = []
    state: dict[str, str] = {}   # name -> "visiting" | "done"

    def visit(name: str, needed_by: str | None) -> None:
        name = name.replace("-", "_")
        if state.get(name) == "done" or name in builtin:
            return
        if state.get(name) == "visiting":
            raise ImageError(f"kernel modules depend on each other in a cycle through '{name}'")
        if name not in index:
            who = f" (needed by {needed_by})" if needed_by else ""
            raise ImageError(f"kernel module '{name}'{who} is neither in {tree.root} nor built in")
        state[name] = "visiting"
        elf = unsigned_module(module_bytes(index[name]), str(index[name]))
        for dep in module_depends(modinfo(elf, str(index[name]))):
            visit(dep, name)
        state[name] = "done"
        order.append(Module(name, index[name], elf))

    for name in wanted:
        visit(name, None)
    return order


# --------------------------------------------------------------------------- shared libraries

LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu", "usr/lib64", "lib64", "usr/lib", "lib")


@dataclass(frozen=True)
class Needed:
    """A file a program needs: where the image must hold it, and the real file in the root."""

    image_path: str      # e.g. 'usr/lib/x86_64-linux-gnu/libcxl.so.1'
    source: Path


def resolve_in_root(root: Path, path: str) -> Path | None:
    """Follow symlinks the way the guest would, with `root` as '/'. None when missing."""
    current = PurePosixPath("/") / path
    for _ in range(40):
        parts = current.parts[1:]
        resolved = PurePosixPath("/")
        for i, part in enumerate(parts):
            candidate = resolved / part
            real = root / str(candidate).lstrip("/")
            if real.is_symlink():
                target = os.readlink(real)
                rest = PurePosixPath(*parts[i + 1:]) if i + 1 < len(parts) else PurePosixPath()
                base = PurePosixPath("/") if target.startswith("/") else resolved
                current = PurePosixPath(os.path.normpath(base / target / rest))
                break
            resolved = candidate
        else:
            real = root / str(resolved).lstrip("/")
            return real if real.exists() else None
    raise ImageError(f"too many symlinks resolving {path} in {root}")


def _dynamic_info(path: Path) -> tuple[str | None, list[str], list[str]]:
    """(interpreter, DT_NEEDED sonames, RUNPATH/RPATH dirs) of one ELF file."""
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            interp = None
            for seg in elf.iter_segments():
                if isinstance(seg, InterpSegment):          # PT_INTERP
                    interp = seg.get_interp_name()
            needed, runpath = [], []
            for section in elf.iter_sections():
                if isinstance(section, DynamicSection):
                    for tag in section.iter_tags():
                        if tag.entry.d_tag == "DT_NEEDED":
                            # pyelftools sets a string tag's value as an attribute named after it (setattr)
                            needed.append(tag.needed)  # type: ignore[attr-defined]
                        elif tag.entry.d_tag in ("DT_RUNPATH", "DT_RPATH"):
                            value = tag.runpath if tag.entry.d_tag == "DT_RUNPATH" else tag.rpath  # type: ignore[attr-defined]
                            runpath.extend(value.split(":"))
            return interp, needed, runpath
    except (ELFError, OSError) as exc:
        raise ImageError(f"cannot read ELF file {path}: {exc}") from exc


def interpreter(path: Path) -> str | None:
    """The program interpreter (dynamic loader) an ELF file asks for; None when static."""
    return _dynamic_info(path)[0]


def library_closure(root: Path, programs: list[str]) -> list[Needed]:
    """Programs (paths inside `root`) plus their loader and every library they need, transitively."""
    found: dict[str, Needed] = {}
    missing: list[str] = []
    queue: list[tuple[str, str]] = []   # (image path, who asked)
    for prog in programs:
        queue.append((prog.lstrip("/"), "the image"))
    while queue:
        image_path, asker = queue.pop()
        if image_path in found:
            continue
        source = resolve_in_root(root, image_path)
        if source is None:
            missing.append(f"{image_path} (needed by {asker})")
            continue
        found[image_path] = Needed(image_path, source)
        interp, needed, runpath = _dynamic_info(source)
        if interp:
            queue.append((interp.lstrip("/"), image_path))
        origin = str(PurePosixPath(image_path).parent)
        dirs = [d.replace("$ORIGIN", "/" + origin).lstrip("/") for d in runpath] + list(LIBRARY_DIRS)
        for soname in needed:
            hit = next((f"{d}/{soname}" for d in dirs if resolve_in_root(root, f"{d}/{soname}")), None)
            if hit is None:
                missing.append(f"{soname} (needed by {image_path})")
            elif not any(n.source == resolve_in_root(root, hit) for n in found.values()):
                queue.append((hit, image_path))
    if missing:
        raise ImageError(f"missing in {root}: " + ", ".join(sorted(set(missing)))
                         + " (run 'make setup' to fetch the guest userspace)")
    return sorted(found.values(), key=lambda n: n.image_path)
