"""Firmware tables: encode/decode round trips, encoding rules, every violation reported, iasl agrees."""

import dataclasses
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pfcxl.device.fabric import constants as fabric_constants
from pfcxl.device.fabric import model as fabric_model
from pfcxl.device import topology
from pfcxl.errors import TableError
from pfcxl.firmware_tables import acpi, boot_policy, cdat, cedt, generate, iasl, table_files
from pfcxl.firmware_tables.layout import decode, encode

MiB256 = 256 << 20

pytestmark = pytest.mark.component


def load(name, **changes):
    return dataclasses.replace(topology.load(topology.resolve(name)), **changes)


def all_generated_tables():
    """(label, kind, bytes) for every table we generate for the shipped topologies and variants."""
    out = []
    variants = [load(n) for n in ("pf-nic", "two-hb-interleave", "electrical-switch")]
    variants.append(load("electrical-switch", profile="pf"))
    xor = load("two-hb-interleave")
    xor = dataclasses.replace(xor, windows=(dataclasses.replace(xor.windows[0], arithmetic="xor"),))
    variants.append(xor)
    for topo in variants:
        t = generate.tables_for(topo)
        out.append((f"{topo.name}/{topo.profile}/{topo.windows[0].arithmetic} CEDT", "cedt", t.cedt))
        for name, data in {**t.device_cdat, **t.switch_cdat}.items():
            out.append((f"{topo.name}/{topo.profile} {name} CDAT", "cdat", data))
    return out


# ------------------------------------------------------------------------------ CEDT rules


@pytest.mark.parametrize("ways,eniw", [(1, 0), (2, 1), (4, 2), (8, 3), (16, 4), (3, 8), (6, 9), (12, 10)])
def test_eniw_encoding(ways, eniw):
    assert cedt.encode_ways(ways) == eniw
    assert cedt.WAYS_OF_ENIW[eniw] == ways


@pytest.mark.parametrize("gran,hbig", [(256, 0), (512, 1), (1024, 2), (4096, 4), (16384, 6)])
def test_hbig_encoding(gran, hbig):
    assert cedt.encode_granularity(gran) == hbig


@pytest.mark.parametrize("call,message", [
    (lambda: cedt.encode_ways(5), "5-way interleave cannot be encoded"),
    (lambda: cedt.encode_granularity(32768), "granularity 32768 has no HBIG encoding"),
    (lambda: cedt.encode_granularity(384), "granularity 384 has no HBIG encoding"),
    (lambda: cedt.cfmws_values(MiB256 + 4096, MiB256, [1], 256), "not 256 MiB aligned"),
    (lambda: cedt.cfmws_values(MiB256, 3 * MiB256, [1, 2], 256), "not a multiple of 256 MiB x 2 ways"),
    (lambda: cedt.cfmws_values(MiB256, 17 * MiB256, list(range(17)), 256), "at most 16 interleave targets"),
    (lambda: cedt.cfmws_values(MiB256, MiB256, [1], 256, restrictions=0x80), "undefined bits"),
    (lambda: cdat.base_unit_for(70_000_001, "DSLBIS read latency"),
     "cannot be written as a 16-bit entry times a power-of-ten base unit"),
    (lambda: encode(cedt.CHBS, {"uid": 1, "cxl_version": 1, "base": 0, "register_length": 1, "bogus": 2}),
     "unknown field"),
    (lambda: encode(cedt.CHBS, {"uid": 1 << 32, "cxl_version": 1, "base": 0, "register_length": 1}),
     "does not fit in 4 bytes"),
])
def test_invalid_requests_are_clear_errors(call, message):
    with pytest.raises(TableError, match=message):
        call()


def test_base_units_make_exact_16_bit_entries():
    assert cdat.base_unit_for(212_000, "x") == (10, 21200)        # 212 ns in ps
    assert cdat.base_unit_for(25_600, "x") == (1, 25600)          # 25.6 GB/s in MB/s
    assert cdat.base_unit_for(128_000, "x") == (10, 12800)        # 128 GB/s does not fit as is
    assert cdat.base_unit_for(550_000, "x") == (10, 55000)


def test_xor_maps_cover_interleave_bits():
    maps = cedt.xor_maps(4, 256, 4 << 30)
    assert len(maps) == 2
    assert maps[0] >> 8 & 1 and maps[1] >> 9 & 1          # bit g+i is in map i
    assert maps[0] & maps[1] == 0                          # each address bit feeds one target bit
    assert cedt.xor_maps(3, 256, 4 << 30) == []            # 3 ways: modulo part only
    assert len(cedt.xor_maps(12, 4096, 12 << 30)) == 2


def test_cedt_from_topology_round_trips():
    topo = load("two-hb-interleave")
    data = cedt.from_topology(topo)
    table = cedt.decode_table(data)
    assert table.violations == []
    assert [c["uid"] for c in table.of("CHBS")] == [hb.bus_nr for hb in topo.host_bridges]
    (w,) = table.of("CFMWS")
    assert w["window_size"] == topo.windows[0].size
    assert cedt.WAYS_OF_ENIW[w["eniw"]] == 2 and 256 << w["hbig"] == 8192
    assert [t["uid"] for t in w["targets"]] == [12, 222]
    assert sum(data) & 0xFF == 0 and len(data) == table.header["length"]


def test_xor_window_gets_a_cxims():
    topo = load("two-hb-interleave")
    topo = dataclasses.replace(topo, windows=(dataclasses.replace(topo.windows[0], arithmetic="xor"),))
    table = cedt.decode_table(cedt.from_topology(topo))
    assert table.violations == []
    (x,) = table.of("CXIMS")
    assert x["hbig"] == 5 and x["nr_xormaps"] == 1 and len(x["xormaps"]) == 1


# ------------------------------------------------------------------------------ violations


def _cedt_bytes():
    return bytearray(cedt.from_topology(load("two-hb-interleave")))


def _refresh_checksum(raw: bytearray) -> bytes:
    raw[9] = 0
    raw[9] = acpi.checksum_byte(bytes(raw))
    return bytes(raw)


def test_every_violation_is_listed_not_just_the_first():
    raw = _cedt_bytes()
    cfmws = 0x64
    raw[cfmws + 1] = 0x7                     # reserved byte of the CFMWS header
    raw[cfmws + 8] = 0x10                    # base 0x..._0010: not 256 MiB aligned
    raw[cfmws + 32] = 0xCF                   # restriction bits 6, 7: undefined
    raw[9] ^= 0x55                           # and the checksum is now wrong
    table = cedt.decode_table(bytes(raw))
    text = "\n".join(table.violations)
    assert "checksum" in text
    assert "reserved field Reserved is 0x7" in text
    assert "not 256 MiB aligned" in text
    assert "sets reserved bits 0xc0" in text
    assert len(table.violations) >= 4


def test_length_mismatch_and_truncation():
    raw = _cedt_bytes()
    longer = bytes(raw) + b"\0" * 4
    assert any("Table Length 144 but the data has 148" in v for v in cedt.decode_table(longer).violations)
    at_boundary = cedt.decode_table(bytes(raw[:100])).violations     # ends between two structures
    assert any("Table Length 144 but the data has 100 bytes" in v for v in at_boundary)
    mid_structure = cedt.decode_table(bytes(raw[:120])).violations   # ends inside the CFMWS
    assert any("CFMWS at 0x64: truncated" in v for v in mid_structure), mid_structure


def test_unknown_subtable_is_skipped_and_reported():
    raw = _cedt_bytes()
    raw[0x64] = 9                            # the CFMWS becomes an unknown type
    table = cedt.decode_table(_refresh_checksum(raw))
    assert any("unknown subtable type 9" in v for v in table.violations)
    assert len(table.of("CHBS")) == 2        # decoding went on past it


def test_cross_structure_checks():
    topo = load("two-hb-interleave")
    subs = cedt.subtables_for(topo)
    chbs_only_one = [s for s in subs if not (s[0] is cedt.CHBS and s[1]["uid"] == 222)]
    violations = cedt.decode_table(cedt.build(chbs_only_one)).violations
    assert any("target UID 0xde has no CHBS" in v for v in violations)
    duplicated = subs + [subs[0]]
    assert any("CHBS UID 0xc appears 2 times" in v for v in cedt.decode_table(cedt.build(duplicated)).violations)
    xor = [(l, {**v, "arithmetic": 1}) if l is cedt.CFMWS else (l, v) for l, v in subs]
    assert any("XOR arithmetic but no CXIMS" in v for v in cedt.decode_table(cedt.build(xor)).violations)


def test_cdat_violations():
    data = bytearray(generate.tables_for(load("pf-nic")).device_cdat["pfnic0"])
    assert cdat.decode_table(bytes(data)).violations == []
    data[5] ^= 1
    assert any("checksum" in v for v in cdat.decode_table(bytes(data)).violations)
    entries = cdat.device_entries(1 << 30, fabric_constants.PF_MODULE)
    orphan = entries + [(cdat.DSLBIS, {"handle": 7, "data_type": 1, "base_unit": 1, "entry0": 5})]
    assert any("handle 7 names no DSMAS" in v for v in cdat.decode_table(cdat.build(orphan)).violations)


def test_pf_cdat_carries_the_papers_module_timing():
    values = cdat.values_of(cdat.decode_table(generate.tables_for(load("pf-nic")).device_cdat["pfnic0"]))
    assert values == {"read latency": fabric_constants.PF_T_MEM_READ_NS,
                      "write latency": fabric_constants.PF_T_MEM_WRITE_NS,
                      "read bandwidth": fabric_constants.PF_PORT_BANDWIDTH_MBS,
                      "write bandwidth": fabric_constants.PF_PORT_BANDWIDTH_MBS}
    assert fabric_model.idle_ns("pf", False) == 283 and fabric_model.idle_ns("pf", True) == 224


def test_compare_cedt_ignores_chbs_order_only():
    topo = load("two-hb-interleave")
    subs = cedt.subtables_for(topo)
    swapped = [subs[1], subs[0]] + subs[2:]
    assert table_files.compare_cedt(cedt.build(subs), cedt.build(swapped)) == []
    changed = subs[:2] + [(cedt.CFMWS, {**subs[2][1], "qtg_id": 1})]
    diffs = table_files.compare_cedt(cedt.build(subs), cedt.build(changed))
    assert any("non-CHBS subtable 0 differs" in d for d in diffs)


def test_cedt_for_boot_modes():
    plain = load("pf-nic")
    assert boot_policy.cedt_for_boot(plain, "auto") is None
    ours = boot_policy.cedt_for_boot(plain, "ours")
    assert decode(acpi.HEADER, ours).values["oem_revision"] == 2
    qtg = dataclasses.replace(plain, windows=(dataclasses.replace(plain.windows[0], qtg_id=1),))
    assert boot_policy.cedt_for_boot(qtg, "auto") is not None
    with pytest.raises(TableError, match="needs our CEDT"):
        boot_policy.cedt_for_boot(qtg, "qemu")


# ------------------------------------------------------------------------------ ACPICA's judgement


@pytest.mark.parametrize("label,kind,data", all_generated_tables(), ids=lambda x: x if isinstance(x, str) else "")
def test_iasl_reads_every_table_we_generate_like_we_do(label, kind, data):
    assert iasl.disagreements(data, kind) == []


def test_iasl_is_a_judge_that_can_disagree():
    raw = _cedt_bytes()
    raw[0x64] = 9
    assert any("Unknown CEDT subtable type" in d for d in iasl.disagreements(_refresh_checksum(raw), "cedt"))


# ------------------------------------------------------------------------------ properties

u = lambda width: st.integers(0, (1 << (8 * width)) - 1)   # noqa: E731

chbs_values = st.fixed_dictionaries({"uid": u(4), "cxl_version": st.sampled_from([0, 1]),
                                     "base": u(8), "register_length": u(8)})
cfmws_values = st.builds(
    lambda base, ways, hbig, restrictions, qtg, uids, size_units: {
        "base_hpa": base * MiB256, "window_size": size_units * MiB256 * ways, "eniw": cedt.ENIW_OF_WAYS[ways],
        "arithmetic": 0, "hbig": hbig, "restrictions": restrictions, "qtg_id": qtg,
        "targets": [{"uid": x} for x in uids[:ways]] + [{"uid": 0}] * (ways - len(uids[:ways]))},
    st.integers(1, 1 << 20), st.sampled_from(sorted(cedt.ENIW_OF_WAYS)), st.integers(0, 6),
    st.integers(0, 0x3F), u(2), st.lists(u(4), min_size=16, max_size=16), st.integers(1, 64))
dslbis_values = st.fixed_dictionaries({"handle": u(1), "data_type": st.integers(0, 5), "base_unit": u(8),
                                       "entry0": u(2), "flags": st.integers(0, 3)})
sslbis_values = st.fixed_dictionaries({
    "data_type": st.integers(0, 5), "base_unit": u(8),
    "entries": st.lists(st.fixed_dictionaries({"port_x": u(2), "port_y": u(2), "value": u(2)}),
                        min_size=1, max_size=8)})


def _without_derived(layout, values):
    return {k: v for k, v in values.items() if k not in ("type", "length")}


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_decode_inverts_encode(data):
    layout, strategy = data.draw(st.sampled_from([(cedt.CHBS, chbs_values), (cedt.CFMWS, cfmws_values),
                                                  (cdat.DSLBIS, dslbis_values), (cdat.SSLBIS, sslbis_values)]))
    values = data.draw(strategy)
    decoded = decode(layout, encode(layout, values))
    assert decoded.violations == []
    got = _without_derived(layout, decoded.values)
    want = {k: v for k, v in values.items()}
    for f in layout.fields:
        if f.default is not None and f.key not in want and f.key not in ("type",):
            want[f.key] = f.default
    if layout.repeat:
        item_defaults = {f.key: f.default for f in layout.repeat.item.fields if f.default is not None}
        want[layout.repeat.key] = [{**item_defaults, **i} for i in want[layout.repeat.key]]
    assert got == want


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_whole_cedt_round_trips(data):
    subs = []
    for _ in range(data.draw(st.integers(0, 6))):
        layout, strategy = data.draw(st.sampled_from([(cedt.CHBS, chbs_values), (cedt.CFMWS, cfmws_values)]))
        subs.append((layout, data.draw(strategy)))
    raw = cedt.build(subs, oem_revision=data.draw(u(4)))
    table = cedt.decode_table(raw)
    assert [s.layout for s in table.subtables] == [layout for layout, _ in subs]
    assert sum(raw) & 0xFF == 0


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash_the_decoders(blob):
    for data in (blob, b"CEDT" + blob):
        for module in (cedt, cdat):
            try:
                table = module.decode_table(data)
                module.dump_table(data)
            except TableError:
                continue
            assert isinstance(table.violations, list)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 200))
def test_truncated_tables_are_reported_not_raised(cut):
    for label, kind, data in all_generated_tables()[:4]:
        part = data[:min(cut, len(data) - 1)]
        module = cedt if kind == "cedt" else cdat
        assert module.decode_table(part).violations, f"{label} cut at {cut} reported nothing"


# ------------------------------------------------------------------------------ CLI


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", *args], capture_output=True,
                          text=True, cwd=cwd)


def test_tables_command_writes_files(tmp_path):
    done = _cli("tables", "electrical-switch", "--out", str(tmp_path / "t"))
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in (tmp_path / "t").iterdir())
    assert names == sorted(["CEDT.dat", "CEDT.txt", "qemu-numa.args", "us0.cdat", "us0.txt"]
                           + [f"mem{i}.{ext}" for i in range(4) for ext in ("cdat", "txt")])
    assert (tmp_path / "t" / "CEDT.dat").read_bytes() == cedt.from_topology(load("electrical-switch"))
    args = (tmp_path / "t" / "qemu-numa.args").read_text()
    assert "acpi-generic-port,id=gp-cxl.1,pci-bus=cxl.1,node=1" in args
    assert "data-type=read-latency,latency=71" in args


def test_decode_command_lists_violations_and_exits_1(tmp_path):
    good = tmp_path / "CEDT.dat"
    good.write_bytes(cedt.from_topology(load("pf-nic")))
    ok = _cli("tables", "decode", str(good))
    assert ok.returncode == 0 and "Violations: 0" in ok.stdout and "CXL Fixed Memory Window" in ok.stdout
    bad = tmp_path / "bad.dat"
    raw = bytearray(good.read_bytes())
    raw[9] ^= 1
    bad.write_bytes(bytes(raw))
    done = _cli("tables", "decode", str(bad))
    assert done.returncode == 1 and "checksum" in done.stdout and "Traceback" not in done.stderr
