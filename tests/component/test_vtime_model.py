"""The virtual-time model the plugin charges (device/plugin/pfcxl_vtime.h), driven without QEMU
by tests/component/vtime_harness.c over hand-made access streams, against the fabric model's own
figures (host_tools/timing/vtime.py renders both from device/fabric): a cold dependent chase reads
the idle latency, a warm one the L2 hit, a sequential read the Little's-law bound, a non-temporal
store the write latency, and every fabric request's latency equals the offline engine's."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pfcxl.compile import compile_cached
from pfcxl.device import topology
from pfcxl.device.fabric import constants as fc
from pfcxl.device.fabric import engine as fabric_engine
from pfcxl.host_tools.timing import vtime

pytestmark = pytest.mark.component

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VA = 0x7F00_0000_0000          # the guest's virtual addresses of the mapping
LINE = 64


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    sources = [HERE / "vtime_harness.c", REPO / "device" / "plugin" / "pfcxl_vtime.h"]
    return compile_cached(HERE / "vtime_harness.c", sources, ("-O2", "-Wall", "-Wextra", "-Werror", "-rdynamic"),
                          tmp_path_factory.mktemp("harness"), "vtime_harness", "")


@pytest.fixture(scope="module")
def topo():
    return topology.load(topology.resolve("pf-nic"))


def base(topo) -> int:
    from pfcxl.device.topology import address_map
    return address_map.dax_placements(topo)[0].base


def run(harness: Path, topo, fabric: str, lines: list[str], tmp_path: Path) -> dict:
    model = tmp_path / f"{fabric}.vtime"
    model.write_text(vtime.model_text(topo, fabric))
    out = subprocess.run([str(harness), str(model)], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, check=True).stdout.splitlines()
    times = [int(x.split()[1]) for x in out if x.startswith("t ")]
    requests = [tuple(int(v) for v in x.split()[1:]) for x in out if x.startswith("r ")]
    stats = json.loads(out[-1].removeprefix("stats "))
    return {"t": times, "requests": requests, "stats": stats}


STRIDE = 4 * LINE     # the chain's lines are never neighbours, so no prefetch stream starts


def chase(topo, n: int, cls: int = 1, first: int = 0, order_seed: int = 1, gap: int = 3,
          where: int | None = None, start: int = 1000) -> list[str]:
    """A dependent chase over n lines in random order: each load's value is the next's address."""
    at = base(topo) if where is None else where
    order = list(range(first, first + n))
    random.Random(order_seed).shuffle(order)
    out, insn = [], start
    for a, b in zip(order, order[1:] + order[:1]):
        out.append(f"{insn} {VA + a * STRIDE} {at + a * STRIDE} 0 {cls} 0 {VA + b * STRIDE}")
        insn += gap
    return out


def per_load(r: dict, n: int) -> float:
    return (r["t"][-1] - r["t"][0]) / (n - 1) / 1000


@pytest.mark.parametrize("fabric", vtime.FABRICS)
def test_a_cold_dependent_chase_reads_the_models_idle_latency(harness, topo, tmp_path, fabric):
    n = 2000
    r = run(harness, topo, fabric, chase(topo, n), tmp_path)
    want = vtime.expected_idle_ns(topo, fabric)
    # pf_hbm: the chain's lines were never written, so its module cache misses: the DDR5 path
    if fabric == "pf_hbm":
        want = vtime.expected_idle_ns(topo, "pf")
    assert per_load(r, n) == pytest.approx(want, abs=1e-9)
    assert r["stats"]["vtime"]["misses"] == n and r["stats"]["vtime"]["l2_hits"] == 0


def test_time_a_vcpu_spends_halted_is_in_its_clock(harness, topo, tmp_path):
    """A halt (the guest sleeps): QEMU's sleep=off jumps the virtual clock to the next timer,
    adding to the clock's lead over the instructions; the model's clock (which the timeline
    keeps hosts in step by) moves with it, and the loads after it read the same latency."""
    n, idle_ns = 400, 1_000_000
    loads = chase(topo, n)
    r = run(harness, topo, "pf", loads[:n // 2] + [f"idle {idle_ns}"] + loads[n // 2:], tmp_path)
    want = vtime.expected_idle_ns(topo, "pf")
    before, after = r["t"][:n // 2], r["t"][n // 2:]
    assert (before[-1] - before[0]) / (n // 2 - 1) / 1000 == pytest.approx(want)
    assert (after[-1] - after[0]) / (n - n // 2 - 1) / 1000 == pytest.approx(want)
    assert (after[0] - before[-1]) / 1000 == idle_ns + 3       # the halt, and the 3 instructions between


def test_the_module_cache_serves_lines_written_before(harness, topo, tmp_path):
    """pf_hbm: lines the host wrote (non-temporal stores, so the CPU caches keep nothing) are in
    the module's HBM3E: a cold chase over them reads the hit path, 221 ns."""
    n = 500
    chain = chase(topo, n)
    writes = [f"{10 + i} {VA + i * STRIDE} {base(topo) + i * STRIDE} 1 1 1 -" for i in range(n)]
    r = run(harness, topo, "pf_hbm", writes + ["cold 900"] + chain, tmp_path)
    timeline = r["t"][n:]
    assert (timeline[-1] - timeline[0]) / (n - 1) / 1000 == pytest.approx(vtime.expected_idle_ns(topo, "pf_hbm"))
    assert vtime.expected_idle_ns(topo, "pf_hbm") == fc.PF_T_REQ_NS + fc.PF_T_MEM_READ_HIT_NS + fc.PF_T_RESP_NS


def test_local_dram_reads_the_dram_latency(harness, topo, tmp_path):
    n = 1000
    r = run(harness, topo, "electrical", chase(topo, n, cls=0, where=0x1000_0000), tmp_path)
    assert per_load(r, n) == pytest.approx(fc.LOCAL_DDR5_NS)
    assert r["stats"]["vtime"]["dram_reads"] == n and r["stats"]["vtime"]["fabric_reads"] == 0


def test_a_warm_chase_reads_the_l2_hit_latency_and_an_l1_span_costs_nothing(harness, topo, tmp_path):
    n = 4096                                     # 1 MiB apart: in L2 (2 MiB), not in L1 (48 KiB)
    lines = chase(topo, n)
    r = run(harness, topo, "pf", lines + lines, tmp_path)
    second = r["t"][n:]
    assert (second[-1] - second[0]) / (n - 1) / 1000 == pytest.approx(fc.CPU_L2_HIT_NS)
    small = chase(topo, 128)                     # 32 KiB apart: in L1 after one pass
    r = run(harness, topo, "pf", small + small, tmp_path)
    assert (r["t"][-1] - r["t"][128]) / 127 / 1000 == pytest.approx(3)     # the loop's own 3 instructions


def test_cold_empties_the_caches(harness, topo, tmp_path):
    n = 1000
    lines = chase(topo, n)
    r = run(harness, topo, "pf", lines + ["cold 100000"] + lines, tmp_path)
    assert r["stats"]["vtime"]["misses"] == 2 * n


def sequential(topo, n: int, per_line: int = 1, gap: int = 2, start: int = 0) -> list[str]:
    out, insn = [], start
    for line in range(n):
        for w in range(per_line):
            off = line * LINE + w * 8
            out.append(f"{insn} {VA + off} {base(topo) + off} 0 1 0 7")
            insn += gap
    return out


@pytest.mark.parametrize("fabric", ("pf", "electrical"))
def test_a_sequential_read_reaches_the_bound_the_model_gives(harness, topo, tmp_path, fabric):
    n = 20000
    r = run(harness, topo, fabric, sequential(topo, n), tmp_path)
    gbs = n * LINE / (r["t"][-1] / 1000)
    assert gbs == pytest.approx(vtime.sequential_bound_gbs(topo, fabric), rel=0.02)


def test_the_prefetcher_hides_the_latency_of_an_instruction_bound_stream(harness, topo, tmp_path):
    """8 loads a line, 2 instructions each: 16 ns a line of work, more than the 283 ns latency over
    the prefetcher's 20 lines: the stream runs at its instructions' pace and never stalls."""
    n = 5000
    r = run(harness, topo, "pf", sequential(topo, n, per_line=8), tmp_path)
    assert r["stats"]["vtime"]["stalls"] == 0 and r["stats"]["vtime"]["prefetches"] > n * 0.99
    assert r["t"][-1] == (n * 8 - 1) * 2 * 1000


def test_a_non_temporal_store_waits_for_the_write_latency(harness, topo, tmp_path):
    """Each store waits for its write (224 ns), then the loop's own 2 instructions run."""
    n = 1000
    lines = [f"{i * 2} {VA + i * LINE} {base(topo) + i * LINE} 1 1 1 -" for i in range(n)]
    r = run(harness, topo, "pf", lines, tmp_path)
    assert per_load(r, n) == pytest.approx(vtime.expected_idle_ns(topo, "pf", write=True) + 2)
    assert r["stats"]["vtime"]["nt_writes"] == n and r["stats"]["vtime"]["misses"] == 0


def test_stores_write_allocate_and_write_back_dirty_lines_at_eviction(harness, topo, tmp_path):
    """Plain stores over 4 MiB (twice L2): each line is fetched once, and the dirty lines L2 lets go
    are written back, as fabric write requests."""
    n = 4 * 1024 * 1024 // LINE
    stores = [f"{i} {VA + i * LINE} {base(topo) + i * LINE} 1 1 0 -" for i in range(n)]
    r = run(harness, topo, "pf", stores, tmp_path)
    s = r["stats"]["vtime"]
    assert s["fabric_reads"] == n                             # write-allocate (demand or prefetch)
    assert s["writebacks"] == n - fc.CPU_L2_BYTES // LINE      # all but what L2 still holds
    assert sum(1 for q in r["requests"] if q[1] == 1) == s["writebacks"]


@pytest.mark.parametrize("fabric, writes, rel", [(f, False, 0) for f in vtime.FABRICS] +
                                                [(f, True, 1e-3) for f in vtime.FABRICS])
def test_every_charged_request_is_timed_as_the_offline_engine_times_it(harness, topo, tmp_path, fabric,
                                                                       writes, rel):
    """The hierarchy's fabric requests, replayed by the offline engine at the times the plugin
    issued them. Reads reach every queue in the order they issue, and their latencies are the
    engine's to the picosecond; with writes beside them a read can reach the memory before a write
    issued earlier, which the engine serves first and the plugin (online) after: within 0.1%."""
    stream = sequential(topo, 3000) + chase(topo, 500, first=10_000, start=10_000)
    if writes:     # instruction counts only grow, as a vCPU's do
        stream += [f"{20_000 + i} {VA + i * 4096} {base(topo) + i * 4096} 1 1 1 -" for i in range(200)]
        stream += sequential(topo, 500, start=30_000)
    r = run(harness, topo, fabric, stream, tmp_path)
    req = r["requests"]
    trace = np.zeros(len(req), fabric_engine.trace_dtype())
    trace["insn"] = [q[2] for q in req]          # issue time in ps
    trace["hpa"] = [q[0] * LINE for q in req]
    trace["write"] = [q[1] for q in req]
    trace["size"] = LINE
    model = vtime.fabric_for(topo, fabric)
    result = fabric_engine.run(model, trace, ns_per_insn=0.001, base_hpa=base(topo),
                               granularity=topology.load(topology.resolve("pf-appliance")).appliance.granularity)
    engine_ns = float(result.latency_ns.sum())
    assert engine_ns == pytest.approx(r["stats"]["vtime"]["fabric_latency_ns"], rel=rel, abs=1e-6)


def test_non_temporal_stores_are_known_by_their_bytes(harness, topo, tmp_path):
    cases = {"480fc30f": 1,      # movnti %rcx,(%rdi)
             "0fc30f": 1,        # movnti %ecx,(%rdi)
             "660fe707": 1,      # movntdq %xmm0,(%rdi)
             "0f2b07": 1,        # movntps
             "c5f9e707": 1,      # vmovntdq (VEX2)
             "c4e17de707": 1,    # vmovntdq ymm (VEX3, map 0f)
             "48890f": 0,        # mov %rcx,(%rdi)
             "0f1f00": 0,        # nop
             "c4e27d2a07": 0}    # vmovntdqa (a load, map 0f38)
    model = tmp_path / "pf.vtime"
    model.write_text(vtime.model_text(topo, "pf"))
    out = subprocess.run([str(harness), str(model)], input="".join(f"nt {h}\n" for h in cases),
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert [int(x.split()[1]) for x in out if x.startswith("nt ")] == list(cases.values())


@pytest.mark.parametrize("text, says", [
    ("version 2\n", "line 1"),
    ("version 1\nl1 63 12 0\n", "line 2"),                  # sets not a power of two
    ("version 1\nstage fabric write nowhere 5\n", "line 2"),
    ("version 1\nsystem pf\n", "lacks"),
])
def test_a_bad_model_file_is_one_line(harness, tmp_path, text, says):
    model = tmp_path / "bad.vtime"
    model.write_text(text)
    done = subprocess.run([str(harness), str(model)], input="", capture_output=True, text=True)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and str(model) in lines[0]


def test_the_guest_switches_fabric_through_the_doorbell(harness, topo, tmp_path):
    """One guest compares the fabrics: PFCXL_MARK_PROFILE(k) puts FABRICS[k] in force."""
    n = 500
    lines = chase(topo, n)
    stream = lines + [f"profile {vtime.FABRICS.index('electrical')}", "cold 10000000"] + \
        chase(topo, n, start=10_000_000) + ["profile 7"]
    model = tmp_path / "pf.vtime"
    model.write_text(vtime.model_text(topo, "pf"))
    out = subprocess.run([str(harness), str(model)], input="\n".join(stream) + "\n", capture_output=True,
                         text=True, check=True).stdout.splitlines()
    times = [int(x.split()[1]) for x in out if x.startswith("t ")]
    assert [x for x in out if x.startswith("profile")] == ["profile 1", "profile 0"]
    assert (times[n - 1] - times[0]) / (n - 1) / 1000 == pytest.approx(vtime.expected_idle_ns(topo, "pf"))
    assert (times[-1] - times[n]) / (n - 1) / 1000 == pytest.approx(vtime.expected_idle_ns(topo, "electrical"))


def test_written_back_lines_reach_the_module_cache_in_the_engine_too(harness, topo, tmp_path):
    """pf_hbm: plain stores, then a cold start (their dirty lines are written back: fabric writes
    that install the lines in the module cache), then a chase over them. The engine, given the
    same requests, finds the same hits and the same latencies."""
    n = 500
    stores = [f"{i * 5} {VA + i * STRIDE} {base(topo) + i * STRIDE} 1 1 0 -" for i in range(n)]
    r = run(harness, topo, "pf_hbm", stores + ["cold 5000"] + chase(topo, n, start=6000), tmp_path)
    req = r["requests"]
    assert sum(q[1] for q in req) == n and r["stats"]["vtime"]["writebacks"] == n
    trace = np.zeros(len(req), fabric_engine.trace_dtype())
    trace["insn"], trace["hpa"] = [q[2] for q in req], [q[0] * LINE for q in req]
    trace["write"], trace["size"] = [q[1] for q in req], LINE
    result = fabric_engine.run(vtime.fabric_for(topo, "pf_hbm"), trace, ns_per_insn=0.001, base_hpa=base(topo),
                               granularity=4096)
    chase_reads = result.latency_ns[-n:]
    assert float(np.median(chase_reads)) == pytest.approx(vtime.expected_idle_ns(topo, "pf_hbm"))
    assert float(result.latency_ns.sum()) == pytest.approx(r["stats"]["vtime"]["fabric_latency_ns"] +
                                                           float(result.latency_ns[trace["write"] == 1].sum()),
                                                           rel=1e-3)


def test_a_what_if_parameter_changes_the_charge_and_the_model_alike(harness, topo, tmp_path):
    """--fabric-param switch_hop_ns=100: the electrical pool's idle read is 71 + 100 + 212 ns, in the
    plugin's charge and in the model the offline engine runs."""
    what_if = vtime.params(["switch_hop_ns=100", "port_mbs=51200"])
    model = tmp_path / "what-if.vtime"
    model.write_text(vtime.model_text(topo, "electrical", what_if=what_if))
    n = 500
    out = subprocess.run([str(harness), str(model)], input="\n".join(chase(topo, n)) + "\n", capture_output=True,
                         text=True, check=True).stdout.splitlines()
    times = [int(x.split()[1]) for x in out if x.startswith("t ")]
    want = fc.PF_T_REQ_NS + fc.PF_T_RESP_NS + 100 + fc.PF_T_MEM_READ_NS
    assert vtime.expected_idle_ns(topo, "electrical", what_if=what_if) == want
    assert (times[-1] - times[0]) / (n - 1) / 1000 == pytest.approx(want)
    assert "# what-if: port_mbs=51200 switch_hop_ns=100" in model.read_text()
