"""The serving model's N-host replay (serving/hosts_sim.py) on its own: hand-computed hits, the
cache modes' rules, evictions, and bad setups in one line."""

import pytest

from pfcxl.errors import ServingError
from pfcxl.serving import traces
from pfcxl.serving.hosts_sim import UNBOUNDED, HostsSetup, replay_hosts
from pfcxl.serving.routing import ROUTINGS

from tests.replay_cases import DOZEN, HAND, requests

pytestmark = pytest.mark.unit


def trace_of(lists, step_ms=1000):
    return traces.Trace("hand", 512, tuple(requests(lists, step_ms)))


@pytest.mark.parametrize("cache,routing", sorted(HAND))
def test_the_dozen_gives_the_hand_computed_hits_per_host(cache, routing):
    # the same hand-worked table the store's replay is held to (tests/replay_cases.py)
    r = replay_hosts(HostsSetup(trace_of(DOZEN), 3, cache, routing))
    assert [(h["hits"], h["own"], h["other"]) for h in r.hosts] == HAND[(cache, routing)]
    assert sum(r.hits) == sum(h["hits"] for h in r.hosts)


@pytest.mark.parametrize("routing", ROUTINGS)
def test_one_shared_host_is_one_local_host(routing):
    trace = traces.load(traces.bundled("synthetic"))
    trace = traces.Trace(trace.name, trace.block_tokens, trace.requests[:400])
    for capacity in (UNBOUNDED, 300):
        local = replay_hosts(HostsSetup(trace, 1, "local", routing, capacity))
        shared = replay_hosts(HostsSetup(trace, 1, "shared", routing, capacity))
        assert local.hits == shared.hits and local.hosts == shared.hosts


def test_local_hosts_never_load_another_hosts_block_and_shared_stores_each_block_once():
    trace = traces.load(traces.bundled("conversation"))
    trace = traces.Trace(trace.name, trace.block_tokens, trace.requests[:500])
    distinct = len({b for r in trace.requests for b in r.hash_ids[:trace.blocks(r)]})
    local = replay_hosts(HostsSetup(trace, 4, "local", "round-robin"))
    shared = replay_hosts(HostsSetup(trace, 4, "shared", "round-robin"))
    assert all(h["other"] == 0 for h in local.hosts)
    assert shared.summary()["overall"]["stored"] == distinct          # nothing evicted: each block once
    assert shared.summary()["hit_rate"] >= local.summary()["hit_rate"]
    for r in (local, shared):
        o = r.summary()["overall"]
        assert o["blocks"] == o["hits"] + o["present"] + o["stored"] and o["evictions"] == 0


def test_a_small_cache_evicts_and_counts_it():
    trace = traces.load(traces.bundled("synthetic"))
    trace = traces.Trace(trace.name, trace.block_tokens, trace.requests[:400])
    big = replay_hosts(HostsSetup(trace, 2, "local", "session"))
    small = replay_hosts(HostsSetup(trace, 2, "local", "session", capacity_blocks=50))
    o = small.summary()["overall"]
    assert o["evictions"] > 0 and o["hits"] < big.summary()["overall"]["hits"]
    # what stays cached is what was stored less what was evicted, at most the capacity per host
    assert o["stored"] - o["evictions"] <= 2 * 50


@pytest.mark.parametrize("field,value,words", [
    ("hosts", 0, "--hosts: 0 must be"), ("hosts", 2.5, "--hosts: 2.5 must be"),
    ("cache", "global", "--cache: 'global' must be one of local, shared"),
    ("routing", "random", "--routing: 'random' must be one of round-robin, session, prefix"),
    ("capacity_blocks", 0, "0 blocks per host must be 1 or more"),
    ("window_ms", -1, "--window: -1 must not be negative")])
def test_a_bad_setup_is_one_line(field, value, words):
    kw = dict(trace=trace_of(DOZEN), hosts=3)
    kw[field] = value
    with pytest.raises(ServingError) as e:
        HostsSetup(**kw)
    assert words in str(e.value) and "\n" not in str(e.value)
