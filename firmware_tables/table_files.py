"""A topology's firmware tables as files (what `pfcxl tables` writes and boots hand to QEMU),
and the comparison of two CEDTs.

    CEDT.dat / CEDT.txt               the ACPI CEDT and its dump
    <device>.cdat / <device>.txt      each Type 3 device's CDAT (DSMAS, DSLBIS)
    <switch>.cdat / <switch>.txt      each switch's CDAT (SSLBIS)
    qemu-numa.args                    generic port + HMAT as QEMU options (one per line)
"""

from __future__ import annotations

from pathlib import Path

from pfcxl.device.topology import Topology

from pfcxl.cache import write_whole
from pfcxl.firmware_tables import cdat, cedt
from pfcxl.firmware_tables.generate import TableSet, tables_for


def write(topo: Topology, out_dir: Path, tables: TableSet | None = None) -> list[Path]:
    """Write the table files atomically (each file appears whole or not at all)."""
    tables = tables or tables_for(topo)
    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {"CEDT.dat": tables.cedt, "CEDT.txt": cedt.dump_table(tables.cedt).encode()}
    for name, data in {**tables.device_cdat, **tables.switch_cdat}.items():
        files[f"{name}.cdat"] = data
        files[f"{name}.txt"] = cdat.dump_table(data).encode()
    if tables.numa_args:
        files["qemu-numa.args"] = ("\n".join(tables.numa_args) + "\n").encode()
    written = []
    for name, data in files.items():
        path = out_dir / name
        write_whole(path, data)
        written.append(path)
    return written


def compare_cedt(ours: bytes, theirs: bytes) -> list[str]:
    """Differences between two CEDTs, CHBS compared as a set keyed by UID (QEMU orders them by
    an internal hash), everything else byte for byte in order, checksum included."""
    a, b = cedt.decode_table(ours), cedt.decode_table(theirs)
    diffs = [f"ours: {v}" for v in a.violations] + [f"theirs: {v}" for v in b.violations]
    if ours[:36] != theirs[:36]:
        diffs.append(f"headers differ: ours {ours[:36].hex()} theirs {theirs[:36].hex()}")

    def chbs(table: cedt.CedtTable, data: bytes) -> dict[int, bytes]:
        return {s.values["uid"]: data[s.offset:s.offset + s.length] for s in table.subtables
                if s.layout is cedt.CHBS}

    def rest(table: cedt.CedtTable, data: bytes) -> list[bytes]:
        return [data[s.offset:s.offset + s.length] for s in table.subtables if s.layout is not cedt.CHBS]

    ca, cb = chbs(a, ours), chbs(b, theirs)
    for uid in sorted(set(ca) | set(cb)):
        if ca.get(uid) != cb.get(uid):
            diffs.append(f"CHBS UID {uid:#x}: ours {ca.get(uid, b'').hex() or 'missing'}, "
                         f"theirs {cb.get(uid, b'').hex() or 'missing'}")
    ra, rb = rest(a, ours), rest(b, theirs)
    if len(ra) != len(rb):
        diffs.append(f"ours has {len(ra)} non-CHBS subtables, theirs {len(rb)}")
    for i, (x, y) in enumerate(zip(ra, rb)):
        if x != y:
            diffs.append(f"non-CHBS subtable {i} differs: ours {x.hex()}, theirs {y.hex()}")
    return diffs
