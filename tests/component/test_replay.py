"""Replay at a chosen offered load (device/fabric/replay.py, `pfcxl model replay`): streams keep
their accesses and order; at load 1.0 every PF port carries its 25.6 GB/s while the electrical
pool's shared switch link is the limit."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pfcxl.device.topology import address_map
from pfcxl.device.fabric import constants as fc
from pfcxl.device.fabric import model as fm
from pfcxl.device.fabric import replay as fr
from pfcxl.device.fabric import workloads as wl
from pfcxl.device import topology
from pfcxl.host_tools.timing import model_runs

TOPO = topology.load(topology.resolve("pf-appliance"))
APP = TOPO.appliance
BASE = address_map.dax_placements(TOPO)[0].base
PORT_GBS = fc.PF_PORT_BANDWIDTH_MBS / 1000

pytestmark = pytest.mark.component


def captured(hosts=4, size=64, n=20_000, linear=True, write=False):
    """A stream the way a guest's capture looks: host h to module h, gaps of a few instructions."""
    tr = wl.stream(APP, hosts, size, n, write=write, linear=linear, base_hpa=BASE)
    rng = np.random.default_rng(size)
    tr["insn"] = np.tile(np.cumsum(rng.integers(50, 150, n)), hosts)
    return tr


def test_respace_keeps_each_stream_and_sets_its_rate():
    tr = captured(hosts=2, n=1000)
    tr["write"][::3] = 1
    for load in (0.25, 1.0):
        out = fr.respace(tr, load=load)
        for field in ("hpa", "size", "write", "host", "vcpu"):
            assert np.array_equal(out[field], tr[field])
        for h in range(2):
            mine = out[tr["host"] == h]
            assert np.all(np.diff(mine["insn"].astype(np.int64)) >= 0)          # order kept
            span_ps = int(mine["insn"][-1] - mine["insn"][0])
            expect = (mine["size"].sum() - mine["size"][-1]) / (load * PORT_GBS) * 1000
            assert abs(span_ps - expect) <= 1
    gaps = np.diff(tr["insn"][:1000].astype(np.int64))
    assert np.array_equal(np.diff(fr.respace(tr, dilate=3.0)["insn"][:1000].astype(np.int64)), 3 * gaps * 1000)   # ps
    with pytest.raises(ValueError, match="load -1: must be positive"):
        fr.respace(tr, load=-1)


@pytest.mark.parametrize("linear", [True, False], ids=["linear", "random"])
@pytest.mark.parametrize("size", [32, 64, 128, 256, 512, 1024])
def test_pf_ports_hold_25_6_gbs_at_full_load(size, linear):
    # each host streams to its own module at load 1.0: every port is the limit, at 100%
    tr = captured(size=size, n=max(20_000, 4_000_000 // size // 4), linear=linear)
    r = fr.replay(fm.pf_appliance(APP, cache=False), tr, base_hpa=BASE, granularity=APP.granularity, load=1.0)
    ports = fr.port_rates(r)["port_up"]
    assert len(ports["queues"]) == 4
    for gbs, util in zip(ports["gbs"], ports["utilisation"]):
        assert abs(gbs - PORT_GBS) <= 0.02 * PORT_GBS and util >= 0.98
    el = fr.replay(fm.electrical_pool(APP.ports, APP.modules), tr, base_hpa=BASE, granularity=APP.granularity,
                   load=1.0)
    switch = fr.port_rates(el)["switch_link_up"]        # 4 hosts behind one switch link
    assert switch["utilisation"] == [pytest.approx(1.0, abs=0.02)]
    assert max(fr.port_rates(el)["device_link_up"]["gbs"]) < 0.65 * PORT_GBS


def test_the_electrical_knee_lies_where_the_switch_link_fills():
    # 4 hosts share one 64 GB/s switch link: below 64/4/25.6 = 0.625 ports each, latency stays
    # near idle; above it, the queue grows with the run
    tr = captured(n=10_000)
    model = fm.electrical_pool(APP.ports, APP.modules)
    p50 = {load: fr.replay(model, tr, base_hpa=BASE, granularity=APP.granularity, load=load).percentiles("read")["p50"]
           for load in (0.3, 0.55, 0.7, 1.0)}
    idle = model.idle_ns(False)
    assert p50[0.3] < idle + 20 and p50[0.55] < idle + 50
    assert p50[0.7] > 3 * idle and p50[1.0] > 2 * p50[0.7]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", "model", "replay", *args],
                          capture_output=True, text=True, timeout=120)


def test_the_command_replays_a_saved_trace_and_refuses_bad_files(tmp_path):
    path = tmp_path / "trace.npy"
    model_runs.save_trace(path, captured(n=5000))
    done = cli(str(path), "--system", "pf", "--load", "1", "-t", "pf-appliance", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["system"] == "modelled PF appliance (DDR5 path)" and report["requests"] == 20_000
    assert all(abs(g - PORT_GBS) < 0.03 * PORT_GBS for g in report["ports"]["port_up"]["gbs"])
    np.save(tmp_path / "other.npy", np.zeros(3))
    os.mkfifo(tmp_path / "fifo.npy")
    for bad, line in ((tmp_path / "missing.npy", "missing.npy: cannot read a trace"),
                      (tmp_path / "other.npy", "other.npy: holds float64, not trace records"),
                      (tmp_path / "fifo.npy", "fifo.npy: cannot read a trace: a FIFO, not a regular file"),
                      (Path("/dev/zero"), "/dev/zero: cannot read a trace: a character device, not a regular")):
        done = cli(str(bad), "--load", "1")
        assert done.returncode == 9 and line in done.stderr and "Traceback" not in done.stderr
    low = captured(n=50)
    low["hpa"] = np.arange(len(low)) * 64            # below every CXL window: not this topology's traffic
    model_runs.save_trace(tmp_path / "low.npy", low)
    done = cli(str(tmp_path / "low.npy"), "--load", "1")
    assert done.returncode == 9 and "record 0: hpa 0x0 is not inside the CXL window" in done.stderr, done.stderr


def streams(same_module: bool, hosts=2):
    """`hosts` hosts streaming 64-B reads, to module 0 or each to its own module."""
    return wl.stream(APP, hosts, 64, 20_000, write=False, linear=True, base_hpa=BASE,
                     module_of_host=(lambda h: 0) if same_module else (lambda h: h))


def test_two_hosts_on_one_module_against_two_modules():
    pf = fm.pf_appliance(APP, cache=False, jitter=False)
    el = fm.electrical_pool(APP.ports, APP.modules, jitter=False)
    load = 0.9

    def play(model, tr):
        return fr.replay(model, tr, base_hpa=BASE, granularity=APP.granularity, load=load)

    run = {(m.name, same): play(m, streams(same)) for m in (pf, el) for same in (True, False)}
    alone = {m.name: play(m, streams(False, hosts=1)) for m in (pf, el)}
    p50 = {k: r.percentiles("read")["p50"] for k, r in run.items()}
    p99 = {k: r.percentiles("read")["p99"] for k, r in run.items()}
    # PF: every host has its own port to every module, and a module's DDR5 (409.6 GB/s) outruns
    # two ports: a port carries one host (90%), and sharing the module adds under 0.2 ns
    for same in (True, False):
        assert run[(pf.name, same)].stages["port_up"].utilisation.max() == pytest.approx(load, abs=0.01)
    assert p50[(pf.name, False)] == p99[(pf.name, False)] == alone[pf.name].percentiles("read")["p99"] == 283
    assert 0 <= p99[(pf.name, True)] - p99[(pf.name, False)] < 0.2
    # electrical: the two hosts share their switch's 64 GB/s link in both cases (it carries both
    # streams, and each access waits there behind the other host's) ...
    for same in (True, False):
        assert run[(el.name, same)].stages["switch_link_up"].bytes.max() == 2 * 20_000 * 64
    one = alone[el.name].stages["switch_link_up"].utilisation.max()
    assert run[(el.name, False)].stages["switch_link_up"].utilisation.max() == pytest.approx(2 * one, rel=0.02)
    assert p99[(el.name, False)] > alone[el.name].percentiles("read")["p99"]
    # ... and on one module they also share its 25.6 GB/s device link: 2 x 90% of it, which
    # overloads it, and latency grows by tens of microseconds over the run
    assert run[(el.name, True)].stages["device_link_up"].utilisation.max() > 0.98
    assert p50[(el.name, True)] > 10 * p50[(el.name, False)]


def test_pf_latency_rises_once_the_shared_module_is_the_limit():
    # sixteen hosts on one module at full load: 16 x 25.6 GB/s = the module's 409.6 GB/s
    pf = fm.pf_appliance(APP, cache=False, jitter=False)
    light = fr.replay(pf, streams(True, hosts=16), base_hpa=BASE, granularity=APP.granularity, load=0.5)
    full = fr.replay(pf, streams(True, hosts=16), base_hpa=BASE, granularity=APP.granularity, load=1.0)
    assert light.stages["module"].utilisation[0] == pytest.approx(0.5, abs=0.02)
    assert full.stages["module"].utilisation[0] > 0.97
    assert light.percentiles("read")["p50"] - pf.idle_ns(False) < 2
    assert full.percentiles("read")["p50"] > light.percentiles("read")["p50"] + 50   # 283 -> about 400 ns


def test_the_curve_command_saves_a_png_and_names_each_knee(tmp_path):
    # the paper's bandwidth experiment: 16 hosts, each to its own module
    path = tmp_path / "sixteen.npy"
    model_runs.save_trace(path, captured(hosts=16, n=10_000))
    png = tmp_path / "curve.png"
    done = subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", "model", "curve", str(path), "-t",
                           "pf-appliance", "--loads", "0.5,0.6,0.7,1.0", "--out", str(png), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["pf"]["knee"] is None and report["dram"]["knee"] is None
    pf_full = report["pf"]["points"][-1]
    assert pf_full["achieved_gbs"] == pytest.approx(16 * PORT_GBS, rel=0.02)     # every port full
    # four electrical switch links of 64 GB/s carry at most 256 GB/s: from 0.625 ports per host on
    assert report["electrical"]["knee"]["load"] == 0.7
    assert report["electrical"]["points"][-1]["achieved_gbs"] == pytest.approx(4 * 64, rel=0.03)


@pytest.mark.parametrize("size", [1, 8, 32, 64])
def test_replay_at_a_light_load_gives_what_the_traced_run_printed(size):
    """`model replay --load 0.01` of a trace and the traced run's table (timing_report.model_trace)
    model the same accesses: whole 64-byte lines whatever bytes the program touched, so at a load
    too light to queue both give each system's idle read and write latency."""
    from pfcxl.device.trace import records as tf
    from pfcxl.host_tools.timing import report as timing_report
    topo = topology.load(topology.resolve("pf-nic"))
    n = 600
    records = np.zeros(n, np.dtype(tf.RECORD_FIELDS))
    records["insn"] = np.arange(n) * 1000
    records["hpa"] = address_map.dax_placements(topo)[0].base + (np.arange(n) * 97 % 512) * 64
    records["size"] = size
    records["write"] = np.arange(n) % 3 == 0
    traced = timing_report.model_trace(topo, records, dependent=True)
    for system, key in model_runs.REPORT_KEYS.items():
        if key not in traced:
            continue
        replayed = model_runs.replay_report(records, topo, system, load=0.01, dilate=None)
        for op in ("read", "write"):
            assert replayed[op]["p50"] == pytest.approx(traced[key][op]["p50"]), (system, op)
