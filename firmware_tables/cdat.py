"""CXL CDAT (Coherent Device Attribute Table, CDAT 1.04): DSMAS, DSLBIS, DSMSCIS, DSIS, DSEMTS, SSLBIS.

A CDAT is what a CXL device or switch reports through DOE; QEMU serves a `cdat=` file verbatim.
Latencies are picoseconds and bandwidths MB/s once multiplied by the entry's base unit; the
builder picks, per entry, a base unit that makes the 16-bit value exact.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfcxl.device.fabric.constants import PathTiming
from pfcxl.errors import TableError

from pfcxl.firmware_tables.layout import Decoded, Field, Layout, Repeat, decode, dump, encode, violation_lines, walk

REVISION = 2                     # what QEMU 10 writes; iasl 20250404 reads it
HEADER = Layout("CDAT header", "CDAT Header", (
    Field("length", "Length", 0, 4, derived=True),
    Field("revision", "Revision", 4, 1, default=REVISION),
    Field("checksum", "Checksum", 5, 1, derived=True),
    Field("reserved0", "Reserved", 6, 6, "reserved"),
    Field("sequence", "Sequence", 12, 4, default=0),
), size=16)

# HMAT / CDAT data types (ACPI 6.5 Table 5.152; CDAT reuses them)
DATA_TYPES = {0: "access latency", 1: "read latency", 2: "write latency",
              3: "access bandwidth", 4: "read bandwidth", 5: "write bandwidth"}
LATENCY_TYPES = (0, 1, 2)
DSMAS_NON_VOLATILE = 2
DSMAS_FLAGS = {DSMAS_NON_VOLATILE: "non-volatile", 3: "shareable", 4: "hardware-managed coherency",
               5: "dynamic capacity", 6: "read-only"}
UPSTREAM_PORT = 0x100            # SSLBIS port id of a switch's upstream port
ANY_PORT = 0xFFFF


def _header(kind: int) -> tuple[Field, ...]:
    return (Field("type", "Type", 0, 1, default=kind),
            Field("reserved_h", "Reserved", 1, 1, "reserved"),
            Field("length", "Length", 2, 2, derived=True))


DSMAS = Layout("DSMAS", "Device Scoped Memory Affinity Structure", _header(0) + (
    Field("handle", "DSMAD Handle", 4, 1),
    Field("flags", "Flags", 5, 1, flags=DSMAS_FLAGS, default=0),
    Field("reserved1", "Reserved", 6, 2, "reserved"),
    Field("dpa_base", "DPA Base", 8, 8),
    Field("dpa_length", "DPA Length", 16, 8),
), size=24, length_key="length")

DSLBIS = Layout("DSLBIS", "Device Scoped Latency and Bandwidth Information Structure", _header(1) + (
    Field("handle", "Handle", 4, 1),
    Field("flags", "Flags", 5, 1, enum={0: "memory", 1: "first level memory side cache",
                                        2: "second level", 3: "third level"}, default=0),
    Field("data_type", "Data Type", 6, 1, enum=DATA_TYPES),
    Field("reserved1", "Reserved", 7, 1, "reserved"),
    Field("base_unit", "Entry Base Unit", 8, 8),
    Field("entry0", "Entry[0]", 16, 2),
    Field("entry1", "Entry[1]", 18, 2, default=0),
    Field("entry2", "Entry[2]", 20, 2, default=0),
    Field("reserved2", "Reserved", 22, 2, "reserved"),
), size=24, length_key="length")

DSMSCIS = Layout("DSMSCIS", "Device Scoped Memory Side Cache Information Structure", _header(2) + (
    Field("handle", "DSMAS Handle", 4, 1),
    Field("reserved1", "Reserved", 5, 3, "reserved"),
    Field("cache_size", "Memory Side Cache Size", 8, 8),
    Field("cache_attributes", "Cache Attributes", 16, 4, default=0),
), size=20, length_key="length")

DSIS = Layout("DSIS", "Device Scoped Initiator Structure", _header(3) + (
    Field("flags", "Flags", 4, 1, flags={0: "memory attached"}, default=0),
    Field("handle", "Handle", 5, 1),
    Field("reserved1", "Reserved", 6, 2, "reserved"),
), size=8, length_key="length")

DSEMTS = Layout("DSEMTS", "Device Scoped EFI Memory Type Structure", _header(4) + (
    Field("handle", "DSMAS Handle", 4, 1),
    Field("memory_type", "EFI Memory Type and Attribute", 5, 1,
          enum={0: "conventional", 1: "conventional, specific purpose", 2: "reserved memory"}),
    Field("reserved1", "Reserved", 6, 2, "reserved"),
    Field("dpa_offset", "DPA Offset", 8, 8),
    Field("dpa_length", "DPA Length", 16, 8),
), size=24, length_key="length")

_SSLBE = Layout("SSLBE", "Switch Scoped Latency and Bandwidth Entry", (
    Field("port_x", "Port X ID", 0, 2),
    Field("port_y", "Port Y ID", 2, 2),
    Field("value", "Latency or Bandwidth", 4, 2),
    Field("reserved", "Reserved", 6, 2, "reserved"),
), size=8)

SSLBIS = Layout("SSLBIS", "Switch Scoped Latency and Bandwidth Information Structure", _header(5) + (
    Field("data_type", "Data Type", 4, 1, enum=DATA_TYPES),
    Field("reserved1", "Reserved", 5, 3, "reserved"),
    Field("base_unit", "Entry Base Unit", 8, 8),
), size=16, length_key="length",
    repeat=Repeat("entries", "SSLBE", 16, _SSLBE, count=lambda v, length: max((length - 16) // 8, 0)))

ENTRIES = {0: DSMAS, 1: DSLBIS, 2: DSMSCIS, 3: DSIS, 4: DSEMTS, 5: SSLBIS}
ENTRY_HEADER = Layout("entry", "CDAT Entry Header", _header(0), size=4, length_key="length")


# --------------------------------------------------------------------------- values and units


def base_unit_for(value: int, what: str) -> tuple[int, int]:
    """(base unit, 16-bit entry) with entry x base == value exactly; the smallest power of ten."""
    if value < 0:
        raise TableError(f"{what}: {value} is negative")
    base = 1
    while base <= max(value, 1):
        if value % base == 0 and value // base <= 0xFFFF:
            return base, value // base
        base *= 10
    raise TableError(f"{what}: {value} cannot be written as a 16-bit entry times a power-of-ten "
                     f"base unit exactly")


def latency_ps(ns: int) -> int:
    return ns * 1000


def _dslbis(handle: int, data_type: int, value: int) -> dict:
    base, entry = base_unit_for(value, f"DSLBIS {DATA_TYPES[data_type]}")
    return {"handle": handle, "data_type": data_type, "base_unit": base, "entry0": entry}


def device_entries(dpa_length: int, timing: PathTiming, *, handle: int = 0,
                   memory_side_cache: int = 0, non_volatile: bool = False) -> list[tuple[Layout, dict]]:
    """A Type 3 device: one DSMAS over its capacity (flagged non-volatile for persistent memory),
    DSLBIS for read/write latency and bandwidth, and a DSMSCIS when it has a memory-side cache
    (the appliance's HBM)."""
    flags = 1 << DSMAS_NON_VOLATILE if non_volatile else 0
    entries: list[tuple[Layout, dict]] = [
        (DSMAS, {"handle": handle, "flags": flags, "dpa_base": 0, "dpa_length": dpa_length}),
        (DSLBIS, _dslbis(handle, 1, latency_ps(timing.read_latency_ns))),
        (DSLBIS, _dslbis(handle, 2, latency_ps(timing.write_latency_ns))),
        (DSLBIS, _dslbis(handle, 4, timing.read_bandwidth_mbs)),
        (DSLBIS, _dslbis(handle, 5, timing.write_bandwidth_mbs)),
    ]
    if memory_side_cache:
        entries.append((DSMSCIS, {"handle": handle, "cache_size": memory_side_cache}))
    return entries


def switch_entries(downstream_port_ids: list[int], timing: PathTiming) -> list[tuple[Layout, dict]]:
    """SSLBIS between the upstream port (Port X, as QEMU writes it) and each downstream port."""
    out = []
    for data_type, value in ((1, latency_ps(timing.read_latency_ns)), (2, latency_ps(timing.write_latency_ns)),
                             (4, timing.read_bandwidth_mbs), (5, timing.write_bandwidth_mbs)):
        base, entry = base_unit_for(value, f"SSLBIS {DATA_TYPES[data_type]}")
        out.append((SSLBIS, {"data_type": data_type, "base_unit": base,
                             "entries": [{"port_x": UPSTREAM_PORT, "port_y": p, "value": entry}
                                         for p in downstream_port_ids]}))
    return out


def checksum_byte(data: bytes) -> int:
    return (-sum(data)) & 0xFF


def build(entries: list[tuple[Layout, dict]], sequence: int = 0) -> bytes:
    body = b"".join(encode(layout, values) for layout, values in entries)
    raw = bytearray(encode(HEADER, {"length": HEADER.size + len(body), "sequence": sequence}) + body)
    raw[0:4] = len(raw).to_bytes(4, "little")
    raw[5] = checksum_byte(bytes(raw))
    return bytes(raw)


# --------------------------------------------------------------------------- decoding


@dataclass
class Table:
    header: dict
    entries: list[Decoded]
    violations: list[str]

    def of(self, name: str) -> list[dict]:
        return [e.values for e in self.entries if e.layout.name == name]


def decode_table(data: bytes) -> Table:
    """Read a CDAT; every problem found goes into `violations`, nothing is raised."""
    head = decode(HEADER, data, where="CDAT header")
    problems = list(head.violations)
    header = head.values
    if header:
        if header["length"] != len(data):
            problems.append(f"CDAT header: Length {header['length']} but the data has {len(data)} bytes")
        if sum(data) & 0xFF:
            expected = checksum_byte(data[:5] + bytes(1) + data[6:])
            problems.append(f"CDAT header: checksum {header['checksum']:#04x} is wrong (should be "
                            f"{expected:#04x})")
    entries: list[Decoded] = []
    if header:
        end = min(len(data), header["length"])
        entries, found = walk(data, HEADER.size, end, ENTRY_HEADER, ENTRIES, "entry")
        problems += found
    table = Table(header, entries, problems)
    handles = {d["handle"] for d in table.of("DSMAS")}
    for e in table.entries:
        if e.layout in (DSLBIS, DSMSCIS, DSEMTS) and e.values.get("handle") not in handles:
            problems.append(f"{e.layout.name} at {e.offset:#x}: handle {e.values.get('handle')} names no DSMAS")
    return table


def values_of(table: Table) -> dict:
    """Latencies (ns) and bandwidths (MB/s) a CDAT advertises, by DSLBIS data type name."""
    out = {}
    for d in table.of("DSLBIS"):
        value = d["entry0"] * d["base_unit"]
        name = DATA_TYPES.get(d["data_type"], str(d["data_type"]))
        out[name] = value / 1000 if d["data_type"] in LATENCY_TYPES else value
    return out


def dump_table(data: bytes) -> str:
    table = decode_table(data)
    lines = ["CDAT (Coherent Device Attribute Table), decoded by pfcxl", ""]
    if len(data) >= HEADER.size:
        lines += dump(decode(HEADER, data)) + [""]
    for e in table.entries:
        lines += dump(e) + [""]
    lines += violation_lines(table.violations)
    return "\n".join(lines) + "\n"
