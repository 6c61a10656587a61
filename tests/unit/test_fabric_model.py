"""The fabric timing model and its trace engine: the paper's idle decomposition, the paper's loaded
distributions, port saturation and switch contention, pointer chases, the HBM cache, and the
vectorised queueing against a slow event-driven reference. Seeded; no wall-clock assertions."""

import heapq

import numpy as np
import pytest

from pfcxl.device.fabric import constants as fc
from pfcxl.device.fabric import engine as fe
from pfcxl.device.fabric import model as fm
from pfcxl.device.fabric import workloads as wl
from pfcxl.device import topology
from pfcxl.device.trace.records import LINE

APP = topology.load(topology.resolve("pf-appliance")).appliance
PS = wl.PS_STAMP

pytestmark = pytest.mark.unit


def pf(**kw):
    return fm.pf_appliance(APP, **kw)


def one(write, size=64, hpa=0, insn=0):
    tr = np.zeros(1, fe.trace_dtype())
    tr["write"], tr["size"], tr["hpa"], tr["insn"] = write, size, hpa, insn
    return tr


# --- the paper's idle decomposition --------------------------------------------------------------

@pytest.mark.parametrize("write, terms", [(True, (24, 153, 47)), (False, (24, 212, 47))])
def test_idle_access_reproduces_the_papers_terms_exactly(write, terms):
    model = pf(cache=False, jitter=False)
    assert model.idle_terms_ns(write) == terms and model.idle_ns(write) == sum(terms)
    r = fe.run(model, one(write), granularity=APP.granularity, phases=True)
    assert r.latency_ps.tolist() == [sum(terms) * 1000]                     # 224 / 283 ns
    assert (r.phases_ps[0] // 1000).tolist() == list(terms)                 # as simulated
    assert (r.phases_ps[0] % 1000).tolist() == [0, 0, 0]


def test_terms_come_from_the_constants():
    model = pf(cache=False)
    assert model.idle_ns(True) == fc.PF_T_REQ_NS + fc.PF_T_MEM_WRITE_NS + fc.PF_T_RESP_NS == 224
    assert model.idle_ns(False) == fc.PF_T_REQ_NS + fc.PF_T_MEM_READ_NS + fc.PF_T_RESP_NS == 283
    assert fm.electrical_pool().idle_ns(False) == sum(p.read_latency_ns for p in (fc.EL_HOST_PATH, fc.EL_SWITCH, fc.EL_MODULE))
    assert fm.electrical_pool().idle_ns(True) == sum(p.write_latency_ns for p in (fc.EL_HOST_PATH, fc.EL_SWITCH, fc.EL_MODULE))


def test_bigger_transfers_pay_their_serialisation():
    model = pf(cache=False, jitter=False)
    r = fe.run(model, one(False, size=1024))
    # 960 more bytes over the 25.6 GB/s port, the 128 GB/s host link and the 409.6 GB/s DDR5
    extra = sum(fm.service_ps(1024, b) - fm.service_ps(64, b) for b in (25_600, 128_000, 409_600))
    assert r.latency_ps[0] == 283_000 + extra


def test_idle_median_is_exactly_the_papers_with_jitter():
    model = pf(cache=False)
    tr = np.zeros(4000, fe.trace_dtype())
    tr["insn"] = np.arange(4000) * 10_000_000              # 10 us apart: idle
    tr["write"], tr["size"] = np.arange(4000) % 2, 64
    tr["hpa"] = np.arange(4000) * 4096
    r = fe.run(model, tr, ns_per_insn=PS, seed=3)
    assert r.percentiles("write")["p50"] == 224.0 and r.percentiles("read")["p50"] == 283.0
    assert r.latency_ns[r.write].min() >= 224 - fc.PF_JITTER_WRITE_NS
    assert r.latency_ns[~r.write].max() <= 283 + fc.PF_JITTER_READ_NS


# --- the paper's load ----------------------------------------------------------------------------

def test_paper_load_falls_in_the_papers_ranges():
    r = fe.run(pf(cache=False), wl.paper_load(APP, 20_000, seed=7), ns_per_insn=PS,
               granularity=APP.granularity, seed=7)
    util = r.stages["port_up"].utilisation.reshape(16, 16)
    assert np.allclose(np.diag(util), fc.PF_PAPER_LOAD_PORT_UTILISATION, atol=0.03)
    assert r.fraction_within(210, 250, "write") >= 0.8
    assert r.fraction_within(275, 290, "read") >= 0.8
    reads = r.percentiles("read")
    assert 283 <= reads["p50"] <= 290
    assert 300 <= reads["p99.9"] <= 330                     # the tail reaches about 320 ns
    writes = r.percentiles("write")
    assert 220 <= writes["p50"] <= 235 and writes["p99.9"] <= 280


# --- bandwidth: dedicated optical paths against shared switch links ------------------------------

@pytest.mark.parametrize("size", [32, 64, 256, 1024])
@pytest.mark.parametrize("linear", [True, False])
@pytest.mark.parametrize("write", [False, True])
def test_every_pf_port_reaches_25_6_gbs(size, linear, write):
    n = 400_000 // 16 * 64 // max(size, 64)               # each port busy >= ~1 ms ... of modelled time
    tr = wl.stream(APP, 16, size, max(n, 2_000), write=write, linear=linear)
    r = fe.run(pf(), tr, granularity=APP.granularity)
    port = r.stages["port_down" if write else "port_up"]
    used = np.diag(port.utilisation.reshape(16, 16))
    assert np.all(used > 0.97) and np.all(used <= 1.0)
    assert np.allclose(np.diag(port.achieved_gbs.reshape(16, 16)), 25.6, rtol=0.03)
    assert np.count_nonzero(port.bytes) == 16              # each host on its own path


@pytest.mark.parametrize("size", [64, 1024])
def test_electrical_hosts_share_their_switch_link(size):
    tr = wl.stream(APP, 16, size, 4_000, write=False, linear=False)
    r = fe.run(fm.electrical_pool(), tr, granularity=APP.granularity)
    per_host = np.bincount(tr["host"], weights=tr["size"].astype(float)) / r.window_ps * 1000
    link = r.stages["switch_link_up"]
    assert np.all(link.utilisation > 0.95)                 # the 4 shared links are the bottleneck
    assert np.all(per_host < 0.7 * 25.6)                   # 64 GB/s over 4 hosts: 16 GB/s each
    assert per_host.sum() == pytest.approx(4 * 64, rel=0.05)


def test_electrical_latency_grows_with_sharers_but_pf_does_not():
    def mean_latency(model, sharers):
        # hosts 0..sharers-1 (one switch group) read 1 KB from random modules at 14 GB/s each
        tr = wl.own_module_poisson(APP, 5_000, 7.0, size=1024, reads=1.0, seed=5)
        tr = tr[tr["host"] < sharers]
        tr["hpa"] = np.random.default_rng(3).integers(0, APP.shared // 1024, len(tr)) * 1024
        return fe.run(model, tr, ns_per_insn=PS, granularity=APP.granularity).latency_ns.mean()
    el = [mean_latency(fm.electrical_pool(), k) for k in (1, 2, 4)]
    ph = [mean_latency(pf(cache=False), k) for k in (1, 2, 4)]
    assert el[0] + 2 < el[1] < el[2] - 10
    assert max(ph) - min(ph) < 0.5


def test_electrical_average_is_belugas_800_to_900_ns():
    tr = wl.paper_load(APP, 5_000, seed=9, utilisation=0.2)       # moderate: 40% of a switch link
    r = fe.run(fm.electrical_pool(), tr, ns_per_insn=PS, granularity=APP.granularity, seed=9)
    assert 800 <= r.percentiles()["mean"] <= 900
    assert 800 <= r.percentiles("read")["p50"] <= 900


# --- dependent issue -----------------------------------------------------------------------------

def chase(n, hosts=1):
    rng = np.random.default_rng(11)
    tr = np.zeros(n * hosts, fe.trace_dtype())
    tr["host"] = np.repeat(np.arange(hosts), n)
    tr["insn"] = np.tile(np.arange(n) * 20, hosts)       # 20 instructions between loads
    tr["size"], tr["hpa"] = 64, rng.integers(0, APP.shared // 64, n * hosts) * 64
    return tr


@pytest.mark.parametrize("model, lo, hi", [(pf(cache=False), 283, 283),
                                           (fm.electrical_pool(), 800, 900)])
def test_pointer_chase_on_an_idle_fabric(model, lo, hi):
    r = fe.run(model, chase(3000), dependent=True, ns_per_insn=0.25, granularity=APP.granularity)
    assert lo <= r.percentiles("read")["p50"] <= hi
    # each load issues after the previous completes, plus its 20 instructions
    gaps = np.diff(r.issue_ps) - r.latency_ps[:-1]
    assert np.all(gaps == 5_000)


@pytest.mark.parametrize("model", [pf(), pf(cache=False), fm.electrical_pool(), fm.local_dram()],
                         ids=["pf", "pf-no-cache", "electrical", "dram"])
def test_dependent_issue_settles_for_16_hosts_of_20k_accesses(model):
    # 16 hosts chasing through shared queues: the numpy solver's fixed-point iteration needs a
    # round per collision in a row and gave up here on the electrical pool; the kernel's event
    # heap solves it in one pass
    tr = chase(20_000, hosts=16)
    tr["hpa"] %= APP.shared if model.modules > 1 else 1 << 30
    r = fe.run(model, tr, dependent=True, ns_per_insn=0.25, granularity=APP.granularity)
    assert r.iterations == 1
    for h in range(16):                         # every load waits for the previous one and its 20 instructions
        mine = tr["host"] == h
        assert np.all(np.diff(r.issue_ps[mine]) - r.latency_ps[mine][:-1] == 5_000)
    assert r.percentiles("read")["p50"] >= model.idle_ns(False) - model.jitter_read_ns


# --- HBM cache -----------------------------------------------------------------------------------

def test_repeated_reads_hit_after_the_first_miss_and_writes_never_hit():
    model = pf(jitter=False)
    tr = np.zeros(12, fe.trace_dtype())
    tr["insn"] = np.arange(12) * 1_000_000               # idle: 1 us apart
    tr["size"] = 64
    tr["hpa"] = [0, 64, 0, 64, 0, 64, 128, 128, 128, 4096 * 16, 4096 * 16, 4096 * 16]
    tr["write"] = [0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1]
    r = fe.run(model, tr, ns_per_insn=PS, granularity=APP.granularity)
    hit_ns = 24 + fc.PF_T_MEM_READ_HIT_NS + 47
    assert r.latency_ns.tolist() == [283, 283, hit_ns, hit_ns, 224, 224, 224, 224, hit_ns, 283, hit_ns, 224]
    assert r.hit.tolist() == [0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 1, 0]


def test_cache_conflicts_evict_and_the_cache_is_optional():
    lines = APP.hbm_cache // 64
    alias = lines * APP.granularity * APP.modules // (APP.granularity // 64)   # same set, other tag
    tr = np.zeros(4, fe.trace_dtype())
    tr["insn"], tr["size"] = np.arange(4) * 1_000_000, 64
    tr["hpa"] = [0, alias, 0, 0]
    r = fe.run(pf(jitter=False), tr, ns_per_insn=PS, granularity=APP.granularity)
    assert r.hit.tolist() == [0, 0, 0, 1]
    r = fe.run(pf(jitter=False, cache=False), tr, ns_per_insn=PS, granularity=APP.granularity)
    assert not r.hit.any() and set(r.latency_ns) == {283}


# --- the vectorised engine against a slow event-driven reference ---------------------------------

def reference(model, trace, *, ns_per_insn, dependent, granularity, seed):
    """Discrete-event simulation, one access and one queue at a time, with the model's rules."""
    n = len(trace)
    write = trace["write"].astype(bool)
    jitter = fe.draw_jitter(model, write, seed).tolist()
    stamp = [int(x) for x in np.rint(trace["insn"].astype(float) * (ns_per_insn * 1000))]
    M, L = model.modules, model.cache_lines
    info = []
    for rec in trace.tolist():
        insn, hpa, size, w, vcpu, host = rec
        size = max(size, 1)
        granule, rest = divmod(hpa, granularity)
        module, moff = granule % M, (granule // M) * granularity + rest
        q = {"host": host, "module": module, "path": host * M + module, "group": host // model.hosts_per_group}
        info.append((size, bool(w), module, moff, q, host * 256 + vcpu))
    free, cache = {}, {}
    stats = {s.name: {} for s in model.stages}
    issue, complete, hit = [0] * n, [0] * n, [False] * n
    heap = []

    def fifo(st, i, t, service):
        key = (st.name, info[i][4][st.key])
        d = max(t, free.get(key, 0)) + service
        free[key] = d
        b, busy = stats[st.name].get(key[1], (0, 0))
        stats[st.name][key[1]] = (b + info[i][0], busy + service)
        return d

    def start(i, t):
        issue[i] = t
        heapq.heappush(heap, (t, t, i, 0))

    chains = {}
    for i in sorted(range(n), key=lambda i: (stamp[i], i)):
        chains.setdefault(info[i][5], []).append(i)
    nxt = {}
    for chain in chains.values():
        for a, b in zip(chain, chain[1:]):
            nxt[a] = b
        if dependent:
            start(chain[0], stamp[chain[0]])
    if not dependent:
        for i in range(n):
            start(i, stamp[i])
    while heap:
        t, _, i, step = heapq.heappop(heap)
        size, w, module, moff, q, _ = info[i]
        fixed = model.fixed_ps(w)
        stages = model.write_stages if w else model.read_stages
        if w and step < len(stages):                               # payload towards memory
            heapq.heappush(heap, (fifo(stages[step], i, t, fm.service_ps(size, stages[step].bandwidth_mbs)),
                                  issue[i], i, step + 1))
            continue
        before = len(stages) if w else 0
        if step == before:                                         # rest of T_req
            heapq.heappush(heap, (t + fixed[0], issue[i], i, step + 1))
        elif step == before + 1:                                   # the memory
            bw, mem = model.memory.bandwidth_mbs, fixed[1]
            if L:
                slot, tag = (module, moff // 64 % L), moff // 64 // L
                count = (moff % 64 + size + 63) // 64
                old = cache.get(slot)
                if not w and old and old[0] == tag and old[1] >= count:
                    hit[i], bw, mem = True, model.cache_bandwidth_mbs, model.fixed_ps(False, hit=True)[1]
                cache[slot] = (tag, count)
            heapq.heappush(heap, (fifo(model.memory, i, t, fm.service_ps(size, bw)) + mem, issue[i], i, step + 1))
        elif not w and step - 2 < len(stages):                     # read payload back
            st = stages[step - 2]
            heapq.heappush(heap, (fifo(st, i, t, fm.service_ps(size, st.bandwidth_mbs)), issue[i], i, step + 1))
        else:                                                      # T_resp rest, jitter: done
            complete[i] = t + fixed[2] + jitter[i]
            if dependent and i in nxt:
                j = nxt[i]
                start(j, complete[i] + stamp[j] - stamp[i])
    return np.array(complete) - np.array(issue), np.array(issue), np.array(hit), stats


def random_trace(rng, n, hosts, spread_ps):
    tr = np.zeros(n, fe.trace_dtype())
    tr["insn"] = rng.integers(0, spread_ps, n)
    tr["host"] = rng.integers(0, hosts, n)
    tr["vcpu"] = rng.integers(0, 2, n)
    tr["write"] = rng.random(n) < 0.5
    tr["size"] = rng.choice([1, 32, 64, 128, 1024], n)
    lines = rng.integers(0, 64, n)                         # few lines: cache hits and conflicts
    tr["hpa"] = 0x1000_0000 + (lines * 64) * rng.choice([1, 1, 64, 4096], n)
    return tr


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "numpy"])
@pytest.mark.parametrize("case", range(12))
def test_engine_equals_the_event_driven_reference(case, kernel):
    rng = np.random.default_rng(100 + case)
    small = fm.pf_appliance(fm.ApplianceSpec(4, 1 << 30, 64 * 8, 4, 4096, 1 << 30, 0, "memfd"))
    model = [small, small.without_jitter(), fm.electrical_pool(8, 4), pf()][case % 4]
    dependent = case % 3 == 2
    tr = random_trace(rng, 400, model.hosts, [20_000, 300_000, 3_000_000][case % 3])
    kw = dict(ns_per_insn=[1.0, 0.5, PS][case % 3] if not dependent else 0.25, dependent=dependent,
              granularity=4096, seed=case)
    results = [fe.run(model, tr, base_hpa=0x1000_0000, chunk=chunk, kernel=kernel, **kw) for chunk in (1 << 17, 64, 7)]
    tr["hpa"] -= 0x1000_0000
    lat, issue, hit, stats = reference(model, tr, **kw)
    for r in results:                          # solved at once, and in batches of 64 and of 7
        assert np.array_equal(r.issue_ps, issue)
        assert np.array_equal(r.latency_ps, lat)
        assert np.array_equal(r.hit, hit)
        for st in model.stages:
            for q, (b, busy) in stats[st.name].items():
                assert (r.stages[st.name].bytes[q], r.stages[st.name].busy_ps[q]) == (b, busy)
            assert r.stages[st.name].bytes.sum() == sum(b for b, _ in stats[st.name].values())


@pytest.mark.parametrize("model", [pf(), fm.electrical_pool()], ids=["pf", "electrical"])
def test_batching_and_threads_never_change_the_result(model):
    # mixed sizes at a load that overloads the electrical switch links: arrivals far from issue
    # order, deferred accesses and the sorted fallback all get exercised
    tr = wl.mixed(APP, 30_000, seed=3, host_gbs=60.0)
    runs = [fe.run(model, tr, ns_per_insn=PS, granularity=APP.granularity, seed=1, chunk=c, workers=w, kernel=False)
            for c, w in ((fe.CHUNK, 1), (1000, 1), (97, 1), (1000, 2))]
    runs.append(fe.run(model, tr, ns_per_insn=PS, granularity=APP.granularity, seed=1))   # the compiled kernel
    for r in runs[1:]:
        assert np.array_equal(r.latency_ps, runs[0].latency_ps) and np.array_equal(r.hit, runs[0].hit)
        for name, st in r.stages.items():
            assert np.array_equal(st.busy_ps, runs[0].stages[name].busy_ps)
    assert model.cache_lines == 0 or runs[0].hit.any()


def test_kernel_sorts_a_stage_far_from_issue_order_like_the_numpy_solver():
    # an electrical pool overloaded for the whole run: its switch links' queues grow so far that
    # the kernel stops batching and sorts the rest of a stage by arrival
    tr = wl.mixed(APP, 200_000, seed=3, host_gbs=60.0)
    model = fm.electrical_pool()
    a, b = (fe.run(model, tr, ns_per_insn=PS, granularity=APP.granularity, seed=1, kernel=k) for k in (True, False))
    assert np.array_equal(a.latency_ps, b.latency_ps)
    assert a.stages["switch_link_up"].utilisation.max() > 0.99


def test_fifo_kernel_on_huge_times_matches_a_plain_loop():
    from pfcxl.device.fabric import queues as fq
    rng = np.random.default_rng(8)
    n = 5000
    arrive = (1 << 58) + rng.integers(0, 1 << 57, n)            # too wide to lift queues apart
    queue = rng.integers(0, 300, n)
    size = rng.integers(1, 2000, n).astype(np.uint32)
    depart, nbytes, busy = fq.serve(arrive.copy(), queue, 300, size, 25_600, chunk=512)
    free, expect = {}, np.empty(n, np.int64)
    for i in sorted(range(n), key=lambda i: (arrive[i], i)):
        expect[i] = max(int(arrive[i]), free.get(queue[i], 0)) + fm.service_ps(int(size[i]), 25_600)
        free[queue[i]] = expect[i]
    assert np.array_equal(depart, expect)
    assert nbytes.sum() == size.sum() and busy.sum() == fm.service_ps(size, 25_600).sum()


def test_addresses_map_to_modules_like_the_pool():
    from pfcxl.device.appliance import pool
    rng = np.random.default_rng(4)
    offsets = rng.integers(0, APP.shared, 1000) // LINE * LINE
    module, moff = fe.locate(np.asarray(offsets + 0x4000, np.uint64), 0x4000, APP.granularity, APP.modules)
    for o, m, mo in zip(offsets.tolist(), module.tolist(), moff.tolist()):
        w = pool.where(APP, o)
        assert (w["module"], w["module_offset"]) == (m, mo)
    with pytest.raises(ValueError):
        fe.locate(np.asarray([0x3fc0], np.uint64), 0x4000, APP.granularity, APP.modules)


def test_context_rows():
    rows = {r.name: r for r in fm.context_table(APP)}
    assert rows["local DDR5"].read_ns < rows["PF appliance, HBM3E hit"].read_ns < rows["PF appliance"].read_ns
    assert rows["PF appliance"].read_ns == 283 and 800 <= rows["electrical CXL switch pool"].read_ns <= 900
    r = fe.run(fm.local_dram(), one(False))
    assert r.latency_ps[0] == fc.LOCAL_DDR5_NS * 1000


@pytest.mark.parametrize("modules, granularity", [(16, 4096), (3, 256), (12, 1024)])
def test_kernel_decodes_records_like_the_numpy_path(modules, granularity):
    from pfcxl.device.fabric import native as fabric_kernel
    rng = np.random.default_rng(modules)
    tr = np.zeros(5000, fe.trace_dtype())
    tr["hpa"] = 0x8000 + rng.integers(0, 1 << 34, len(tr))
    tr["insn"], tr["size"], tr["host"] = rng.integers(0, 1 << 40, len(tr)), rng.integers(0, 3, len(tr)), 5
    for factor in (1000.0, 250.0, 0.3):
        host, module, size, write, stamp, top = fabric_kernel.decode(tr, factor, 0x8000, granularity, modules)
        assert np.array_equal(module, fe.locate(tr["hpa"], 0x8000, granularity, modules)[0]) and top == 5
        assert np.array_equal(stamp, fe._stamps(tr["insn"], factor))
        assert np.array_equal(size, np.maximum(tr["size"], 1))
    tr["hpa"][7] = 0x8fff
    with pytest.raises(ValueError, match="0x8fff lies below the appliance's base 0x9000"):
        fe.run(fm.electrical_pool(16, modules), tr, base_hpa=0x9000, granularity=granularity)


def test_loading_the_kernel_makes_a_second_large_allocation_reuse_touched_pages():
    # native.reuse_freed_memory: a block as large as a run's arrays, freed and allocated again,
    # comes back from the heap already touched, instead of as fresh pages the OS must zero
    import resource

    from pfcxl.device.fabric import native
    native.library()
    assert native.reuse_freed_memory()

    def touch_faults() -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = np.ones(96 << 20, np.uint8)              # 96 MiB: above glibc's own mmap threshold
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        del block
        return faults

    touch_faults()                                       # the heap grows and keeps the pages
    assert touch_faults() < 8
