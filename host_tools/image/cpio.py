"""Writing initramfs archives in the "newc" cpio format the kernel unpacks.

We write the archive ourselves (rather than staging a tree for cpio(1)) so that it is
byte-for-byte reproducible: fixed mtimes and inode numbers, entries in the order given.
"""

from __future__ import annotations

import gzip
import io
import stat
from dataclasses import dataclass
from typing import BinaryIO, Iterable

_MAGIC = b"070701"
_TRAILER = "TRAILER!!!"


@dataclass(frozen=True)
class Entry:
    """One archive member. `path` is relative to the root, without a leading slash."""

    path: str
    mode: int              # full st_mode: S_IFREG | 0o755, S_IFDIR | 0o755, S_IFLNK | 0o777
    data: bytes = b""      # file contents, or the link target for a symlink

    @staticmethod
    def file(path: str, data: bytes, perm: int = 0o644) -> "Entry":
        return Entry(path, stat.S_IFREG | perm, data)

    @staticmethod
    def directory(path: str, perm: int = 0o755) -> "Entry":
        return Entry(path, stat.S_IFDIR | perm)

    @staticmethod
    def symlink(path: str, target: str) -> "Entry":
        return Entry(path, stat.S_IFLNK | 0o777, target.encode())


def _pad(n: int) -> bytes:
    return b"\0" * (-n % 4)


def _header(ino: int, entry_mode: int, nlink: int, filesize: int, name: bytes) -> bytes:
    # newc fields: ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor rdevminor namesize check
    fields = [ino, entry_mode, 0, 0, nlink, 0, filesize, 0, 0, 0, 0, len(name) + 1, 0]
    head = _MAGIC + b"".join(b"%08X" % f for f in fields)
    return head + name + b"\0" + _pad(len(head) + len(name) + 1)


def write(out: BinaryIO, entries: Iterable[Entry]) -> None:
    """Write entries and the trailer. Parent directories must come before their contents.

    No device nodes: the kernel's built-in initramfs already has /dev/console, and init
    mounts devtmpfs for the rest.
    """
    ino = 1
    for e in entries:
        name = e.path.strip("/").encode()
        nlink = 2 if stat.S_ISDIR(e.mode) else 1
        out.write(_header(ino, e.mode, nlink, len(e.data), name))
        out.write(e.data + _pad(len(e.data)))
        ino += 1
    out.write(_header(0, 0, 1, 0, _TRAILER.encode()))


def archive(entries: Iterable[Entry]) -> bytes:
    buf = io.BytesIO()
    write(buf, entries)
    return buf.getvalue()


def gzipped(data: bytes) -> bytes:
    """gzip with mtime 0, so the same inputs give the same image."""
    return gzip.compress(data, compresslevel=6, mtime=0)


def read(data: bytes) -> list[Entry]:
    """Parse a newc archive (used by tests and `pfcxl image list`)."""
    entries, pos = [], 0
    while True:
        if data[pos:pos + 6] != _MAGIC:
            raise ValueError(f"not a newc cpio header at offset {pos}")
        f = [int(data[pos + 6 + 8 * i: pos + 14 + 8 * i], 16) for i in range(13)]
        mode, filesize, namesize = f[1], f[6], f[11]
        name_start = pos + 110
        name = data[name_start:name_start + namesize - 1].decode()
        pos = name_start + namesize
        pos += -pos % 4
        body = data[pos:pos + filesize]
        pos += filesize
        pos += -pos % 4
        if name == _TRAILER:
            return entries
        entries.append(Entry(name, mode, body))
