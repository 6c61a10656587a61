"""The capture side of fabric timing without QEMU: the plugin builds (and only declares what
QEMU exports), the doorbell address, the QEMU options, and the guest marker header and tools on
regular files. The trace ring's own tests are in test_trace_ring.py."""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile

from pfcxl.device.topology import address_map
from pfcxl.device.topology import data_path
from pfcxl.device import topology
from pfcxl.device.trace import records as tf
from pfcxl.errors import BuildError, PfcxlError, TimingError, VMError
from pfcxl.guest.tool_output import json_lines
from pfcxl.device.trace import ring as trace_ring
from pfcxl.host_tools.timing import config as timing
from pfcxl.host_tools.timing import plugin as timing_plugin

REPO = Path(timing.__file__).resolve().parents[2]   # host_tools/timing/config.py -> the checkout
GUEST_SRC = REPO / "guest" / "src"
QEMU = Path("/usr/bin/qemu-system-x86_64")
MiB = 1 << 20

pytestmark = pytest.mark.component


def dyn_symbols(path: Path) -> dict[str, tuple[str, bool]]:
    """name -> (type, defined) from the dynamic symbol table."""
    with open(path, "rb") as f:
        section = ELFFile(f).get_section_by_name(".dynsym")
        return {s.name: (s["st_info"]["type"], s["st_shndx"] != "SHN_UNDEF") for s in section.iter_symbols()
                if s.name}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PFCXL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ---------------------------------------------------------------------------- plugin build

def test_plugin_builds_into_cache_and_is_reused(cache):
    so = timing_plugin.build_plugin()
    assert so.is_absolute() and so.parent == (cache / "plugin").resolve()
    assert so.name.startswith("pfcxl_plugin-") and so.suffix == ".so"
    syms = dyn_symbols(so)
    assert syms["qemu_plugin_install"] == ("STT_FUNC", True)
    assert syms["qemu_plugin_version"] == ("STT_OBJECT", True)
    mtime = so.stat().st_mtime_ns
    assert timing_plugin.build_plugin() == so and so.stat().st_mtime_ns == mtime


def test_plugin_api_version_and_imports_match_qemu(cache):
    so = timing_plugin.build_plugin()
    with open(so, "rb") as f:
        elf = ELFFile(f)
        sym = elf.get_section_by_name(".dynsym").get_symbol_by_name("qemu_plugin_version")[0]
        section = elf.get_section(sym["st_shndx"])
        offset = sym["st_value"] - section["sh_addr"] + section["sh_offset"]
        f.seek(offset)
        version = struct.unpack("<i", f.read(4))[0]
    assert version == 4                      # QEMU 10.0.2 accepts 2..4
    imported = {n for n, (_, defined) in dyn_symbols(so).items() if n.startswith("qemu_plugin_") and not defined}
    assert "qemu_plugin_update_ns" not in imported and "qemu_plugin_request_time_control" not in imported
    assert QEMU.exists(), f"{QEMU} missing: run 'make setup'"
    exported = {n for n, (_, defined) in dyn_symbols(QEMU).items() if defined}
    assert imported <= exported, f"not exported by QEMU: {sorted(imported - exported)}"


def test_plugin_rebuilds_when_its_source_changes(cache, tmp_path, monkeypatch):
    src = tmp_path / "plugin"
    shutil.copytree(timing_plugin.PLUGIN_DIR, src)
    monkeypatch.setattr(timing_plugin, "PLUGIN_DIR", src)
    first = timing_plugin.build_plugin()
    with open(src / "pfcxl_plugin.c", "a") as f:
        f.write("\n/* changed */\n")
    second = timing_plugin.build_plugin()
    assert second != first and first.exists() and second.exists()


def test_plugin_build_failure_is_a_clear_error(cache, tmp_path, monkeypatch):
    src = tmp_path / "plugin"
    shutil.copytree(timing_plugin.PLUGIN_DIR, src)
    (src / "pfcxl_plugin.c").write_text("int broken(void) { return }\n")
    monkeypatch.setattr(timing_plugin, "PLUGIN_DIR", src)
    with pytest.raises(BuildError, match="compiling pfcxl_plugin.c: gcc exited with status 1") as raised:
        timing_plugin.build_plugin()
    assert "pfcxl_plugin.c:1" in str(raised.value)          # gcc's own message comes with it
    assert BuildError.exit_code != VMError.exit_code         # a compiler failure is not "QEMU failed"
    assert not list((cache / "plugin").iterdir())             # nothing half-built left behind


def run_qemu_with_plugin(options: str, log: Path, seconds: float) -> subprocess.CompletedProcess:
    """QEMU with no machine: it loads the plugin (qemu_plugin_install runs) and then idles."""
    so = timing_plugin.build_plugin()
    cmd = [str(QEMU), "-M", "none", "-accel", "tcg", "-display", "none", "-plugin", f"{so},{options}",
           "-d", "plugin", "-D", str(log)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.terminate()          # QEMU runs its atexit callbacks on SIGTERM
        out, err = proc.communicate(timeout=10)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_plugin_loads_into_this_qemu(cache, tmp_path):
    log = tmp_path / "plugin.log"
    run_qemu_with_plugin("mode=inject,read_ns=283:833,baseline_ns=100,doorbell=0x28fffffc0", log, 3)
    events = json_lines(log.read_text(), '{"event"')      # strict: a broken line fails the test
    start = events[0]
    assert start["event"] == "start" and start["api"][0] <= 4 <= start["api"][1]
    assert start["doorbell"] == "0x28fffffc0" and start["tsc_per_ns"] > 0
    assert [p["read_ns"] for p in start["profiles"]] == [283, 833]
    # spin = modelled - baseline, to within the TSC calibration
    assert [round(p["read_spin_ns"]) for p in start["profiles"]] == pytest.approx([183, 733], abs=2)
    assert events[-1]["event"] == "exit" and events[-1]["reads"] == 0


@pytest.mark.parametrize("options, message", [
    ("mode=bogus", "use count, trace or inject"),
    ("mode=trace", "needs ring=PATH"),
    ("mode=trace,ring=/nonexistent/ring", "cannot open ring"),
    ("mode=count,doorbell=0x41", "not 64-byte aligned"),
    ("mode=inject,read_ns=1:2,write_ns=1:2:3", "different numbers of profiles"),
    ("mode=inject,read_ns=-5", "non-negative"),
    ("mode=count,speed=9", "unknown argument 'speed'"),
    ("mode=count,direct=0x100000000", "give BASE:SIZE"),
    ("mode=count,direct=0x100000000:0", "empty or wrapping range"),
    ("mode=count,direct=0x1:zz", "direct=zz is not a number"),
])
def test_plugin_refuses_bad_arguments(cache, tmp_path, options, message):
    done = run_qemu_with_plugin(options, tmp_path / "plugin.log", 20)
    assert done.returncode != 0
    assert message in done.stderr and "Could not load plugin" in done.stderr


# ---------------------------------------------------------------------------- doorbell, options

@pytest.mark.parametrize("name", ["pf-nic", "two-hb-interleave", "electrical-switch"])
def test_doorbell_is_the_last_line_of_the_first_dax_device(name):
    topo = topology.load(topology.resolve(name))
    dax = address_map.dax_placements(topo)[0]
    window = address_map.window_placements(topo)[0]
    hpa = timing_plugin.doorbell_hpa(topo)
    assert hpa == dax.base + dax.size - 64
    assert hpa % 64 == 0
    assert window.base <= dax.base <= hpa < dax.base + dax.size <= window.base + window.size


@pytest.mark.parametrize("name", [p.stem for p in topology.shipped_topologies()])
def test_doorbell_skips_system_ram_regions_whatever_their_order(name):
    """A system-ram region's memory is the kernel's (no /dev/daxN.0 for pfcxl_mark, pages the
    allocator hands out): the doorbell is the last line of the first devdax region, in every
    assignment of modes to the topology's volatile regions; with none left, one line says so."""
    topo = topology.load(topology.resolve(name))
    volatile = [i for i, r in enumerate(topo.regions) if r.kind == "volatile"]
    for ram in itertools.chain.from_iterable(itertools.combinations(volatile, k) for k in range(len(volatile) + 1)):
        modes = ["system-ram" if i in ram else "devdax" for i in range(len(topo.regions))]
        varied = dataclasses.replace(topo, regions=tuple(dataclasses.replace(r, mode=m)
                                                         for r, m in zip(topo.regions, modes)))
        placements = address_map.dax_placements(varied)
        devdax = [p for p, m in zip(placements, modes) if m == "devdax"]
        if devdax:
            assert timing_plugin.doorbell_hpa(varied) == devdax[0].base + devdax[0].size - 64, (name, modes)
        else:
            with pytest.raises(TimingError, match="has no devdax region"):
                timing_plugin.doorbell_hpa(varied)


def test_pf_nic_doorbell_value():
    # pf-nic: 1 GiB RAM, maxmem 2 GiB, 4 slots -> CXL base 4 + 1 + 4 GiB = 0x2_4000_0000, window
    # at 0x2_5000_0000, one 1 GiB region from its start: the last line is 0x2_8fff_ffc0.
    assert timing_plugin.doorbell_hpa(topology.load(topology.resolve("pf-nic"))) == 0x2_8FFF_FFC0


def test_direct_path_doorbells_and_windows():
    """With a direct path the plugin gets each direct device's window and doorbell (its NVDIMM's
    last line; pf-nic's NVDIMM is 1 GiB at the 4 GiB hotplug base) after the CXL one, if any."""
    pf_nic = topology.load(topology.resolve("pf-nic"))
    both, direct = (data_path.with_data_path(pf_nic, p) for p in ("both", "direct"))
    assert timing_plugin.doorbell_hpas(both) == [0x2_8FFF_FFC0, 0x1_3FFF_FFC0]
    assert timing_plugin.doorbell_hpa(direct) == 0x1_3FFF_FFC0
    opts = timing.plugin_args(Path("/p.so"), both, Path("/r"), timing.TimingConfig("count"))[1].split(",")
    assert opts[1:] == ["mode=count", "doorbell=0x28fffffc0", "doorbell=0x13fffffc0", "direct=0x100000000:0x40000000"]
    assert not any(o.startswith("direct=") for o in timing.plugin_args(
        Path("/p.so"), pf_nic, Path("/r"), timing.TimingConfig("count"))[1].split(","))


def test_qemu_args(cache, tmp_path):
    topo = topology.load(topology.resolve("pf-nic"))
    run = tmp_path / "a,b"                     # a comma in the path must be doubled for QEMU
    with timing.TimingSession(topo, run, timing.TimingConfig("trace", capacity=64)) as s:
        args = s.qemu_args()
        assert args[0] == "-plugin" and args[2:4] == ["-d", "plugin"] and args[4] == "-D"
        opts = args[1].replace(",,", "\0").split(",")
        assert opts[0].replace("\0", ",") == str(timing_plugin.build_plugin())
        assert "mode=trace" in opts and "doorbell=0x28fffffc0" in opts
        ring_opt = next(o for o in opts if o.startswith("ring="))
        assert ring_opt.replace("\0", ",") == f"ring={(run / 'guest.ring').resolve()}"
        assert trace_ring.Ring.open(run / "guest.ring").capacity == 64
    cfg = timing.TimingConfig("inject", read_ns=(283, 833), write_ns=224, baseline_ns=300.5, doorbell=False)
    with timing.TimingSession(topo, tmp_path / "i", cfg) as s:
        opts = s.qemu_args()[1].split(",")[1:]
        assert opts == ["mode=inject", "read_ns=283:833", "write_ns=224", "baseline_ns=300.5"]
        assert s.ring is None and s.stop() is None


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "fast"}, "not one of count, trace, inject"),
    ({"mode": "inject", "read_ns": -1}, "read_ns"),
    ({"mode": "inject", "read_ns": tuple(range(9))}, "read_ns"),
    ({"mode": "inject", "read_ns": (1, 2), "write_ns": (1, 2, 3)}, "profiles"),
])
def test_config_rejects(kwargs, match):
    with pytest.raises(timing.TimingError, match=match):
        timing.TimingConfig(**kwargs)


def test_session_reads_the_plugins_json_lines(cache, tmp_path):
    topo = topology.load(topology.resolve("pf-nic"))
    with timing.TimingSession(topo, tmp_path, timing.TimingConfig("count")) as s:
        s.log.write_text('{"event":"start","mode":"count"}\nnoise from QEMU\n'
                         '{"event":"phase","phase":1,"reads":3}\n{"event":"phase","pha')
        assert [e["event"] for e in s.events()] == ["start", "phase"]
        assert s.wait_phases(1, timeout=0)[0]["reads"] == 3
        with pytest.raises(timing.TimingError, match="reported 1 phases, expected 2"):
            s.wait_phases(2, timeout=0.1)


def test_a_traced_runs_rows_are_cut_by_its_phases_and_a_row_more_fails(cache, tmp_path):
    """TracedRun.rows(n, timeout): the records of each of the run's n phases; a row more than the
    plugin reported fails once `timeout` has passed (0 for a run that is over: its phases are in)."""
    from pfcxl.host_tools.timing.traced_run import TracedRun
    from pfcxl.host_tools.vm.host import Result
    topo = topology.load(topology.resolve("pf-nic"))
    with timing.TimingSession(topo, tmp_path, timing.TimingConfig("count")) as s:
        s.log.write_text('{"event":"start","mode":"count"}\n{"event":"phase","phase":1,"reads":9,"writes":0}\n'
                         '{"event":"phase","phase":2,"reads":2,"writes":1}\n{"event":"phase","phase":3,"reads":1,"writes":1}\n')
        records = np.zeros(5, dtype=tf.RECORD_FIELDS)
        records["insn"] = np.arange(5)
        traced = TracedRun(Result(0, b""), 0.0, records, [], "guest", session=s, first_phase=1)   # phase 1 ran before
        pieces = traced.rows(2, timeout=0)
        assert [p["insn"].tolist() for p in pieces] == [[0, 1, 2], [3, 4]]
        with pytest.raises(TimingError, match="reported 3 phases, expected 4"):
            traced.rows(3, timeout=0)


def test_a_traced_runs_report_is_the_model_with_the_emulators_cost_labelled_beside_it():
    """TracedRun.report: what `pfcxl run --timing trace` prints, the models' figures for exactly
    these records and the command's wall-clock per request, labelled as the emulator's."""
    from pfcxl.host_tools.timing.traced_run import TracedRun
    from pfcxl.host_tools.vm.host import Result
    topo = topology.load(topology.resolve("pf-nic"))
    records = np.zeros(64, dtype=tf.RECORD_FIELDS)
    records["insn"] = np.arange(64) * 10
    records["hpa"] = address_map.window_placements(topo)[0].base + np.arange(64) * 64
    traced = TracedRun(Result(0, b""), 2.0, records, [], "guest", topo)
    report = traced.report()
    assert {k: v for k, v in report.items() if k != "emulator"} == traced.model()
    assert report["requests"] == 64
    assert report["emulator"]["ns_per_request"] == 2.0e9 / 64 and "not a fabric figure" in report["emulator"]["what"]
    with pytest.raises(PfcxlError, match="only a trace-mode run has records"):
        TracedRun(Result(0, b""), 1.0, None, [], "guest", topo).report()


# ---------------------------------------------------------------------------- guest side on files

@pytest.fixture(scope="module")
def tools(tmp_path_factory) -> dict[str, Path]:
    """The guest tools, compiled as the image builder does."""
    out = tmp_path_factory.mktemp("tools")
    built = {}
    for name in ("pfcxl_mark", "cxl_touch", "chase"):
        cmd = ["gcc", "-static", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(out / name),
               str(GUEST_SRC / f"{name}.c")]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        built[name] = out / name
    return built


@pytest.fixture
def dax(tmp_path) -> Path:
    path = tmp_path / "dax.img"
    with open(path, "wb") as f:
        f.truncate(8 * MiB)
    return path


def word_at(path: Path, offset: int) -> int:
    with open(path, "rb") as f:
        f.seek(offset)
        return struct.unpack("<Q", f.read(8))[0]


def test_pfcxl_mark_stores_into_the_last_line(tools, dax):
    for args, value in ((["start"], 1), (["stop"], 2), (["profile", "3"], 0x103)):
        out = subprocess.run([tools["pfcxl_mark"], *args, "--dax", dax], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["value"] == value
        assert word_at(dax, 8 * MiB - 64) == value
    assert dax.read_bytes()[: 8 * MiB - 64] == bytes(8 * MiB - 64)   # nothing else touched
    bad = subprocess.run([tools["pfcxl_mark"], "begin"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


def touch_lines(seed: int, lines: int, n: int) -> list[int]:
    """cxl_touch's line choice, mirrored: (a*i + b) mod lines from splitmix64(seed)."""
    mask = (1 << 64) - 1
    x = seed

    def splitmix() -> int:
        nonlocal x
        x = (x + 0x9E3779B97F4A7C15) & mask
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    import math
    a = (splitmix() % lines) | 1
    b = splitmix() % lines
    while math.gcd(a, lines) != 1:
        a += 2
    return [(a * i + b) % lines for i in range(n)]


def test_cxl_touch_touches_distinct_lines_and_never_the_doorbell(tools, dax):
    out = subprocess.run([tools["cxl_touch"], "--dax", dax, "--reads", "300", "--writes", "200",
                          "--seed", "9", "--span", "4M"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert (res["reads"], res["writes"], res["marked"]) == (300, 200, True)
    chosen = touch_lines(9, 4 * MiB // 64, 500)
    assert len(set(chosen)) == 500
    assert res["read_offsets_sum"] == 64 * sum(chosen[:300])
    assert res["write_offsets_sum"] == 64 * sum(chosen[300:])
    data = np.fromfile(dax, "<u8")
    written = set(np.nonzero(data)[0].tolist())
    doorbell_word = (8 * MiB - 64) // 8
    assert written == {64 * line // 8 for line in chosen[300:]} | {doorbell_word}
    assert data[doorbell_word] == 2                  # stop was the last mark
    # the span may not reach the doorbell's 2 MiB window
    bad = subprocess.run([tools["cxl_touch"], "--dax", dax, "--span", "8M"], capture_output=True, text=True)
    assert bad.returncode == 2 and "minus 2 MiB" in bad.stderr


def test_chase_walks_one_cycle(tools, dax):
    def chase(loads: int, *extra: str) -> dict:
        out = subprocess.run([tools["chase"], "--dax", dax, "--lines", "64", "--span", "2M",
                              "--loads", str(loads), "--seed", "5", *extra], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    start = chase(0)["end"]
    assert chase(64)["end"] == start                 # one cycle through all 64 lines
    assert chase(63)["end"] != start
    assert chase(1000, "--profile", "1")["ns_per_load"] > 0
    assert word_at(dax, 8 * MiB - 64) == 2           # the profile mark, then start, then stop
    local = subprocess.run([tools["chase"], "--local", "--loads", "1000"], capture_output=True, text=True)
    assert local.returncode == 0 and json.loads(local.stdout)["where"] == "local"


def test_every_dax_device_has_a_doorbell_so_a_program_on_any_of_them_can_mark():
    """pf-appliance gives each host a shared region (dax0.0) and a private one (dax1.0): a chase on
    dax1.0 rang a doorbell the plugin did not know, so its --cold emptied no cache and its loads
    hit (8 ns, not the fabric's 283). Every devdax device's last line is a doorbell, the first
    first; the plugin takes at most its MAX_DOORBELLS."""
    topo = topology.load(topology.resolve("pf-appliance"))
    devdax = [p for p, r in zip(address_map.dax_placements(topo), topo.regions) if r.mode != "system-ram"]
    assert len(devdax) == 2
    assert timing_plugin.doorbell_hpas(topo) == [p.base + p.size - 64 for p in devdax]
    plugin_c = (Path(timing_plugin.__file__).resolve().parents[2] / "device/plugin/pfcxl_plugin.c").read_text()
    assert f"#define MAX_DOORBELLS {timing_plugin.MAX_DOORBELLS}\n" in plugin_c
    many = dataclasses.replace(topo, regions=topo.regions * 20)
    assert len(timing_plugin.doorbell_hpas(many)) <= timing_plugin.MAX_DOORBELLS
