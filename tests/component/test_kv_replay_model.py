"""The store's replay (`pfcxl kv replay`, host processes on a pool file) against the serving
model's N-host replay (serving/hosts_sim.py): different code, the same counts request by request
where their policies are the same: room for every block, and one request at a time (distinct
arrival times, so no two hosts share a batch). docs/kvstore.md explains what differs otherwise."""

import pytest

from pfcxl.host_tools.kv import replay as R
from pfcxl.serving import traces
from pfcxl.serving.hosts_sim import HostsSetup, replay_hosts
from pfcxl.serving.routing import ROUTINGS
from pfcxl.serving.traces import Request

from .test_kv_replay import pool

pytestmark = pytest.mark.component

HOSTS = 3


@pytest.fixture(scope="module")
def trace():
    full = traces.load(traces.bundled("conversation"))
    # 300 requests, a second apart: their order and blocks as in the trace
    reqs = tuple(Request(i * 1000, r.input_length, r.output_length, r.hash_ids[:full.blocks(r)])
                 for i, r in enumerate(full.requests[:300]))
    return traces.Trace("conversation-300", full.block_tokens, reqs)


@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("mode", R.MODES)
def test_the_store_and_the_model_agree_request_by_request(tmp_path, trace, mode, routing):
    reqs = list(trace.requests)
    blocks = len({b for r in reqs for b in r.hash_ids})
    # room for every block twice over: each host's index at most a quarter full, so no key finds
    # its 16-slot window full (the store's one eviction the model does not have)
    store = R.run(R.ReplaySetup(pool(tmp_path, size=64 << 20), None, HOSTS, 2 * blocks, 256, routing=routing), reqs, mode)
    model = replay_hosts(HostsSetup(trace, HOSTS, mode, routing))
    assert store["check"]["bad"] == 0 and store["overall"]["evictions"] == 0
    assert store["host_of"] == model.host_of
    assert [r["hits"] for r in store["results"]] == model.hits
    for s, m in zip(store["hosts"], model.hosts):
        assert {k: s[k] for k in ("requests", "hits", "own", "other", "present", "stored")} == \
            {k: m[k] for k in ("requests", "hits", "own", "other", "present", "stored")}
    assert sum(model.hits) > 0
    if mode == "shared" and routing == "round-robin":
        assert store["overall"]["other"] > 0           # the comparison covers loads from other arenas
