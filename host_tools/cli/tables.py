"""`pfcxl tables decode FILE...`: each file decoded on its own, within the size any table can have."""

from __future__ import annotations

import re

from rich.markup import escape

from pfcxl.device.topology.units import human
from pfcxl.errors import PfcxlError
from pfcxl.firmware_tables import acpi as tables_acpi
from pfcxl.firmware_tables import cdat as tables_cdat
from pfcxl.firmware_tables import cedt as tables_cedt
from pfcxl.firmware_tables.layout import MAX_TABLE_BYTES

from pfcxl.host_tools.ui import err, out

# An ACPI signature: four upper-case letters, digits or '_' (CEDT, DBG2, TPM2, ...).
_ACPI_SIGNATURE = re.compile(rb"[A-Z0-9_]{4}")


def decode_files(files: list[str], kind: str | None) -> int:
    """Decode each file in turn; a file that cannot be decoded is reported and the next one read."""
    if not files:
        raise PfcxlError("pfcxl tables decode: give one or more CEDT or CDAT files")
    bad = 0
    for name in files:
        try:
            data = _table_bytes(name, kind)
        except PfcxlError as exc:
            err.print(f"[red]pfcxl: error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
            bad += 1
            continue
        module = tables_cedt if (kind or ("cedt" if data[:4] == b"CEDT" else "cdat")) == "cedt" else tables_cdat
        out.print(f"== {name}", markup=False, highlight=False)
        out.print(module.dump_table(data), markup=False, highlight=False)
        bad += len(module.decode_table(data).violations) > 0
    return 1 if bad else 0


def _table_bytes(name: str, kind: str | None) -> bytes:
    """A table file's bytes, read up to the size cap; refused if it cannot be what was asked for."""
    try:
        with open(name, "rb") as f:
            data = f.read(MAX_TABLE_BYTES + 1)
    except OSError as exc:
        raise PfcxlError(f"cannot read {name}: {exc.strerror}") from exc
    if len(data) > MAX_TABLE_BYTES:
        raise PfcxlError(f"{name}: larger than {human(MAX_TABLE_BYTES)}, the most a CEDT or CDAT can "
                         "hold; not decoded")
    if kind is None and len(data) < tables_cdat.HEADER.size:
        raise PfcxlError(f"{name}: {len(data)} byte{'s' if len(data) != 1 else ''} is too short for a CEDT "
                         f"({tables_acpi.HEADER.size}-byte header) or a CDAT ({tables_cdat.HEADER.size}-byte "
                         "header)")
    if kind is None and data[:4] != b"CEDT" and _ACPI_SIGNATURE.fullmatch(data[:4]):
        raise PfcxlError(f"{name}: an ACPI '{data[:4].decode()}' table, not a CEDT (use --as cdat to "
                         "read it as a CDAT anyway)")
    return data
