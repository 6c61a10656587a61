"""Replaying traces (pfcxl.serving.trace_sim) and the KV policies (kvpolicy, radix): mechanics
checked against hand-computed or independently computed figures. No VM; seconds."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pfcxl.errors import ServingError
from pfcxl.serving import inputs, mechanisms, traces
from pfcxl.serving.kvpolicy import Policy, TwoTiers
from pfcxl.serving.radix import RadixTree
from pfcxl.serving.trace_sim import UNBOUNDED, TraceSetup, replay

MODEL = inputs.load_model("llama-70b")
GPU = inputs.load_gpu("h200")
HOST = inputs.load_tier("host-dram-2tb")
TFLOPS = mechanisms.published_prefill_tflops(inputs.load_gpu("h200")) * 1e12
POLICIES = [Policy(), Policy("radix-lru"), Policy("radix-lru", reservation=True),
            Policy("radix-lru", hit_accounting="kv-beyond-gpu")]

pytestmark = pytest.mark.unit


def setup(trace, capacity=UNBOUNDED, policy=Policy(), sequence_only=True, time_scale=1.0):
    return TraceSetup(trace, MODEL, GPU, 8, HOST, capacity, TFLOPS, time_scale=time_scale, policy=policy,
                      sequence_only=sequence_only)


def make(rows, block_tokens=1, step_ms=0):
    """A trace from lists of block ids (block_tokens 1: one token per block)."""
    return traces.Trace("hand", block_tokens, tuple(traces.Request(i * step_ms, len(ids) * block_tokens, 1,
                                                                   tuple(ids)) for i, ids in enumerate(rows)))


def ceiling_tokens(trace):
    """Input tokens an unbounded cache finds, in trace order: the longest prefix of blocks all
    seen before (computed here without the simulator)."""
    seen, found = set(), []
    for r in trace.requests:
        ids = r.hash_ids[:trace.blocks(r)]
        n = 0
        while n < len(ids) and ids[n] in seen:
            n += 1
        found.append(min(n * trace.block_tokens, r.input_length))
        seen.update(ids)
    return found


CONVERSATION = traces.load(traces.bundled("conversation"))


@pytest.mark.parametrize("policy", POLICIES[:3], ids=lambda p: p.label)
def test_unbounded_tier_reaches_the_independently_computed_ceiling(policy):
    result = replay(setup(CONVERSATION, policy=policy))
    want = ceiling_tokens(CONVERSATION)
    assert result.kv_hit_tokens.tolist() == want
    assert result.summary()["hit_rate"] == sum(want) / CONVERSATION.input_tokens


rows = st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=8), min_size=1, max_size=25)


@settings(max_examples=40, deadline=None)
@given(rows=rows)
def test_event_mode_with_requests_far_apart_reaches_the_ceiling(rows):
    trace = make(rows, block_tokens=512, step_ms=10**6)       # each request done before the next
    result = replay(setup(trace, sequence_only=False))
    assert (result.gpu_hit_tokens + result.kv_hit_tokens).tolist() == ceiling_tokens(trace)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.label)
@pytest.mark.parametrize("sequence_only", [True, False])
def test_zero_capacity_tier_hits_nothing(policy, sequence_only):
    result = replay(setup(CONVERSATION, 0, policy, sequence_only))
    assert result.kv_hit_tokens.sum() == 0
    if sequence_only:
        assert result.summary()["hit_rate"] == 0


@settings(max_examples=60, deadline=None)
@given(rows=rows, small=st.integers(0, 30), more=st.integers(0, 30))
def test_chunk_lru_hit_rate_never_falls_when_capacity_grows(rows, small, more):
    trace = make(rows)
    lo = replay(setup(trace, small)).kv_hit_tokens.sum()
    hi = replay(setup(trace, small + more)).kv_hit_tokens.sum()
    assert lo <= hi


def test_chunk_lru_monotone_on_the_synthetic_trace():
    trace = traces.load(traces.bundled("synthetic"))
    rates = [replay(setup(trace, 10 ** (k / 2))).summary()["hit_rate"] for k in range(8, 16, 2)]
    assert rates == sorted(rates) and rates[-1] > 0


# hand-computed, block_tokens 1, sequence-only, capacity 4 blocks
HAND = [[1, 2, 3], [1, 2, 9], [5], [6], [1, 2]]
# chunk-lru: block 1, the oldest, goes first and with it every later prefix; radix-lru evicts
# leaves (3), then (9), and keeps the shared (1 2); with reservation a request first reserves its
# own blocks, so a 3-block prompt (3 reserved + 3 stored) never fits 4 blocks: nothing is reused.
HAND_HITS = {"chunk-lru": [0, 2, 0, 0, 0], "radix-lru": [0, 2, 0, 0, 2], "radix-lru+reservation": [0, 0, 0, 0, 0]}


@pytest.mark.parametrize("name, policy", [("chunk-lru", Policy()), ("radix-lru", Policy("radix-lru")),
                                          ("radix-lru+reservation", Policy("radix-lru", reservation=True))])
def test_tiny_trace_gives_the_hand_computed_hits(name, policy):
    assert replay(setup(make(HAND), 4, policy)).kv_hit_tokens.tolist() == HAND_HITS[name]


@pytest.mark.parametrize("name", ["chunk-lru", "radix-lru"])
def test_hit_accounting_counts_the_gpu_tier_or_only_beyond_it(name):
    """GPU tier of 3 blocks before a KV tier of 10. Storing 4 5 6 7 overflows the GPU tier, which
    drops 1 2 3 (and, radix, the 4-block node too); the KV tier keeps all 7. The second lookup
    then finds 1 2 3 in the KV tier only: any-tier counts them both times, kv-beyond-gpu only
    the second."""
    for accounting, counted in (("any-tier", [3, 3]), ("kv-beyond-gpu", [0, 3])):
        tiers = TwoTiers(Policy(name, hit_accounting=accounting), 3, 10)
        tiers.store([1, 2, 3])
        first = tiers.lookup([1, 2, 3])
        tiers.store([4, 5, 6, 7])                    # pushes 1, 2, 3 out of the GPU tier only
        second = tiers.lookup([1, 2, 3, 8])
        assert (first.gpu, first.kv, second.gpu, second.kv) == (3, 0, 0, 3)
        assert [first.counted, second.counted] == counted


ops = st.lists(st.tuples(st.sampled_from(["insert", "match", "lock", "unlock"]),
                         st.lists(st.integers(0, 5), min_size=1, max_size=6)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=ops, capacity=st.integers(0, 12))
def test_radix_never_evicts_a_node_with_children_and_keeps_its_size(ops, capacity):
    tree, every, locked = RadixTree(capacity), [], []
    for op, keys in ops:
        if op == "insert":
            every.append(tree.insert(keys))
        elif op == "match":
            tree.match(keys)
        elif op == "lock":
            node = tree.match_node(keys)[1]
            tree.lock(node)
            locked.append(node)
        elif locked:
            tree.unlock(locked.pop(0))
        tree.evict()
        live = list(tree.nodes())
        every.extend(live)
        assert all(n.alive for n in live)
        assert all(not n.children for n in every if not n.alive)          # evicted only as a leaf
        assert tree.size == sum(len(n.key) for n in live)
        assert all(n.locks >= 0 for n in live)
        assert tree.size <= capacity


def test_radix_evicts_least_recently_used_leaves_first_and_whole_nodes():
    tree = RadixTree(4)
    tree.insert([1, 2, 3])
    tree.insert([1, 2, 9])                           # splits: (1 2) -> (3), (9)
    tree.match([1, 2, 3])                            # (3) is now newer than (9)
    tree.insert([5])                                 # 5 blocks: the least recent leaf (9) goes
    assert tree.match([1, 2, 9]) == 2 and tree.match([1, 2, 3]) == 3
    tree.insert([7, 8, 10, 11])                      # 8 blocks: leaves go oldest first, whole
    assert tree.size <= 4 and tree.match([7, 8, 10, 11]) == 4


@settings(max_examples=80, deadline=None)
@given(requests=st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=5), min_size=1, max_size=12),
       order=st.randoms(use_true_random=False), capacity=st.integers(0, 10))
def test_reservation_never_lets_running_requests_kv_be_evicted(requests, order, capacity):
    tiers = TwoTiers(Policy("radix-lru", reservation=True), 2, capacity)
    state = {}                                       # request -> its blocks that must stay
    pending = list(range(len(requests)))
    while pending or state:
        i = pending.pop(0) if pending and (not state or order.random() < 0.5) else None
        if i is not None:
            tiers.lookup(requests[i], i, len(requests[i]) + 1)
            state[i] = ("running", requests[i][:_kv_prefix(tiers.kv, requests[i])])
        else:
            j = order.choice(sorted(state))
            if state[j][0] == "running":
                tiers.store(requests[j], j)              # what fits its tier from now on stays
                state[j] = ("stored", requests[j][:_kv_prefix(tiers.kv, requests[j])])
            else:
                tiers.finish(j)
                del state[j]
        for _, blocks in state.values():
            assert _kv_prefix(tiers.kv, blocks) == len(blocks)


def _kv_prefix(tree, keys):
    """Leading blocks of `keys` the tree holds (read without touching it)."""
    node, n = tree.root, 0
    while n < len(keys) and keys[n] in node.children:
        child = node.children[keys[n]]
        if tuple(keys[n:n + len(child.key)]) != child.key:
            break
        node, n = child, n + len(child.key)
    return n


def test_without_reservation_a_running_prefix_can_be_evicted():
    tiers = TwoTiers(Policy("radix-lru"), 0, 3)
    tiers.store([1, 2, 3])
    tiers.lookup([1, 2, 3], "a", 4)                  # "a" runs on the prefix 1 2 3 ...
    tiers.store([7, 8])                              # ... which another request pushes out
    assert _kv_prefix(tiers.kv, [1, 2, 3]) < 3


def test_policy_checks_its_switches():
    with pytest.raises(ServingError, match="--policy"):
        Policy("fifo")
    with pytest.raises(ServingError, match="--hit-accounting"):
        Policy(hit_accounting="some")
    with pytest.raises(ServingError, match="radix-lru"):
        Policy(reservation=True)


def test_time_scale_stretches_arrivals_and_queueing():
    trace = replace(CONVERSATION, requests=CONVERSATION.requests[:400])
    fast = replay(setup(trace, HOST.capacity_bytes / MODEL.kv_bytes_per_token, sequence_only=False, time_scale=0.1))
    slow = replay(setup(trace, HOST.capacity_bytes / MODEL.kv_bytes_per_token, sequence_only=False, time_scale=10))
    assert slow.summary()["span_s"] == pytest.approx(100 * fast.summary()["span_s"])
    assert slow.ttft_s.mean() < fast.ttft_s.mean()
    with pytest.raises(ServingError, match="--time-scale"):
        setup(trace, time_scale=0)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.label)
def test_session_model_counts_hits_as_its_policy_says(policy):
    from pfcxl.serving import sim
    w = inputs.load_workload("paper-chat")
    model, tier = inputs.load_model(w.model), inputs.load_tier(w.host)
    s = sim.simulate(sim.ServingSetup(w, model, GPU, tier, 20, TFLOPS, 1, policy)).summary()
    kv_only = s["hit_rate"] - s["gpu_hit_rate"]
    assert s["counted_hit_rate"] == pytest.approx(s["hit_rate"] if policy.hit_accounting == "any-tier" else kv_only)
    assert 0 < s["hit_rate"] < 1


def test_a_trace_study_replays_each_setup_and_writes_what_it_found(tmp_path):
    """serving/trace_study.py: the library half of `pfcxl serving --trace` (the CLI only prints):
    its sweep ends at the unbounded ceiling, and results.json holds the runs it returned."""
    import json

    from pfcxl.serving import trace_study
    trace = make([[1, 2], [1, 2, 3], [1, 2, 3, 4], [5]])
    steps: list[str] = []
    swept = trace_study.sweep_capacity(lambda capacity: setup(trace, capacity), [1.0, 3.0], steps.append)
    assert steps == ["1 tokens", "3 tokens", "unbounded"]
    assert [c for c, _ in swept.points] == [1.0, 3.0]
    assert swept.ceiling.kv_hit_tokens.tolist() == ceiling_tokens(trace) == [0, 2, 3, 0]
    tiers = trace_study.replay_tiers({"host": setup(trace), "small": setup(trace, 1.0)})
    assert list(tiers.runs) == ["host", "small"]
    assert tiers.write(tmp_path, {"trace": "hand"}, "t", plot=False) == []
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["setup"] == {"trace": "hand"}
    assert doc["runs"]["host"] == json.loads(json.dumps(tiers.runs["host"].summary()))
