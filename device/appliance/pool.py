"""The appliance's pooled memory: partitions, their backing, and which module serves each byte.

Pool offsets: the shared region is [0, shared); private slot s is [shared + s*private, ...).
Pool offsets rotate over the memory modules at the appliance's granularity, through the one
interleave decoder (address_map.interleave, pool offset 0 as its base).

Each partition is its own memfd (gone with the service) or file (on tmpfs for `shm`, on disk for
`directory`; both outlive the service), so handing a host the shared region and its private region
gives it no way to reach another host's private memory.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import uuid
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path

from pfcxl.errors import ApplianceError

from pfcxl.device.appliance import fs_room
from pfcxl.device.topology.address_map import interleave
from pfcxl.device.appliance.crc_zeros import crc32_zeros
from pfcxl.device.topology.model import ApplianceSpec
from pfcxl.device.topology.units import human

LAYOUT_FILE = "layout.json"
POOL_ID_FILE = "pool-id"


@dataclass
class Partition:
    name: str            # "shared" or "private/<slot>"
    pool_offset: int
    size: int
    fd: int


def where(appliance: ApplianceSpec, offset: int) -> dict:
    """Which module serves pool `offset`, at which module offset, in which region."""
    mapped = appliance.shared + appliance.ports * appliance.private
    if offset < 0:
        raise ApplianceError(f"pool offset {offset} is negative: offsets run from 0 to {mapped - 1:#x}")
    if offset >= mapped:
        raise ApplianceError(f"pool offset {offset:#x} is outside the pool's {mapped:#x} mapped bytes")
    module, module_offset = interleave(offset, appliance.granularity, appliance.modules)
    if offset < appliance.shared:
        region, region_offset = "shared", offset
    else:
        slot, region_offset = divmod(offset - appliance.shared, appliance.private)
        region = f"private/{slot}"
    return {"offset": offset, "module": module, "module_offset": module_offset,
            "region": region, "region_offset": region_offset}


def bytes_per_module(appliance: ApplianceSpec, start: int, size: int) -> list[int]:
    """How many bytes of [start, start+size) each module serves (exact, by granule counting)."""
    g, m = appliance.granularity, appliance.modules
    out = [0] * m
    first, last = start // g, (start + size - 1) // g
    if size <= 0:
        return out
    # whole rotations over all modules, then the partial granules at both ends
    full = (last - first + 1) // m
    for k in range(m):
        out[k] = full * g
    def module(granule: int) -> int:
        return interleave(granule * g, g, m)[0]
    for granule in range(first + full * m, last + 1):
        out[module(granule)] += g
    out[module(first)] -= start - first * g
    out[module(last)] -= (last + 1) * g - (start + size)
    return out


class Pool:
    """Owns the partitions' file descriptors. A context manager: closing it never loses data
    kept in files (`directory` given: they stay), and frees the memory of memfds.

    `pool_id` names the memory itself: kept with the files, new for every set of memfds, so two
    incarnations of a service can tell whether they handed out the same memory."""

    def __init__(self, appliance: ApplianceSpec, directory: Path | None, elsewhere: Path | None = None) -> None:
        """`elsewhere`: where backing "directory" would keep the pool, offered when `directory`
        has no room for it (an shm pool on a small /dev/shm)."""
        self.appliance = appliance
        self.directory, self.elsewhere = directory, elsewhere
        self.partitions: list[Partition] = []
        self.pool_id = ""
        self._open()
        g = appliance.granularity
        self._last_crc = array("I", [0]) * (self.mapped_bytes // g)
        self._zero_crc = zlib.crc32(bytes(g))
        self.changed = [0] * appliance.modules

    @property
    def mapped_bytes(self) -> int:
        return self.appliance.shared + self.appliance.ports * self.appliance.private

    def _layout_record(self) -> dict:
        a = self.appliance
        return {"shared": a.shared, "private": a.private, "ports": a.ports, "modules": a.modules,
                "module_capacity": a.module_capacity, "granularity": a.granularity}

    def _open(self) -> None:
        a = self.appliance
        names = [("shared", 0, a.shared)]
        if a.private:
            names += [(f"private/{s}", a.shared + s * a.private, a.private) for s in range(a.ports)]
        if self.directory is not None:
            self._check_room(names)              # first: a refused pool leaves no directory behind
            self._check_directory()
        try:
            for name, offset, size in names:
                self.partitions.append(Partition(name, offset, size, self._open_one(name, size)))
        except BaseException:
            self.close()
            raise
        if self.directory is None:
            self.pool_id = uuid.uuid4().hex[:12]
            return
        (self.directory / LAYOUT_FILE).write_text(json.dumps(self._layout_record(), indent=1) + "\n")
        id_file = self.directory / POOL_ID_FILE
        if not id_file.exists():
            id_file.write_text(uuid.uuid4().hex[:12] + "\n")
        self.pool_id = id_file.read_text().strip()

    def _check_directory(self) -> None:
        """Persistent files are reused only if they were made for this very layout."""
        assert self.directory is not None
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        record = self.directory / LAYOUT_FILE
        if record.exists():
            try:
                old = json.loads(record.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ApplianceError(f"{record} is unreadable ({exc}); the pool files next to it are in "
                                     "an unknown state: move the directory away") from exc
            if old != self._layout_record():
                diff = ", ".join(f"{k} {old.get(k)} -> {v}" for k, v in self._layout_record().items()
                                 if old.get(k) != v)
                raise ApplianceError(f"pool files in {self.directory} were made for another layout ({diff}); "
                                     "refusing to reuse them: move them away or choose another --run-dir")
        elif any(self.directory.glob("*.pool")):
            raise ApplianceError(f"{self.directory} holds pool files but no {LAYOUT_FILE}: left by an "
                                 "unknown run; refusing to reuse them")

    def _check_room(self, names: list[tuple[str, int, int]]) -> None:
        """Room for every page the pool may still need (its files are sparse: a page written
        where the file system has none is a SIGBUS in whoever wrote it)."""
        assert self.directory is not None
        needed = 0
        for name, _, size in names:
            try:
                needed += max(size - os.stat(self._path(name)).st_blocks * 512, 0)
            except FileNotFoundError:
                needed += size
        fs_room.check_room(self.directory, needed, f"the pool of {human(self.mapped_bytes)}", self.elsewhere)

    def _path(self, name: str) -> Path:
        assert self.directory is not None
        return self.directory / f"{name.replace('/', '-')}.pool"

    def _open_one(self, name: str, size: int) -> int:
        if self.directory is None:
            fd = os.memfd_create(f"pfcxl-{name.replace('/', '-')}", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
            return fd
        path = self._path(name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        have = os.fstat(fd).st_size
        if have not in (0, size):
            os.close(fd)
            raise ApplianceError(f"{path} has {have} bytes, the layout needs {size}: refusing to resize it")
        if have == 0:
            os.ftruncate(fd, size)
        return fd

    def partition(self, name: str) -> Partition:
        return next(p for p in self.partitions if p.name == name)

    def close(self) -> None:
        for p in self.partitions:
            try:
                os.close(p.fd)
            except OSError:
                pass
        self.partitions = []

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def checksums(self) -> dict[str, str]:
        """crc32 of every partition and of the whole pool, in pool order."""
        # Read with preadv, not through a mapping: a read fault on a never-written page of a
        # memfd allocates that page, so checksumming through mmap filled the whole pool with
        # zero pages (GiBs of RAM for pf-appliance), and every later scan then read all of it.
        # Only the data extents are read; a hole's zeros are carried over arithmetically
        # (crc_zeros), which took an empty pf-appliance's checksum from ~4.5 s to well under one.
        out, total = {}, 0
        buffer = memoryview(bytearray(4 << 20))
        for p in self.partitions:
            crc, pos = 0, 0
            for start, end in [*_data_extents(p.fd, p.size), (p.size, p.size)]:
                crc, total = crc32_zeros(start - pos, crc), crc32_zeros(start - pos, total)
                for off in range(start, end, len(buffer)):
                    chunk = buffer[:min(len(buffer), end - off)]
                    got = 0
                    while got < len(chunk):
                        n = os.preadv(p.fd, [chunk[got:]], off + got)
                        if n == 0:
                            raise ApplianceError(f"partition {p.name} ends at {off + got:#x}, "
                                                 f"short of its {p.size:#x} bytes")
                        got += n
                    crc = zlib.crc32(chunk, crc)
                    total = zlib.crc32(chunk, total)
                pos = end
            out[p.name] = f"{crc:#010x}"
        out["pool"] = f"{total:#010x}"
        return out

    def scan(self) -> None:
        """Count, per module, the granules whose contents changed since the last scan. Only the
        data extents of each partition are read (holes are zero), so idle pools cost little."""
        g, m = self.appliance.granularity, self.appliance.modules
        for p in self.partitions:
            with mmap.mmap(p.fd, p.size, mmap.MAP_SHARED, mmap.PROT_READ) as view:
                for start, end in _data_extents(p.fd, p.size):
                    for off in range(start - start % g, end, g):
                        crc = zlib.crc32(view[off:off + g])
                        index = (p.pool_offset + off) // g
                        before = self._last_crc[index] or self._zero_crc
                        if crc != before:
                            self.changed[interleave(index * g, g, m)[0]] += g
                            self._last_crc[index] = crc


def _data_extents(fd: int, size: int):
    """(start, end) ranges of a file that hold data (SEEK_DATA / SEEK_HOLE)."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:    # ENXIO: no data after pos; anything else would be read as zeros
            if exc.errno == errno.ENXIO:
                return
            raise ApplianceError(f"cannot find the data in a pool partition: {exc}") from exc
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, min(end, size)
        pos = end
