"""zlib's CRC-32 carried over a run of zero bytes without reading them: a pool is mostly holes
(never-written pages), and reading 5 GiB of zeros only to checksum them took seconds per request.

Over zero bytes the CRC register (the complement of zlib's value) changes linearly over GF(2):
each zero byte multiplies it by the same 32 x 32 bit matrix. So n zero bytes are the matrix for
one 4 KiB page raised to n / 4096, applied by repeated squaring, plus zlib itself on any tail.
"""

from __future__ import annotations

import zlib

PAGE = 4096
MASK = 0xFFFF_FFFF


def _apply(columns: tuple[int, ...], reg: int) -> int:
    """The matrix (its 32 columns, column i the image of bit i) times the register."""
    out, i = 0, 0
    while reg:
        if reg & 1:
            out ^= columns[i]
        reg >>= 1
        i += 1
    return out


def _square(columns: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(_apply(columns, c) for c in columns)


def _page_matrix() -> tuple[int, ...]:
    zeros = bytes(PAGE)
    # register r -> the register after a page of zeros, read off zlib: crc32 works on ~r
    return tuple(~zlib.crc32(zeros, ~(1 << i) & MASK) & MASK for i in range(32))


_POWERS: list[tuple[int, ...]] = []     # _POWERS[k]: 2**k pages of zeros


def _power(k: int) -> tuple[int, ...]:
    if not _POWERS:
        _POWERS.append(_page_matrix())
    while len(_POWERS) <= k:
        _POWERS.append(_square(_POWERS[-1]))
    return _POWERS[k]


def crc32_zeros(length: int, crc: int = 0) -> int:
    """zlib.crc32(bytes(length), crc), in time logarithmic in length."""
    if length < 0:
        raise ValueError(f"a run of {length} bytes")
    pages, tail = divmod(length, PAGE)
    reg, k = ~crc & MASK, 0
    while pages:
        if pages & 1:
            reg = _apply(_power(k), reg)
        pages >>= 1
        k += 1
    return zlib.crc32(bytes(tail), ~reg & MASK)
