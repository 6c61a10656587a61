"""The guest kernel as an uncompressed ELF that QEMU starts at its PVH entry (lean boots).

Debian's vmlinuz is a bzImage: SeaBIOS's linuxboot ROM loads it, then the kernel decompresses its
zstd payload under TCG, about 2 s of a cold boot here. The payload is the kernel's own vmlinux,
and Debian's kernel has CONFIG_PVH=y, so that ELF carries a PVH entry note
(XEN_ELFNOTE_PHYS32_ENTRY) and `-kernel vmlinux` boots it with no decompression. We unpack it once
with the host's `zstd` into the kernel cache, beside vmlinuz.
"""

from __future__ import annotations

import io
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.segments import NoteSegment
from elftools.common.exceptions import ELFError

from pfcxl.errors import ImageError, SetupError

from pfcxl import process
from pfcxl.cache import write_whole

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
PVH_ENTRY_NOTE = 18          # XEN_ELFNOTE_PHYS32_ENTRY, in the "Xen" note namespace


def has_pvh_entry(elf: bytes) -> bool:
    try:
        notes = [n for seg in ELFFile(io.BytesIO(elf)).iter_segments()
                 if isinstance(seg, NoteSegment) for n in seg.iter_notes()]     # PT_NOTE
    except ELFError:
        return False
    return any(n["n_name"] == "Xen" and n["n_type"] in (PVH_ENTRY_NOTE, "XEN_ELFNOTE_PHYS32_ENTRY") for n in notes)


def uncompressed(vmlinuz: Path, out: Path | None = None) -> Path:
    """vmlinuz's vmlinux (cached at `out`, default beside it): an ELF with a PVH entry, or
    ImageError saying why not."""
    out = out or vmlinuz.with_name(vmlinuz.name.replace("vmlinuz", "vmlinux", 1) + ".pvh")
    if out.exists():
        return out
    data = vmlinuz.read_bytes()
    at = data.find(ZSTD_MAGIC)
    if at < 0:
        raise ImageError(f"{vmlinuz}: no zstd payload (lean boots need a CONFIG_KERNEL_ZSTD kernel; "
                         "Machine(lean=False) boots any bzImage)")
    try:
        # zstd stops at the end of the frame and complains about the bzImage's trailer: its exit
        # status says nothing, the ELF check below decides
        elf = process.capture(["zstd", "-d", "-c", "-q"], input=data[at:]).stdout
    except FileNotFoundError as exc:
        raise SetupError("zstd is missing: run 'make setup' (package zstd; lean boots unpack the "
                         "kernel with it)") from exc
    if not has_pvh_entry(elf):
        raise ImageError(f"{vmlinuz}: its payload is not an ELF with a PVH entry note (CONFIG_PVH); "
                         "Machine(lean=False) boots it as a bzImage")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_whole(out, elf)
    return out
