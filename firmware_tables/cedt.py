"""ACPI CEDT (CXL Early Discovery Table): CHBS, CFMWS, CXIMS, RDPAS, CSDS (CXL 3.1, 9.18).

Built from a Topology, or decoded from any CEDT (QEMU's, ours, a real machine's) with every
violation listed.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfcxl.device.topology import address_map
from pfcxl.device.facts import qemu as qemu_facts
from pfcxl.device.topology import Topology
from pfcxl.errors import TableError

from pfcxl.firmware_tables import acpi
from pfcxl.device.facts.cxl_spec import CFMWS_GRANULE, CHBS_LENGTH, ENIW_OF_WAYS, HBIG_MAX, RESTRICTION_BITS as RESTRICTIONS
from pfcxl.firmware_tables.layout import Decoded, Field, Layout, Repeat, decode, dump, encode, violation_lines, walk

SIGNATURE = "CEDT"
REVISION = 1
WAYS_OF_ENIW = {v: k for k, v in ENIW_OF_WAYS.items()}
ARITHMETIC = {0: "modulo", 1: "XOR"}
CHBS_VERSIONS = {0: "CXL 1.1 (RCRB)", 1: "CXL 2.0 or later (CHBCR)"}


def _header(kind: int) -> tuple[Field, ...]:
    return (Field("type", "Subtable Type", 0, 1, default=kind),
            Field("reserved0", "Reserved", 1, 1, "reserved"),
            Field("length", "Record Length", 2, 2, derived=True))


CHBS = Layout("CHBS", "CXL Host Bridge Structure", _header(0) + (
    Field("uid", "UID", 4, 4),
    Field("cxl_version", "CXL Version", 8, 4, enum=CHBS_VERSIONS),
    Field("reserved1", "Reserved", 12, 4, "reserved"),
    Field("base", "Base", 16, 8),
    Field("register_length", "Length", 24, 8),
), size=32, length_key="length")

_TARGET = Layout("target", "Interleave Target", (Field("uid", "Host Bridge UID", 0, 4),), size=4)

CFMWS = Layout("CFMWS", "CXL Fixed Memory Window Structure", _header(1) + (
    Field("reserved1", "Reserved", 4, 4, "reserved"),
    Field("base_hpa", "Base HPA", 8, 8),
    Field("window_size", "Window Size", 16, 8),
    Field("eniw", "Encoded Interleave Ways (ENIW)", 24, 1,
          enum={e: f"{w} way{'s' if w > 1 else ''}" for w, e in ENIW_OF_WAYS.items()}),
    Field("arithmetic", "Interleave Arithmetic", 25, 1, enum=ARITHMETIC, default=0),
    Field("reserved2", "Reserved", 26, 2, "reserved"),
    Field("hbig", "Host Bridge Interleave Granularity", 28, 4,
          enum={g: f"{256 << g} bytes" for g in range(HBIG_MAX + 1)}),
    Field("restrictions", "Window Restrictions", 32, 2, flags=RESTRICTIONS, default=qemu_facts.RESTRICTIONS),
    Field("qtg_id", "QTG ID", 34, 2, default=0),
), size=36, length_key="length",
    repeat=Repeat("targets", "Interleave Target", 36, _TARGET,
                  count=lambda v, length: WAYS_OF_ENIW.get(v.get("eniw"), max((length - 36) // 4, 0))))

_XORMAP = Layout("xormap", "XOR Map", (Field("map", "XORMAP", 0, 8),), size=8)

CXIMS = Layout("CXIMS", "CXL XOR Interleave Math Structure", _header(2) + (
    Field("reserved1", "Reserved", 4, 2, "reserved"),
    Field("hbig", "Host Bridge Interleave Granularity", 6, 1,
          enum={g: f"{256 << g} bytes" for g in range(HBIG_MAX + 1)}),
    Field("nr_xormaps", "Number of XOR Maps", 7, 1, derived=True),
), size=8, length_key="length",
    repeat=Repeat("xormaps", "XOR Map", 8, _XORMAP, count=lambda v, length: v.get("nr_xormaps", 0)))

RDPAS = Layout("RDPAS", "RCEC Downstream Port Association Structure", _header(3) + (
    Field("reserved1", "Reserved", 4, 1, "reserved"),
    Field("segment", "RCEC Segment Number", 5, 2),
    Field("bdf", "RCEC BDF", 7, 2),
    Field("protocol", "Protocol Type", 9, 1, enum={0: "CXL.io", 1: "CXL.cachemem"}),
    Field("base", "Base Address", 10, 8),
), size=18, length_key="length")

CSDS = Layout("CSDS", "CXL System Description Structure", _header(4) + (
    Field("capabilities", "System Capabilities", 4, 2, flags={0: "CXL native hot-plug supported"}),
    Field("reserved1", "Reserved", 6, 2, "reserved"),
), size=8, length_key="length")

SUBTABLES = {0: CHBS, 1: CFMWS, 2: CXIMS, 3: RDPAS, 4: CSDS}
SUBTABLE_HEADER = Layout("subtable", "CEDT Subtable Header", _header(0), size=4, length_key="length")


# --------------------------------------------------------------------------- encoding rules


def encode_ways(ways: int) -> int:
    if ways not in ENIW_OF_WAYS:
        raise TableError(f"{ways}-way interleave cannot be encoded in a CFMWS "
                         f"(ENIW allows {', '.join(map(str, sorted(ENIW_OF_WAYS)))})")
    return ENIW_OF_WAYS[ways]


def encode_granularity(granularity: int) -> int:
    for hbig in range(HBIG_MAX + 1):
        if 256 << hbig == granularity:
            return hbig
    raise TableError(f"granularity {granularity} has no HBIG encoding (256 B << 0..{HBIG_MAX}, "
                     f"i.e. 256 B to 16 KiB, powers of two)")


def xor_maps(ways: int, granularity: int, window_size: int) -> list[int]:
    """XOR maps for an XOR-arithmetic window: one map per power-of-two factor of the ways.

    Our choice (the CXL spec leaves it to the platform): map i folds bit (g + i) with every
    k-th higher address bit inside the window, g = log2(granularity), k = number of maps, so
    consecutive granules still rotate over all targets while higher bits spread hot spots.
    """
    k = (ways & -ways).bit_length() - 1        # power-of-two part: 3/6/12 ways use 0/1/2 maps
    g = granularity.bit_length() - 1
    top = max(window_size.bit_length() - 1, g + k)
    maps = []
    for i in range(k):
        bits = range(g + i, top, k)
        maps.append(sum(1 << b for b in bits))
    return maps


# --------------------------------------------------------------------------- topology -> CEDT


def subtables_for(topo: Topology) -> list[tuple[Layout, dict]]:
    """CHBS per host bridge (topology order), CFMWS per window, CXIMS per XOR granularity."""
    out: list[tuple[Layout, dict]] = []
    chbs = address_map.chbs_bases(topo)
    bus = {hb.id: hb.bus_nr for hb in topo.host_bridges}
    for hb in topo.host_bridges:
        out.append((CHBS, {"uid": hb.bus_nr, "cxl_version": 1, "base": chbs[hb.id],
                           "register_length": qemu_facts.CHBS_LENGTH}))
    xor_hbigs: dict[int, dict] = {}
    for place, window in zip(address_map.window_placements(topo), topo.windows):
        values = cfmws_values(place.base, window.size, [bus[t] for t in window.targets], window.granularity,
                              arithmetic=window.arithmetic, restrictions=window.restrictions,
                              qtg_id=window.qtg_id)
        out.append((CFMWS, values))
        if window.arithmetic == "xor":
            xor_hbigs.setdefault(values["hbig"], {"hbig": values["hbig"],
                                                  "xormaps": [{"map": m} for m in
                                                              xor_maps(window.ways, window.granularity,
                                                                       window.size)]})
    out += [(CXIMS, {**v, "nr_xormaps": len(v["xormaps"])}) for v in xor_hbigs.values()]
    return out


def cfmws_values(base: int, size: int, target_uids: list[int], granularity: int, *,
                 arithmetic: str = "modulo", restrictions: int = qemu_facts.RESTRICTIONS, qtg_id: int = qemu_facts.QTG_ID) -> dict:
    """One window's fields, checked against the CFMWS rules; raises TableError naming the rule."""
    ways = len(target_uids)
    if ways > 16:
        raise TableError(f"a CFMWS has at most 16 interleave targets, got {ways}")
    eniw = encode_ways(ways)
    hbig = encode_granularity(granularity)
    if base % CFMWS_GRANULE:
        raise TableError(f"window base {base:#x} is not 256 MiB aligned")
    if size <= 0 or size % (CFMWS_GRANULE * ways):
        raise TableError(f"window size {size:#x} is not a multiple of 256 MiB x {ways} ways")
    if restrictions & ~sum(1 << b for b in RESTRICTIONS):
        raise TableError(f"window restrictions {restrictions:#x} set undefined bits")
    if not 0 <= qtg_id <= 0xFFFF:
        raise TableError(f"QTG ID {qtg_id} does not fit in 16 bits")
    return {"base_hpa": base, "window_size": size, "eniw": eniw,
            "arithmetic": {"modulo": 0, "xor": 1}[arithmetic], "hbig": hbig,
            "restrictions": restrictions, "qtg_id": qtg_id, "targets": [{"uid": u} for u in target_uids]}


def build(subtables: list[tuple[Layout, dict]], *, oem_revision: int = 1, ids: dict | None = None) -> bytes:
    body = b"".join(encode(layout, values) for layout, values in subtables)
    header = {"signature": SIGNATURE, "revision": REVISION, **acpi.QEMU_IDS, **(ids or {}),
              "oem_revision": oem_revision}
    return acpi.finish(header, body)


def from_topology(topo: Topology, *, oem_revision: int = 1) -> bytes:
    return build(subtables_for(topo), oem_revision=oem_revision)


# --------------------------------------------------------------------------- decoding


@dataclass
class Table:
    header: dict
    subtables: list[Decoded]
    violations: list[str]

    def of(self, name: str) -> list[dict]:
        return [s.values for s in self.subtables if s.layout.name == name]


def decode_table(data: bytes) -> Table:
    """Read a CEDT; never raises on bad bytes: every problem found goes into `violations`."""
    header, problems = acpi.check_header(data, SIGNATURE)
    end = min(len(data), header.get("length", len(data)) if header else len(data))
    subtables, found = walk(data, acpi.HEADER.size, end, SUBTABLE_HEADER, SUBTABLES, "subtable")
    problems += found
    for item in subtables:
        problems += _semantic(item)
    table = Table(header, subtables, problems)
    problems += _cross_checks(table)
    return table


def _semantic(item: Decoded) -> list[str]:
    v, where, out = item.values, f"{item.layout.name} at {item.offset:#x}", []
    if item.layout is CHBS and v.get("cxl_version") in CHBS_LENGTH:
        want = CHBS_LENGTH[v["cxl_version"]]
        if v["register_length"] != want:
            out.append(f"{where}: register Length {v['register_length']:#x} should be {want:#x} for "
                       f"{CHBS_VERSIONS[v['cxl_version']]}")
        if v["base"] % want:
            out.append(f"{where}: Base {v['base']:#x} is not aligned to its length {want:#x}")
    if item.layout is CFMWS and "eniw" in v:
        ways = WAYS_OF_ENIW.get(v["eniw"])
        if v["base_hpa"] % CFMWS_GRANULE:
            out.append(f"{where}: Base HPA {v['base_hpa']:#x} is not 256 MiB aligned")
        if ways and v["window_size"] % (CFMWS_GRANULE * ways):
            out.append(f"{where}: Window Size {v['window_size']:#x} is not a multiple of 256 MiB x {ways} ways")
        if v["window_size"] == 0:
            out.append(f"{where}: Window Size is 0")
    return out


def _cross_checks(table: Table) -> list[str]:
    out = []
    uids = [c["uid"] for c in table.of("CHBS")]
    for uid in sorted({u for u in uids if uids.count(u) > 1}):
        out.append(f"CHBS UID {uid:#x} appears {uids.count(uid)} times")
    windows = sorted((w["base_hpa"], w["window_size"]) for w in table.of("CFMWS"))
    for (b1, s1), (b2, _) in zip(windows, windows[1:]):
        if b2 < b1 + s1:
            out.append(f"CFMWS windows at {b1:#x} and {b2:#x} overlap")
    xor_hbigs = {c["hbig"] for c in table.of("CXIMS")}
    for w in table.of("CFMWS"):
        for t in w.get("targets", []):
            if t["uid"] not in uids:
                out.append(f"CFMWS at {w['base_hpa']:#x}: target UID {t['uid']:#x} has no CHBS")
        if w.get("arithmetic") == 1 and w.get("hbig") not in xor_hbigs:
            out.append(f"CFMWS at {w['base_hpa']:#x}: XOR arithmetic but no CXIMS for HBIG {w.get('hbig')}")
    return out


def dump_table(data: bytes) -> str:
    table = decode_table(data)
    d = decode(acpi.HEADER, data) if len(data) >= acpi.HEADER.size else None
    lines = ["CEDT (CXL Early Discovery Table), decoded by pfcxl", ""]
    if d is not None:
        lines += dump(d) + [""]
    for item in table.subtables:
        lines += dump(item) + [""]
    lines += violation_lines(table.violations)
    return "\n".join(lines) + "\n"
