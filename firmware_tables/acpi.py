"""The ACPI table header and checksum, shared by every ACPI table we build or read."""

from __future__ import annotations

from pfcxl.firmware_tables.layout import Field, Layout, decode, encode

HEADER = Layout("header", "ACPI Table Header", (
    Field("signature", "Signature", 0, 4, "ascii"),
    Field("length", "Table Length", 4, 4, derived=True),
    Field("revision", "Revision", 8, 1),
    Field("checksum", "Checksum", 9, 1, derived=True),
    Field("oem_id", "OEM ID", 10, 6, "ascii"),
    Field("oem_table_id", "OEM Table ID", 16, 8, "ascii"),
    Field("oem_revision", "OEM Revision", 24, 4),
    Field("creator_id", "Creator ID", 28, 4, "ascii"),
    Field("creator_revision", "Creator Revision", 32, 4),
), size=36)

# What QEMU puts in its own tables (x-oem-id / x-oem-table-id change the first two). A table that
# replaces QEMU's through the initrd upgrade must carry the same IDs and a higher OEM revision.
QEMU_IDS = {"oem_id": "BOCHS ", "oem_table_id": "BXPC    ", "oem_revision": 1,
            "creator_id": "BXPC", "creator_revision": 1}


def checksum_byte(data: bytes) -> int:
    """The byte that makes the sum of the whole table 0 mod 256 (with the checksum byte at 0)."""
    return (-sum(data)) & 0xFF


def finish(header: dict, body: bytes) -> bytes:
    """Header + body with length and checksum filled in."""
    raw = bytearray(encode(HEADER, {**header, "length": HEADER.size + len(body), "checksum": 0}) + body)
    raw[9] = checksum_byte(bytes(raw))
    return bytes(raw)


def check_header(data: bytes, signature: str) -> tuple[dict, list[str]]:
    """Decode the header and report length, checksum and signature problems."""
    d = decode(HEADER, data, where=f"{signature} header")
    problems = list(d.violations)
    h = d.values
    if not h:
        return h, problems
    if h["signature"] != signature:
        problems.append(f"{signature} header: signature is '{h['signature']}', expected '{signature}'")
    if h["length"] != len(data):
        problems.append(f"{signature} header: Table Length {h['length']} but the data has {len(data)} bytes")
    if sum(data) & 0xFF:
        expected = checksum_byte(data[:9] + b"\0" + data[10:])
        problems.append(f"{signature} header: checksum {h['checksum']:#04x} is wrong (should be {expected:#04x})")
    return h, problems
