"""Declarative binary layouts: one field list per structure drives encode, decode and dump.

The way ACPICA describes its data tables: a structure is a list of fields (offset, width,
name, how to show it). Lengths and checksums are derived, never typed. A structure whose tail
repeats (CFMWS target lists, SSLBIS entries, CXIMS XOR maps) declares the item layout and where
its count comes from, so the repeat is described once, not coded twice.

Values are plain dicts: {key: int | str | list[dict]}. Decoding never raises on bad bytes;
it returns what it could read plus a list of violations (strings), so a decoder can report every
problem in a table, not only the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from pfcxl.errors import TableError

# No CEDT or CDAT comes near this: structure lengths are 16-bit, so even a switch CDAT with every
# SSLBIS data type at its 64 KiB maximum stays under 1 MiB. Decoders read at most this (+1 to tell).
MAX_TABLE_BYTES = 1 << 20
MAX_VIOLATIONS_SHOWN = 50      # a dump lists this many violations, then counts the rest


@dataclass(frozen=True)
class Field:
    key: str                   # python name: "base_hpa"
    label: str                 # shown name: "Base HPA"
    offset: int
    width: int                 # bytes
    kind: str = "uint"         # uint | ascii | reserved
    enum: Mapping[int, str] | None = None     # value -> meaning, shown beside the number
    flags: Mapping[int, str] | None = None    # bit -> meaning; bits not named must be zero
    derived: bool = False      # computed by the encoder (length, checksum): callers don't give it
    default: int | str | None = None          # used when the caller omits the key

    @property
    def end(self) -> int:
        return self.offset + self.width


@dataclass(frozen=True)
class Repeat:
    """A tail of `count` items of `item` layout, starting at `offset`."""

    key: str                   # where the list goes in the values: "targets"
    label: str
    offset: int
    item: "Layout"
    count: Callable[[dict, int], int]      # (decoded head values, total length) -> item count


@dataclass(frozen=True)
class Layout:
    name: str                  # "CFMWS"
    title: str                 # "CXL Fixed Memory Window Structure"
    fields: tuple[Field, ...]
    size: int                  # bytes of the fixed part
    repeat: Repeat | None = None
    length_key: str | None = None          # field holding the whole structure's length
    _by_key: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_key", {f.key: f for f in self.fields})
        offset = 0
        for f in sorted(self.fields, key=lambda f: f.offset):
            if f.offset != offset:
                raise ValueError(f"{self.name}: field {f.key} at {f.offset}, expected {offset}")
            offset = f.end
        if offset != self.size:
            raise ValueError(f"{self.name}: fields end at {offset}, layout size is {self.size}")

    def field(self, key: str) -> Field:
        return self._by_key[key]

    def length_of(self, values: dict) -> int:
        items = values.get(self.repeat.key, []) if self.repeat else []
        return self.size + (len(items) * self.repeat.item.size if self.repeat else 0)


# --------------------------------------------------------------------------- encode


def _put(buf: bytearray, f: Field, value: int | str, where: str) -> None:
    if f.kind == "ascii":
        raw = str(value).encode("ascii", errors="replace")
        if len(raw) > f.width:
            raise TableError(f"{where}: {f.label} '{value}' is longer than {f.width} characters")
        buf[f.offset:f.end] = raw.ljust(f.width, b" " if f.width in (6, 8) else b"\0")
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise TableError(f"{where}: {f.label} must be an integer, got {value!r}")
    if not 0 <= value < 1 << (8 * f.width):
        raise TableError(f"{where}: {f.label} {value:#x} does not fit in {f.width} bytes")
    buf[f.offset:f.end] = value.to_bytes(f.width, "little")


def encode(layout: Layout, values: dict, where: str | None = None) -> bytes:
    """Bytes of one structure. Unknown keys are an error (a misspelt field must not vanish)."""
    where = where or layout.name
    known = {f.key for f in layout.fields} | ({layout.repeat.key} if layout.repeat else set())
    unknown = set(values) - known
    if unknown:
        raise TableError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    buf = bytearray(layout.size)
    for f in layout.fields:
        if f.kind == "reserved":
            continue
        value: int | str
        if f.key == layout.length_key:
            value = layout.length_of(values)
        elif f.key in values:
            value = values[f.key]
        elif f.default is not None or f.derived:
            value = f.default if f.default is not None else 0
        else:
            raise TableError(f"{where}: {f.label} ({f.key}) is required")
        _put(buf, f, value, where)
    if layout.repeat:
        for i, item in enumerate(values.get(layout.repeat.key, [])):
            buf += encode(layout.repeat.item, item, f"{where} {layout.repeat.label}[{i}]")
    return bytes(buf)


# --------------------------------------------------------------------------- decode


@dataclass
class Decoded:
    layout: Layout
    offset: int                # where it starts in the table
    values: dict
    length: int                # bytes it spans
    violations: list[str]


def _get(data: bytes | memoryview, base: int, f: Field) -> int | str:
    raw = data[base + f.offset: base + f.end]
    if f.kind == "ascii":
        return bytes(raw).decode("ascii", errors="replace")
    return int.from_bytes(raw, "little")


def decode(layout: Layout, data: bytes | memoryview, base: int = 0, length: int | None = None,
           where: str | None = None) -> Decoded:
    """Read one structure at `base`. `length` bounds it (defaults to its length field or size)."""
    where = where or f"{layout.name} at offset {base:#x}"
    problems: list[str] = []
    available = len(data) - base
    if available < layout.size:
        problems.append(f"{where}: truncated: {available} bytes left, the fixed part needs {layout.size}")
        return Decoded(layout, base, {}, max(available, 0), problems)
    values: dict = {}
    for f in layout.fields:
        value = _get(data, base, f)
        if f.kind == "reserved":
            if value:
                problems.append(f"{where}: reserved field {f.label} is {value:#x}, must be 0")
            continue
        values[f.key] = value
        if f.enum is not None and value not in f.enum:
            problems.append(f"{where}: {f.label} {value:#x} is not a defined value "
                            f"({', '.join(f'{k}={v}' for k, v in f.enum.items())})")
        if f.flags is not None and isinstance(value, int):
            undefined = value & ~sum(1 << bit for bit in f.flags)
            if undefined:
                problems.append(f"{where}: {f.label} {value:#x} sets reserved bits {undefined:#x}")
    if length is None:
        length = values.get(layout.length_key, layout.size) if layout.length_key else layout.size
    if length < layout.size:
        problems.append(f"{where}: length {length} is shorter than the structure's {layout.size} bytes")
        length = layout.size
    if length > available:
        problems.append(f"{where}: length {length} runs past the end of the data ({available} bytes left)")
        length = available
    if layout.repeat:
        rep = layout.repeat
        count = rep.count(values, length)
        items, pos = [], base + rep.offset
        for i in range(count):
            if pos + rep.item.size > base + length:
                problems.append(f"{where}: {rep.label} declares {count} entries but only {i} fit in "
                                f"length {length}")
                break
            item = decode(rep.item, data, pos, where=f"{where} {rep.label}[{i}]")
            problems += item.violations
            items.append(item.values)
            pos += rep.item.size
        values[rep.key] = items
        expected = layout.size + count * rep.item.size
        if expected != length and len(items) == count:
            problems.append(f"{where}: length {length} does not match {count} {rep.label} "
                            f"({expected} bytes)")
    return Decoded(layout, base, values, length, problems)


def walk(data: bytes, start: int, end: int, header: Layout, by_type: dict[int, Layout],
         noun: str) -> tuple[list[Decoded], list[str]]:
    """Decode a run of structures that each begin with type (1 byte), reserved, length (2 bytes),
    the shape of CEDT subtables and CDAT entries. Unknown types are skipped by their length and
    reported; a length that cannot be right ends the walk."""
    items: list[Decoded] = []
    problems: list[str] = []
    view = memoryview(data)    # bounding each structure by slicing a view copies nothing
    pos = start
    while pos < end:
        head = decode(header, data, pos, where=f"{noun} at {pos:#x}")
        if not head.values:
            problems += head.violations
            break
        kind, length = head.values["type"], head.values["length"]
        if length < header.size:
            problems.append(f"{noun} at {pos:#x}: length {length} is too small; stopping here")
            break
        layout = by_type.get(kind)
        if layout is None:
            problems.append(f"{noun} at {pos:#x}: unknown {noun} type {kind} ({length} bytes skipped)")
        else:
            item = decode(layout, view[:pos + length], pos, where=f"{layout.name} at {pos:#x}")
            problems += item.violations
            if not item.values:      # its fixed part did not fit: nothing more to read
                break
            items.append(item)
        pos += length
    return items, problems


# --------------------------------------------------------------------------- dump


def violation_lines(violations: list[str]) -> list[str]:
    """The count, then the first MAX_VIOLATIONS_SHOWN violations and how many more there are."""
    lines = [f"Violations: {len(violations)}"] + [f"  - {v}" for v in violations[:MAX_VIOLATIONS_SHOWN]]
    if len(violations) > MAX_VIOLATIONS_SHOWN:
        lines.append(f"  ... and {len(violations) - MAX_VIOLATIONS_SHOWN} more")
    return lines


def _show(f: Field, value: int | str) -> str:
    if f.kind == "ascii" or isinstance(value, str):
        return f'"{value}"'
    text = f"{value:0{2 * f.width}X}"
    if f.enum is not None:
        text += f" [{f.enum.get(value, 'unknown')}]"
    if f.flags:
        set_bits = [name for bit, name in f.flags.items() if value >> bit & 1]
        text += f" [{', '.join(set_bits) or 'none'}]"
    return text


def dump(decoded: Decoded, table_offset: int = 0) -> list[str]:
    """iasl -d style lines: [hex offset, decimal offset, hex width]  Label : Value."""
    lines = [f"[{decoded.layout.title}]"]
    base = decoded.offset + table_offset

    def line(offset: int, width: int, label: str, text: str) -> str:
        return f"[{offset:03X}h {offset:04d} {width:03X}h] {label:>32} : {text}"

    for f in decoded.layout.fields:
        if f.key not in decoded.values and f.kind != "reserved":
            continue
        text = "00" * f.width if f.kind == "reserved" else _show(f, decoded.values[f.key])
        lines.append(line(base + f.offset, f.width, f.label, text))
    if decoded.layout.repeat:
        rep = decoded.layout.repeat
        pos = base + rep.offset
        for i, item in enumerate(decoded.values.get(rep.key, [])):
            for f in rep.item.fields:
                if f.kind == "reserved":
                    text = "00" * f.width
                else:
                    text = _show(f, item[f.key])
                lines.append(line(pos + f.offset, f.width, f"{rep.label}[{i}] {f.label}", text))
            pos += rep.item.size
    return lines


def flat_fields(decoded: Decoded) -> list[tuple[int, int, Field, int | str]]:
    """(absolute offset, width, field, value) of every non-reserved field, repeats included."""
    out = []
    for f in decoded.layout.fields:
        if f.kind != "reserved" and f.key in decoded.values:
            out.append((decoded.offset + f.offset, f.width, f, decoded.values[f.key]))
    rep = decoded.layout.repeat
    if rep:
        pos = decoded.offset + rep.offset
        for item in decoded.values.get(rep.key, []):
            for f in rep.item.fields:
                if f.kind != "reserved":
                    out.append((pos + f.offset, f.width, f, item[f.key]))
            pos += rep.item.size
    return out
