"""pfcxl's guest-side Python: map /dev/daxN.M and probe it (the Debian guest image has it).

    import pfcxl_guest
    with pfcxl_guest.Dax("/dev/dax0.0") as dax:
        words = dax.words()              # memoryview of 8-byte words over the device
        print(pfcxl_guest.latency(dax, span=8 << 20))
        print(pfcxl_guest.bandwidth(dax, size=8 << 20, op="read"))

or from the shell: python3 -m pfcxl_guest latency --dax /dev/dax0.0 --span 8M

Device-DAX needs MAP_SHARED and offsets/lengths aligned to the region's align (2 MiB). Every
access goes through an 8-byte memoryview item, one load or store per word. Timings are the
guest's wall clock: under QEMU TCG that is emulator time, not fabric latency.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import stat
import sys
import time

LINE = 64


def _sysfs_value(path: str, attribute: str) -> int | None:
    """A device-DAX attribute (size, align) from sysfs: the kernel's word, not a copy of it."""
    name = os.path.basename(path)
    for candidate in (f"/sys/bus/dax/devices/{name}/{attribute}", f"/sys/class/dax/{name}/{attribute}"):
        try:
            with open(candidate) as f:
                return int(f.read().strip(), 0)
        except (OSError, ValueError):
            continue
    return None


class Dax:
    """A device-DAX (or regular file) mapped MAP_SHARED, from offset 0, its length a multiple of
    the device's mapping alignment (sysfs `align`, 2 MiB for CXL regions; a page for a file)."""

    def __init__(self, path: str, length: int | None = None) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR)
        st = os.fstat(self.fd)
        device = stat.S_ISCHR(st.st_mode)
        size = _sysfs_value(path, "size") if device else st.st_size   # devices: sysfs knows
        align = (_sysfs_value(path, "align") if device else None) or mmap.PAGESIZE
        if size is None:
            os.close(self.fd)
            raise OSError(f"cannot find the size of {path} in sysfs")
        self.size = min(size, length) if length else size
        self.size -= self.size % align if self.size >= align else 0
        self.map = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def words(self) -> memoryview:
        return memoryview(self.map).cast("Q")

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)

    def __enter__(self) -> "Dax":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def latency(dax: Dax, span: int = 8 << 20, laps: int = 1, seed: int = 1) -> dict:
    """Dependent pointer chase over `span` bytes, one 64-byte line per hop, random cyclic order."""
    lines = min(span, dax.size) // LINE
    order = list(range(lines))
    random.Random(seed).shuffle(order)
    words = dax.words()
    step = LINE // 8
    for i in range(lines):                      # each line points to the next in the cycle
        words[order[i] * step] = order[(i + 1) % lines] * step
    index, visited = order[0] * step, 0
    start = time.monotonic_ns()
    for _ in range(laps * lines):
        index = words[index]
        visited += 1
    elapsed = time.monotonic_ns() - start
    return {"probe": "latency", "dax": dax.path, "span": lines * LINE, "lines": lines, "laps": laps,
            "loads": visited, "ns_per_load": elapsed / visited,
            "clock": "guest CLOCK_MONOTONIC (under TCG: emulator time, not fabric latency)"}


def bandwidth(dax: Dax, size: int = 8 << 20, op: str = "read") -> dict:
    """Sequential 8-byte loads or stores over `size` bytes."""
    words = dax.words()
    count = min(size, dax.size) // 8
    start = time.monotonic_ns()
    if op == "read":
        total = 0
        for i in range(count):
            total ^= words[i]
    elif op == "write":
        for i in range(count):
            words[i] = i
    else:
        raise ValueError(f"op must be read or write, not {op!r}")
    elapsed = time.monotonic_ns() - start
    return {"probe": "bandwidth", "dax": dax.path, "op": op, "bytes": count * 8, "seconds": elapsed / 1e9,
            "MBps": count * 8 / 1e6 / (elapsed / 1e9) if elapsed else None,
            "clock": "guest CLOCK_MONOTONIC (under TCG: emulator time, not fabric throughput)"}


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text, 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m pfcxl_guest", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="probe", required=True)
    p = sub.add_parser("latency", help="dependent pointer chase")
    p.add_argument("--dax", default="/dev/dax0.0")
    p.add_argument("--span", type=_size, default=8 << 20)
    p.add_argument("--laps", type=int, default=1)
    p = sub.add_parser("bandwidth", help="sequential loads or stores")
    p.add_argument("--dax", default="/dev/dax0.0")
    p.add_argument("--size", type=_size, default=8 << 20)
    p.add_argument("--op", choices=("read", "write"), default="read")
    args = ap.parse_args(argv)
    try:
        with Dax(args.dax) as dax:
            result = (latency(dax, args.span, args.laps) if args.probe == "latency"
                      else bandwidth(dax, args.size, args.op))
    except OSError as exc:
        print(f"pfcxl_guest: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
