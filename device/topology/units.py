"""Sizes as people write them in topology files and as QEMU and Linux print them."""

from __future__ import annotations

import re

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

_SUFFIX = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": TiB}
_SIZE_RE = re.compile(r"\s*(0x[0-9a-fA-F_]+|[0-9_]+)\s*([KMGT]?)(?:i?B)?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'256M', '8KiB', '4G', '0x1000' or '4096' -> bytes (binary units). Raises ValueError."""
    m = _SIZE_RE.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r} is not a size (use e.g. 4096, 8K, 256M, 4G)")
    number, suffix = m.groups()
    value = int(number.replace("_", ""), 16 if number.lower().startswith("0x") else 10)
    return value * _SUFFIX[suffix.upper()]


def format_size(value: int) -> str:
    """Bytes -> the shortest exact binary form: 268435456 -> '256M', 8192 -> '8K'."""
    for suffix in ("T", "G", "M", "K"):
        unit = _SUFFIX[suffix]
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def human(value: int) -> str:
    """Bytes -> '256 MiB' for tables and messages."""
    for suffix, unit in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if value >= unit and value % unit == 0:
            return f"{value // unit} {suffix}"
    return f"{value} B"


def amount(value: float) -> str:
    """Measured bytes -> '987 KiB', '1.41 GiB': three significant figures in the largest unit
    that is at most the value, so a column of amounts reads in one way (human() is exact)."""
    for suffix, unit in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if value >= unit:
            scaled = value / unit
            return f"{scaled:.{max(0, 2 - len(str(int(scaled))) + 1)}f} {suffix}"
    return f"{value:.0f} B"


def hexaddr(value: int) -> str:
    """Addresses the way the CXL docs write them: 0x3_9000_0000."""
    digits = f"{value:x}"
    groups = []
    while digits:
        groups.append(digits[-4:])
        digits = digits[:-4]
    return "0x" + "_".join(reversed(groups))
