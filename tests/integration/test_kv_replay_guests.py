"""`pfcxl kv replay --on guests` (host_tools/kv/replay_guest.py): the replay's hosts are kvreplay
processes (the store's C core) in guests of a real appliance, fed through mailboxes in its pool.
Two guests replay a slice of the conversation trace; their counts must be the host processes'
(`--on host`, the Python store) request by request, since each request runs alone. With
--fabric the appliance models the guests' traffic and every finished request gets a TTFT."""

import dataclasses
import os

import pytest

import pfcxl
from pfcxl.device import topology
from pfcxl.host_tools.kv import replay as R
from pfcxl.host_tools.kv import replay_guest as G
from pfcxl.serving import traces

pytestmark = pytest.mark.integration


def one_at_a_time(n):
    """The trace's first n requests a second apart: one request per batch, no races."""
    reqs = traces.load(traces.bundled("conversation")).requests[:n]
    return [dataclasses.replace(r, timestamp_ms=i * 1000) for i, r in enumerate(reqs)]


def on_guests(setup, reqs, data_path, fabric=None):
    path = topology.resolve("pf-appliance")
    with pfcxl.Appliance("pf-appliance", fabric=fabric) as app:
        return G.run_on_guests(topology.load(path), path, setup, reqs, R.MODES, data_path=data_path,
                               fabric=fabric, say=print, appliance_dir=app.run_dir)


def test_two_guests_on_the_direct_path_count_what_the_host_processes_count(tmp_path):
    reqs = one_at_a_time(30)
    # ahead=0: each batch after the one before; with evictions, a host that ran ahead would evict
    # sooner than the trace's order says, and the counts would depend on the hosts' speed
    setup = R.ReplaySetup("", None, 2, 40, 4096, routing="round-robin", ahead=0)
    guests = on_guests(setup, reqs, "direct")
    pool = tmp_path / "pool"
    pool.write_bytes(b"")
    os.truncate(pool, 64 << 20)
    R.kv.format(str(pool), hosts=2, slots=16, chunk_tokens=512)      # the store the guests' pool got
    for mode, got in zip(R.MODES, guests):
        host = R.run(dataclasses.replace(setup, path=str(pool)), reqs, mode)
        for key in ("mode", "hosts", "overall", "host_of", "results", "check"):
            assert got[key] == host[key], key
        o = got["overall"]
        assert o["requests"] == 30 and o["bad"] == 0 and o["checked"] == o["hits"] and got["check"]["bad"] == 0
        for st in got["lookups"]:                  # kvreplay's lookups read at most a window per host
            assert 0 < st["index_lines"] <= st["lookups"] * R.kv.WINDOW * 2
    assert guests[0]["overall"]["evictions"] > 0 and guests[0]["overall"]["other"] == 0
    assert guests[1]["overall"]["other"] > 0                   # shared: hosts load each other's blocks


def test_timed_guests_on_the_cxl_path_get_modelled_figures_and_a_ttft_per_request():
    from pfcxl.host_tools.kv import replay_report as kv_replay_report
    reqs = one_at_a_time(8)
    out = on_guests(R.ReplaySetup("", None, 2, 40, 4096), reqs, "cxl", fabric="pf")
    for result in out:
        tm = result["timing"]
        assert tm["fabric"] == "pf" and tm["dropped"] == 0 and tm["model_s"] > 0
        assert [h["host"] for h in tm["hosts"]] == [0, 1]
        assert all(h["bytes"] > 0 and h["reads"] > 0 and h["read_p50_ns"] > 0 and h["rate_gbs"] > 0
                   for h in tm["hosts"])
        s = kv_replay_report.summary(result, reqs, "llama-70b", 512)
        per = s["timing"]["ttft"]["per_request_ms"]
        assert sorted(per) == list(range(8)) and all(v > 0 for v in per.values())
        assert result["overall"]["bad"] == 0 and result["check"]["bad"] == 0
