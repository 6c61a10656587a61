"""Every firmware table of a topology, as files: what `pfcxl tables` writes and boots use.

    CEDT.dat / CEDT.txt               the ACPI CEDT and its dump
    <device>.cdat / <device>.txt      each Type 3 device's CDAT (DSMAS, DSLBIS)
    <switch>.cdat / <switch>.txt      each switch's CDAT (SSLBIS)
    qemu-numa.args                    generic port + HMAT as QEMU options (one per line)
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pfcxl.device import fabric_constants
from pfcxl.device.topology import Topology
from pfcxl.errors import TableError

from . import acpi, cdat, cedt

# A table in the initrd replaces the firmware's only with the same OEM IDs and a higher revision.
OVERRIDE_OEM_REVISION = acpi.QEMU_IDS["oem_revision"] + 1
CEDT_MODES = ("auto", "qemu", "ours")

# QEMU's own CDAT for a volatile Type 3 device (hw/mem/cxl_type3.c, read back from a guest's
# /sys/bus/cxl/devices/endpointN/CDAT): what a topology without `timing` gets.
QEMU_DEFAULT_DEVICE = fabric_constants.PathTiming(150, 250, 16_000, 16_000)


@dataclass(frozen=True)
class TableSet:
    cedt: bytes
    device_cdat: dict[str, bytes]      # device id -> CDAT (only when the topology has timing)
    switch_cdat: dict[str, bytes]      # switch id -> CDAT (only when the topology has timing)
    numa_args: list[str]               # generic port and HMAT options (only with timing)


def _profile(topo: Topology):
    if topo.timing is None:
        return None
    if topo.timing not in fabric_constants.PROFILES:
        raise TableError(f"timing profile '{topo.timing}' is unknown "
                         f"(known: {', '.join(fabric_constants.PROFILES)})")
    return fabric_constants.PROFILES[topo.timing]


def tables_for(topo: Topology, *, cedt_oem_revision: int = 1) -> TableSet:
    profile = _profile(topo)
    devices, switches, numa = {}, {}, []
    if profile is not None:
        device_timing, switch_timing, host = profile
        for d in topo.devices:
            devices[d.id] = cdat.build(cdat.device_entries(d.capacity, device_timing,
                                                           non_volatile=d.kind == "persistent"))
        # A profile without switch figures (the photonic fabric has no switch) leaves QEMU's own.
        for sw in topo.switches if switch_timing else ():
            switches[sw.id] = cdat.build(cdat.switch_entries([p.port for p in sw.downstream], switch_timing))
        numa = numa_args(topo, host)
    return TableSet(cedt.from_topology(topo, oem_revision=cedt_oem_revision), devices, switches, numa)


def cedt_for_boot(topo: Topology, mode: str = "auto") -> bytes | None:
    """Our CEDT to put in place of QEMU's through the initrd table upgrade, or None for QEMU's.

    auto: ours only when the topology asks for something QEMU cannot write (window restrictions
    other than 0x000F, a QTG ID); ours: always; qemu: never (refused if the topology needs ours).
    """
    if mode not in CEDT_MODES:
        raise TableError(f"CEDT mode '{mode}' must be one of {', '.join(CEDT_MODES)}")
    expressible = all(w.qemu_expressible for w in topo.windows)
    if mode == "qemu" and not expressible:
        raise TableError("this topology sets CFMWS fields QEMU cannot write (restrictions, QTG ID); "
                         "it needs our CEDT (--cedt ours or auto)")
    if mode == "ours" or (mode == "auto" and not expressible):
        return cedt.from_topology(topo, oem_revision=OVERRIDE_OEM_REVISION)
    return None


def numa_args(topo: Topology, host: fabric_constants.PathTiming) -> list[str]:
    """Generic port affinity (one proximity domain per host bridge) and the HMAT entries from the
    CPUs' node 0 to each of them: the host side of the path (CXL request + response)."""
    lines = []
    for n, hb in enumerate(topo.host_bridges, start=1):
        lines.append(f"-numa node,nodeid={n}")
        lines.append(f"-object acpi-generic-port,id=gp-{hb.id},pci-bus={hb.id},node={n}")
        for kind, value in (("read-latency", host.read_latency_ns), ("write-latency", host.write_latency_ns)):
            lines.append(f"-numa hmat-lb,initiator=0,target={n},hierarchy=memory,data-type={kind},latency={value}")
        for kind, value in (("read-bandwidth", host.read_bandwidth_mbs), ("write-bandwidth", host.write_bandwidth_mbs)):
            lines.append(f"-numa hmat-lb,initiator=0,target={n},hierarchy=memory,data-type={kind},bandwidth={value}M")
    return lines


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
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        written.append(path)
    return written


def compare_cedt(ours: bytes, theirs: bytes) -> list[str]:
    """Differences between two CEDTs, CHBS compared as a set keyed by UID (QEMU orders them by
    an internal hash), everything else byte for byte in order, checksum included."""
    a, b = cedt.decode_table(ours), cedt.decode_table(theirs)
    diffs = [f"ours: {v}" for v in a.violations] + [f"theirs: {v}" for v in b.violations]
    if ours[:36] != theirs[:36]:
        diffs.append(f"headers differ: ours {ours[:36].hex()} theirs {theirs[:36].hex()}")

    def chbs(table: cedt.Table, data: bytes) -> dict[int, bytes]:
        return {s.values["uid"]: data[s.offset:s.offset + s.length] for s in table.subtables
                if s.layout is cedt.CHBS}

    def rest(table: cedt.Table, data: bytes) -> list[bytes]:
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
