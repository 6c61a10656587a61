"""`pfcxl tables decode FILE...`: each file decoded on its own, within the size any table can have."""

from __future__ import annotations

import re
from pathlib import Path

from rich.markup import escape

from pfcxl.device.topology.units import human
from pfcxl.errors import PfcxlError, TableError
from pfcxl.firmware_tables import acpi as tables_acpi
from pfcxl.firmware_tables import cdat as tables_cdat
from pfcxl.firmware_tables import cedt as tables_cedt
from pfcxl.firmware_tables.layout import MAX_TABLE_BYTES

from pfcxl.host_tools.ui import err, out
from pfcxl.text_files import read_bytes

# An ACPI signature: four upper-case letters, digits or '_' (CEDT, DBG2, TPM2, ...).
_ACPI_SIGNATURE = re.compile(rb"[A-Z0-9_]{4}")


def decode_files(files: list[str], kind: str | None) -> int:
    """Decode each file in turn; a file that cannot be decoded is reported and the next one read.
    The status: TableError's when a file is not a table at all, else 1 when one has violations."""
    if not files:
        raise PfcxlError("pfcxl tables decode: give one or more CEDT or CDAT files")
    bad = unreadable = 0
    for name in files:
        try:
            data = _table_bytes(name, kind)
        except TableError as exc:
            err.print(f"[red]pfcxl: error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
            unreadable += 1
            continue
        module = tables_cedt if (kind or ("cedt" if data[:4] == b"CEDT" else "cdat")) == "cedt" else tables_cdat
        out.print(f"== {name}", markup=False, highlight=False)
        out.print(module.dump_table(data), markup=False, highlight=False)
        bad += len(module.decode_table(data).violations) > 0
    return TableError.exit_code if unreadable else 1 if bad else 0


def _table_bytes(name: str, kind: str | None) -> bytes:
    """A table file's bytes, read up to the size cap; TableError if it cannot be what was asked for
    (without --as: a CEDT by its signature, or a CDAT whose Length field a CDAT can have)."""
    data = read_bytes(Path(name), TableError, limit=MAX_TABLE_BYTES)   # no more than any table can hold
    if kind is None and len(data) < tables_cdat.HEADER.size:
        raise TableError(f"{name}: {len(data)} byte{'s' if len(data) != 1 else ''} is too short for a CEDT "
                         f"({tables_acpi.HEADER.size}-byte header) or a CDAT ({tables_cdat.HEADER.size}-byte "
                         "header)")
    if kind is None and data[:4] != b"CEDT" and _ACPI_SIGNATURE.fullmatch(data[:4]):
        raise TableError(f"{name}: an ACPI '{data[:4].decode()}' table, not a CEDT (use --as cdat to "
                         "read it as a CDAT anyway)")
    length = int.from_bytes(data[:4], "little")       # a CDAT's first field: its Length
    if kind is None and data[:4] != b"CEDT" and not tables_cdat.HEADER.size <= length <= MAX_TABLE_BYTES:
        raise TableError(f"{name}: not a CEDT or a CDAT: it does not start with 'CEDT', and read as a CDAT its "
                         f"Length field would be {length} bytes, which no CDAT has (from {tables_cdat.HEADER.size} "
                         f"to {human(MAX_TABLE_BYTES)}); --as cdat decodes it anyway")
    return data
