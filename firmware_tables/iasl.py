"""ACPICA's iasl as an independent judge of the tables we write.

iasl -d prints one line per field, "[hex-offset decimal-offset byte-length] Label : Value".
We compare by offset and width, so no name mapping between iasl's labels and ours is needed:
every field our decoder reads must appear in iasl's output at the same place with the same value.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pfcxl.errors import TableError
from pfcxl import cache, process

from pfcxl.firmware_tables import acpi, cdat, cedt
from pfcxl.firmware_tables.layout import decode, flat_fields

_LINE = re.compile(r"\[([0-9A-F]+)h (\d+) ([0-9A-F]+)h\]\s+(.*?) : (.*)")
_PROBLEM = re.compile(r"\b(Error|Warning|Invalid|terminates in the middle|Unknown)\b", re.IGNORECASE)


@dataclass(frozen=True)
class IaslField:
    offset: int
    width: int
    label: str
    text: str           # as printed: 0000000C, "BOCHS ", 01 [CXL Host Bridge Structure]

    def number(self) -> int | None:
        m = re.match(r"^([0-9A-F]+)\b", self.text)
        return int(m.group(1), 16) if m else None

    def string(self) -> str | None:
        m = re.match(r'^"(.*)"', self.text)
        return m.group(1) if m else None


def command() -> list[str]:
    """iasl from trixie, through trixie's loader (see provision/acpica.py)."""
    root = Path(cache.read_manifest().get("acpica_root", cache.acpica_dir()))
    iasl = root / "usr/bin/iasl"
    if not iasl.exists():
        raise TableError(f"iasl is not in {root}: run 'make setup'")
    return [str(root / "usr/lib64/ld-linux-x86-64.so.2"), "--library-path",
            str(root / "usr/lib/x86_64-linux-gnu"), str(iasl)]


def disassemble(data: bytes, kind: str) -> tuple[list[IaslField], list[str]]:
    """iasl's fields and the problems it reported (messages and suspicious lines)."""
    with tempfile.TemporaryDirectory(prefix="pfcxl-iasl-") as tmp:
        src = Path(tmp) / f"table.{kind}"
        src.write_bytes(data)
        argv = command() + (["-ds", "CDAT"] if kind == "cdat" else []) + ["-d", str(src)]
        done = process.capture(argv, cwd=tmp, text=True)
        problems = [line.strip() for line in (done.stdout + done.stderr).splitlines() if _PROBLEM.search(line)]
        if done.returncode != 0:
            problems.append(f"iasl exited with status {done.returncode}")
        dsl = src.with_suffix(".dsl")
        text = dsl.read_text(errors="replace") if dsl.exists() else ""
    fields = []
    for line in text.splitlines():
        m = _LINE.fullmatch(line.strip())
        if m:
            fields.append(IaslField(int(m.group(1), 16), int(m.group(3), 16), m.group(4), m.group(5)))
        elif line.strip().startswith("**") or _PROBLEM.search(line) and not line.startswith(" *"):
            problems.append(line.strip())
    if not fields:
        problems.append("iasl printed no fields")
    return fields, problems


def _our_fields(data: bytes, kind: str):
    if kind == "cedt":
        structures = [decode(acpi.HEADER, data)] + cedt.decode_table(data).subtables
    else:
        structures = [decode(cdat.HEADER, data)] + cdat.decode_table(data).entries
    return [f for s in structures for f in flat_fields(s)]


def disagreements(data: bytes, kind: str) -> list[str]:
    """Where iasl and our decoder read the table differently, plus anything iasl complained of."""
    theirs, problems = disassemble(data, kind)
    by_offset = {(f.offset, f.width): f for f in theirs}
    out = [f"iasl: {p}" for p in problems]
    for offset, width, field, value in _our_fields(data, kind):
        f = by_offset.get((offset, width))
        if f is None:
            out.append(f"{field.label} at {offset:#x} ({width} bytes): iasl shows no field there")
            continue
        seen = f.string() if field.kind == "ascii" else f.number()
        if seen != value:
            out.append(f"{field.label} at {offset:#x}: ours {value!r}, iasl {f.label} = {f.text}")
    return out
