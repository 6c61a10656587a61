"""Host-side mirror of the data pattern written and checked by the guest tool daxio.

This must stay bit-for-bit identical to ``word()`` and the crc32 in guest/src/daxio.c: the
8-byte word at byte offset ``o`` counted from the START OF THE DEVICE (not from daxio's
--offset) is ``0x5046000000000000 ^ (seed << 40) ^ (o >> 3)``, stored little-endian, and
checksums are zlib's CRC-32 over the bytes in address order. Standard library only.
"""

from __future__ import annotations

import sys
import zlib
from array import array

PATTERN_MAGIC = 0x5046_0000_0000_0000
SEED_LIMIT = 1 << 16  # daxio rejects seeds >= 2**16
_MASK64 = (1 << 64) - 1
_RUN = 1 << 40  # word indices below 2**40 never overlap the seed/magic bits


def _check(seed: int, offset: int, size: int) -> None:
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed {seed} is out of range (0 <= seed < {SEED_LIMIT})")
    if offset < 0 or offset % 8:
        raise ValueError(f"offset {offset} is not a non-negative multiple of 8")
    if size < 0 or size % 8:
        raise ValueError(f"size {size} is not a non-negative multiple of 8")
    if offset + size > 1 << 64:
        raise ValueError(f"range [{offset}, {offset + size}) does not fit in 64 bits")


def word(seed: int, offset: int) -> int:
    """The pattern word daxio stores at byte ``offset`` (from the device start) for ``seed``."""
    _check(seed, offset, 8)
    return (PATTERN_MAGIC ^ (seed << 40) ^ (offset >> 3)) & _MASK64


def pattern_bytes(seed: int, offset: int, size: int) -> bytes:
    """The ``size`` bytes daxio fill writes at byte ``offset`` with ``seed`` (little-endian).

    ``offset`` and ``size`` are multiples of 8, as daxio requires. About 0.5 s for 64 MiB.
    """
    _check(seed, offset, size)
    top = PATTERN_MAGIC ^ (seed << 40)  # low 40 bits are zero
    first, end = offset >> 3, (offset + size) >> 3
    words = array("Q")
    i = first
    while i < end:
        # Within one run of 2**40 word indices the high index bits are constant, so
        # top ^ index == (top ^ high) + low: an arithmetic sequence, which array() builds from
        # a range at C speed. Offsets below 8 TiB take exactly one run.
        high = i & ~(_RUN - 1)
        stop = min(end, high + _RUN)
        base = top ^ high
        run = array("Q", range(base + (i - high), base + (stop - high)))
        if i == first:
            words = run
        else:
            words.extend(run)
        i = stop
    if sys.byteorder != "little":
        words.byteswap()
    return words.tobytes()


def crc32(data: bytes | bytearray | memoryview) -> int:
    """zlib's CRC-32 of ``data`` as an unsigned int (daxio prints it as "0x%08x")."""
    return zlib.crc32(data) & 0xFFFFFFFF
