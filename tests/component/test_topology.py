"""Topology loading and validation: shipped files load, every mistake gets its own clear line."""

import copy
import dataclasses
import tomllib

import pytest

from pfcxl.device.topology import address_map
from pfcxl.device import topology
from pfcxl.device.topology.units import GiB, KiB, MiB, parse_size
from pfcxl.errors import TopologyError

from . import bounded_cli

pytestmark = pytest.mark.component


def shipped_doc(name: str) -> dict:
    return tomllib.loads(topology.resolve(name).read_text())


def test_shipped_topologies_load_with_expected_shape():
    names = {p.stem for p in topology.shipped_topologies()}
    assert {"pf-nic", "two-hb-interleave", "electrical-switch"} <= names

    pf = topology.load(topology.resolve("pf-nic"))
    assert [d.id for d in pf.devices] == ["pfnic0"] and len(pf.host_bridges) == 1
    assert pf.regions[0].ways == 1 and pf.regions[0].size == pf.devices[0].volatile

    two = topology.load(topology.resolve("two-hb-interleave"))
    assert two.windows[0].ways == 2 and two.windows[0].granularity == 8 * KiB
    assert two.regions[0].devices == ("mem-a", "mem-b") and two.regions[0].size == 1 * GiB

    sw = topology.load(topology.resolve("electrical-switch"))
    assert len(sw.switches) == 1 and len(sw.switches[0].downstream) == 4
    assert sw.regions[0].ways == 4 and all(sw.host_bridge_of(d.id) == "cxl.1" for d in sw.devices)


def test_topology_is_immutable():
    topo = topology.load(topology.resolve("pf-nic"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        topo.name = "other"  # type: ignore[misc]


def test_default_and_unknown_names():
    assert topology.resolve(None).stem == "pf-nic"
    with pytest.raises(TopologyError, match="no topology named 'nope'.*pf-nic"):
        topology.resolve("nope")


@pytest.mark.parametrize("text,value", [("256M", 256 * MiB), ("8KiB", 8 * KiB), ("4G", 4 * GiB),
                                        ("0x1000", 4096), ("4_096", 4096), ("1gib", GiB)])
def test_parse_size(text, value):
    assert parse_size(text) == value


def _mutate(base: str, change) -> dict:
    doc = copy.deepcopy(shipped_doc(base))
    change(doc)
    return doc


# (name, base topology, mutation, text the single error line must contain)
MISTAKES = [
    ("bus_nr collision", "two-hb-interleave", lambda d: d["host_bridge"][1].update(bus_nr=12),
     "host_bridge 'cxl.2'.bus_nr: 12 collides with host_bridge 'cxl.1'"),
    ("chassis/slot collision", "two-hb-interleave", lambda d: d["root_port"][1].update(slot=2),
     "root_port 'rp1': chassis 0 slot 2 collides with 'rp0'"),
    ("id collision", "two-hb-interleave", lambda d: d["device"][1].update(id="mem-a"),
     "id collides with device 'mem-a'"),
    ("window size not multiple of 256M x ways", "two-hb-interleave",
     lambda d: d["window"][0].update(size="768M"),
     "window 'fmw0'.size: 768 MiB is not a multiple of 256 MiB x 2 ways (512 MiB)"),
    ("ways outside set", "electrical-switch", lambda d: (
        d["switch"][0]["downstream"].append({"id": "swport4", "port": 4, "chassis": 0, "slot": 8}),
        d["device"].append({"id": "mem4", "port": "swport4", "volatile": "256M", "serial": 99}),
        d["region"][0].update(devices=["mem0", "mem1", "mem2", "mem3", "mem4"])),
     "region[0].devices: 5 devices means 5-way interleave; ways must be one of 1, 2, 3, 4, 6, 8, 12, 16"),
    ("granularity not power of two", "two-hb-interleave", lambda d: d["window"][0].update(granularity=3000),
     "window 'fmw0'.granularity: 3000 must be a power of two from 256 to 16K bytes"),
    ("granularity too large", "two-hb-interleave", lambda d: d["window"][0].update(granularity="32K"),
     "window 'fmw0'.granularity: 32768 must be a power of two from 256 to 16K bytes"),
    ("more than 16 targets", "pf-nic", lambda d: d["window"][0].update(targets=["cxl.1"] * 17, size="17G"),
     "window 'fmw0'.targets: 17 targets: a window has at most 16"),
    ("capacity larger than the window", "pf-nic", lambda d: d["window"][0].update(size="512M"),
     "region[0].size: regions in window 'fmw0' need 1 GiB, more than the window's 512 MiB"),
    ("region in wrong target order", "two-hb-interleave",
     lambda d: d["region"][0].update(devices=["mem-b", "mem-a"]),
     "position 0 is device 'mem-b' under host bridge 'cxl.2', but window 'fmw0' routes position 0 to 'cxl.1'"),
    ("region device unknown", "pf-nic", lambda d: d["region"][0].update(devices=["ghost"]),
     "region[0].devices: 'ghost' is not a device id"),
    ("region granularity differs from interleaved window", "two-hb-interleave",
     lambda d: d["region"][0].update(granularity="4K"),
     "region[0].granularity: 4096 must equal window 'fmw0' granularity 8192"),
    ("unknown key", "pf-nic", lambda d: d["device"][0].update(capacity="1G"),
     "device 'pfnic0': unknown key 'capacity'"),
    ("unknown section", "pf-nic", lambda d: d.update(hosts=[{"id": "x"}]), "unknown section 'hosts'"),
    ("wrong type", "pf-nic", lambda d: d["host_bridge"][0].update(bus_nr="twelve"),
     "host_bridge 'cxl.1'.bus_nr: must be an integer, got str 'twelve'"),
    ("bad size string", "pf-nic", lambda d: d["device"][0].update(volatile="lots"),
     "device 'pfnic0'.volatile: 'lots' is not a size"),
    ("device capacity not 256M multiple", "pf-nic", lambda d: d["device"][0].update(volatile="100M"),
     "device 'pfnic0'.volatile: 104857600 bytes is not a positive multiple of 256 MiB"),
    ("missing key", "pf-nic", lambda d: d["root_port"][0].pop("slot"), "root_port 'rp0': missing required key 'slot'"),
    ("dangling reference", "pf-nic", lambda d: d["device"][0].update(port="rp9"),
     "device 'pfnic0'.port: 'rp9' is not a root_port or switch downstream port id"),
    ("maxmem below memory", "pf-nic", lambda d: d["guest"].update(maxmem="512M"),
     "guest.maxmem: 512 MiB must not be below guest.memory (1 GiB)"),
    ("serial collision", "two-hb-interleave", lambda d: d["device"][1].update(serial=d["device"][0]["serial"]),
     "collides with device 'mem-a'"),
    ("reserved id prefix", "pf-nic", lambda d: d["device"][0].update(id="backend-x") or
     d["region"][0].update(devices=["backend-x"]), "reserved for the memory backends"),
]


@pytest.mark.parametrize("name,base,change,expected", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_mistake_is_one_clear_line(name, base, change, expected):
    with pytest.raises(TopologyError) as info:
        topology.from_dict(_mutate(base, change), source="t.toml")
    lines = str(info.value).splitlines()
    assert any(expected in line for line in lines), lines
    # exactly one line per mistake, each prefixed by the file, none empty
    assert len(lines) == 1, lines
    assert lines[0].startswith("t.toml: ")


def test_three_way_region_is_valid():
    doc = _mutate("electrical-switch", lambda d: d["region"][0].update(devices=["mem0", "mem1", "mem2"]))
    topo = topology.from_dict(doc)
    assert topo.regions[0].ways == 3 and topo.regions[0].size == 3 * 256 * MiB


def test_several_mistakes_are_all_reported():
    def break_three(d):
        d["host_bridge"][1]["bus_nr"] = 12
        d["window"][0]["granularity"] = 100
        d["device"][0]["serial"] = "x"
    with pytest.raises(TopologyError) as info:
        topology.from_dict(_mutate("two-hb-interleave", break_three), source="t.toml")
    # type errors are found first; the structural rules then run on a well-typed file
    assert "device 'mem-a'.serial: must be an integer" in str(info.value)
    d = _mutate("two-hb-interleave", lambda d: (d["host_bridge"][1].update(bus_nr=12),
                                                d["window"][0].update(granularity=100)))
    with pytest.raises(TopologyError) as info:
        topology.from_dict(d, source="t.toml")
    lines = str(info.value).splitlines()
    assert len(lines) == 2 and "bus_nr" in lines[0] and "granularity" in lines[1]


def test_invalid_toml_is_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[device]\nid = 1\n")
    with pytest.raises(TopologyError, match=r"^bad.toml: not valid TOML"):
        topology.load(bad)


def test_cli_rejects_bad_topology_without_traceback(cli_mistakes):
    done, _ = cli_mistakes["granularity 6K"]
    assert done.rc == 2
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == ["pfcxl: error: bad.toml: window 'fmw0'.granularity: 6144 must be a power of two "
                     "from 256 to 16K bytes"]


# ---------------------------------------------------------------- address map predictions


def _with_guest(memory: str, maxmem: str, slots: int) -> topology.Topology:
    doc = shipped_doc("pf-nic")
    doc["guest"].update(memory=memory, maxmem=maxmem, slots=slots)
    return topology.from_dict(doc)


def test_cxl_base_follows_q35_layout():
    # Figures from QEMU's q35 layout (docs/notes/qemu-10-facts.md).
    assert address_map.cxl_base(_with_guest("4G", "8G", 8)) == 0x4_8000_0000
    assert address_map.cxl_base(_with_guest("1G", "2G", 4)) == 0x2_4000_0000


def test_windows_pack_from_above_chbs():
    doc = shipped_doc("two-hb-interleave")
    doc["window"].append({"id": "fmw1", "size": "1G", "targets": ["cxl.2"]})
    topo = topology.from_dict(doc)
    chbs = address_map.chbs_bases(topo)
    base = address_map.cxl_base(topo)
    assert chbs == {"cxl.1": base + 0x10000, "cxl.2": base}
    w0, w1 = address_map.window_placements(topo)
    assert w0.base == base + 256 * MiB and w0.base % (256 * MiB) == 0
    assert w1.base == w0.base + 4 * GiB and (w0.name, w1.name) == ("decoder0.0", "decoder0.1")


def test_locate_two_way_interleave():
    topo = topology.load(topology.resolve("two-hb-interleave"))
    region = topo.regions[0]
    g = region.granularity
    assert address_map.locate(topo, region, 0) == ("mem-a", 0)
    assert address_map.locate(topo, region, g) == ("mem-b", 0)
    assert address_map.locate(topo, region, 2 * g + 5) == ("mem-a", g + 5)
    assert address_map.locate(topo, region, 3 * g + g - 1) == ("mem-b", 2 * g - 1)
    with pytest.raises(ValueError):
        address_map.locate(topo, region, region.size)


def test_locate_covers_every_device_byte_once():
    topo = topology.load(topology.resolve("electrical-switch"))
    region = topo.regions[0]
    seen = set()
    for off in range(0, 64 * region.granularity, region.granularity):
        seen.add(address_map.locate(topo, region, off))
    assert len(seen) == 64
    assert {dev for dev, _ in seen} == set(region.devices)


CLI_MISTAKES = MISTAKES[:8] + MISTAKES[12:16]


@pytest.fixture(scope="module")
def cli_mistakes(tmp_path_factory) -> dict:
    """`pfcxl run --topology bad.toml -- true` for each CLI mistake (and a granularity of 6K), all in one
    child process (bounded_cli: the CLI's imports paid once); each in its own directory with its own
    --run-dir. name -> (outcome, run dir)."""
    texts = {name: _to_toml(_mutate(base, change)) for name, base, change, _ in CLI_MISTAKES}
    texts["granularity 6K"] = topology.resolve("two-hb-interleave").read_text().replace('granularity = "8K"',
                                                                                       'granularity = "6K"')
    cases, runs = [], {}
    for i, (name, text) in enumerate(texts.items()):
        where = tmp_path_factory.mktemp(f"mistake{i}")
        (where / "bad.toml").write_text(text)
        runs[name] = where / "run"
        cases.append(["run", "--topology", str(where / "bad.toml"), "--run-dir", str(runs[name]), "--", "true"])
    return {name: (done, runs[name]) for name, done in zip(texts, bounded_cli.run(cases, limit=1 << 30))}


@pytest.mark.parametrize("name,base,change,expected", CLI_MISTAKES, ids=[m[0] for m in CLI_MISTAKES])
def test_cli_gives_one_line_per_mistake_and_boots_nothing(cli_mistakes, name, base, change, expected):
    done, run_dir = cli_mistakes[name]
    assert done.rc == 2, (done.rc, done.stderr)
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("pfcxl: error: bad.toml: ") and expected in lines[0], lines
    assert not list(run_dir.glob("*.mem")), "a backing file was created for a rejected topology"


def _to_toml(doc: dict) -> str:
    """A small TOML writer for the shapes topology files use (tables, arrays of tables, scalars)."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return str(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        raise TypeError(type(v))
    out = [f"{k} = {value(v)}" for k, v in doc.items() if not isinstance(v, (dict, list)) or
           (isinstance(v, list) and not all(isinstance(x, dict) for x in v))]
    for k, v in doc.items():
        if isinstance(v, dict):
            out.append(f"[{k}]")
            out += [f"{kk} = {value(vv)}" for kk, vv in v.items()]
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for item in v:
                out.append(f"[[{k}]]")
                out += [f"{kk} = {value(vv)}" for kk, vv in item.items()]
    return "\n".join(out) + "\n"


def test_relative_topology_paths_resolve_from_any_directory(tmp_path, monkeypatch):
    """The documented `tests/data/topologies/X.toml` paths: found from any directory (the checkout's
    file), while a file of that relative path in the current directory comes first."""
    data = sorted(topology.SOURCE_ROOT.glob("tests/data/topologies/*.toml"))
    assert data
    monkeypatch.chdir(tmp_path)
    for path in data:
        relative = path.relative_to(topology.SOURCE_ROOT)
        assert topology.resolve(str(relative)).resolve() == path.resolve()
        assert topology.load(topology.resolve(str(relative))).name
    mine = tmp_path / "tests/data/topologies" / data[0].name
    mine.parent.mkdir(parents=True)
    mine.write_text(data[0].read_text())
    assert topology.resolve(str(mine.relative_to(tmp_path))).resolve() == mine.resolve()
