"""The serving model's mechanisms (pfcxl.serving.mechanisms) on hand-computed cases, LLMServingSim's
two KV mechanisms, the overload notice, and the rule that every constant names a published source
and none is a figure of the paper it is checked against. No VM; seconds."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace

import pytest

from pfcxl.errors import ServingError
from pfcxl.serving import inputs, mechanisms, retrieval, sim
from pfcxl.serving.kvpolicy import Policy

pytestmark = pytest.mark.component

H200, A100 = inputs.load_gpu("h200"), inputs.load_gpu("a100")
M8, M405 = inputs.load_model("llama-8b"), inputs.load_model("llama-405b")
LMCACHE, VLLM = mechanisms.load(), mechanisms.load(engine="vllm")
GEN5 = 63e9 * 0.83


def test_vllm_loads_pay_one_call_per_block_per_layer_for_k_and_v():
    # 1,024 tokens = 64 blocks of 16; x 32 layers x (K, V) = 4,096 calls of 5 us = 20.48 ms; the 134 MB
    # alone would take 2.57 ms at Gen5's effective 52.3 GB/s
    assert mechanisms.load_seconds(M8, H200, 1, 1024, VLLM) == pytest.approx(4096 * 5e-6)


def test_lmcache_loads_are_bandwidth_bound_per_chunk_and_layer():
    # 4 chunks x 32 layers = 128 calls (0.64 ms) < 134,217,728 B at 52.29 GB/s (2.567 ms)
    assert mechanisms.load_seconds(M8, H200, 1, 1024, LMCACHE) == pytest.approx(1024 * 131_072 / GEN5)


def test_pageable_host_memory_halves_the_link_rate():
    pageable = replace(LMCACHE, pinned=False)
    assert mechanisms.load_seconds(M8, H200, 1, 1024, pageable) == pytest.approx(1024 * 131_072 / (GEN5 * 0.5))


def test_each_pcie_generation_has_its_effective_fraction_of_the_raw_rate():
    assert mechanisms.link_gbs(A100, LMCACHE) == pytest.approx(31.5 * 0.8)
    assert mechanisms.link_gbs(H200, LMCACHE) == pytest.approx(63 * 0.83)
    with pytest.raises(ServingError, match="host_link_gbs 50 is no PCIe x16 rate"):
        mechanisms.link_gbs(replace(H200, host_link_gbs=50), LMCACHE)


def test_eight_gpus_share_the_host_dram_bandwidth():
    cheap = replace(LMCACHE, call_overhead_us=1e-3)          # the byte side alone
    per_gpu = 65536 * 126 * 2 * 1 * 128 * 2                  # one KV head per GPU, K and V, 126 layers
    shared = mechanisms.load_seconds(M405, H200, 8, 65536, cheap, source_gbs=307.2)
    assert shared == pytest.approx(per_gpu / (307.2e9 / 8))  # 38.4 GB/s each, below the link's 52.3
    private = mechanisms.load_seconds(M405, H200, 8, 65536, replace(cheap, shared_host_memory=False),
                                      source_gbs=307.2)
    assert private == pytest.approx(per_gpu / GEN5)


def test_a_small_prefill_is_memory_bound_and_tensor_parallel_adds_all_reduce_latency():
    # one token of 8B: 2 x 8.03e9 FLOPs take 37.8 us at 43% of 989 TFLOP/s, but the 16.06 GB of
    # weights take 3.346 ms from 4.8 TB/s HBM; the attention side is one token's KV read (27 ns)
    one = mechanisms.prefill_seconds(M8, H200, 1, 1, 0, 0.43 * 989e12, LMCACHE)
    assert one == pytest.approx(16.06e9 / 4.8e12 + 131_072 / 4.8e12)
    # 405B on 8 GPUs: + 126 layers x 2 all-reduces x 15 us = 3.78 ms over the weights' 21.1 ms
    tp = mechanisms.prefill_seconds(M405, H200, 8, 1, 0, 0.43 * 989e12, LMCACHE)
    assert tp == pytest.approx(810e9 / (8 * 4.8e12) + 516_096 / (8 * 4.8e12) + 126 * 2 * 15e-6)
    # a large prefill reaches the measured fraction: 8,192 tokens, dense + causal attention
    big = mechanisms.prefill_seconds(M8, H200, 1, 8192, 0, 0.43 * 989e12, LMCACHE)
    attention = 4 * 32 * 32 * 128 * 8192 * 8193 / 2
    assert big == pytest.approx(2 * 8.03e9 * 8192 / (0.43 * 989e12) + attention / (0.6 * 989e12))


SMALL = replace(inputs.load_workload("paper-chat"), turns=2, input_tokens=512, output_tokens=256,
                system_prefix_tokens=0, qps=0.01, rounds=3, model="llama-8b", gpus=1)


def turn_hits(policy: Policy) -> set[int]:
    tier = inputs.load_tier("host-dram-2tb")
    result = sim.simulate(sim.ServingSetup(SMALL, M8, H200, tier, 1, 425e12, 1, policy))
    return {t.hit_tokens for t in result.turns if t.turn == 1}


def test_storing_the_answer_lets_the_next_turn_find_it():
    # turn 1 sends 512 + 256 + 512 tokens; turn 0 stored 2 whole chunks of its 512-token prompt, and
    # with the answer stored, whole chunks of 512 + 256 = 3 chunks (768 tokens)
    assert turn_hits(Policy()) == {512}
    assert turn_hits(Policy(store_answer=True)) == {768}
    assert turn_hits(Policy("radix-lru", True, store_answer=True)) == {768}


def two_sessions(scope: str) -> tuple[list[int], list[int]]:
    """Sessions A and B, 8-block prompts reserving 9 blocks, then 17-block prompts reserving 18, in a
    20-block KV tier (no GPU tier): the KV tier's size after each store, and each second turn's hits."""
    from pfcxl.serving.kvpolicy import TwoTiers
    tiers = TwoTiers(Policy("radix-lru", True, reservation_scope=scope), 0, 20)
    kv = tiers.kv
    a, b = [("a", j) for j in range(17)], [("b", j) for j in range(17)]
    sizes, hits = [], []
    for name, keys in (("A", a), ("B", b)):
        tiers.lookup(keys[:8], name + "0", 9, name)
        tiers.store(keys[:8], name + "0")
        tiers.finish(name + "0", name, last=False)
        sizes.append(len(kv))
    for name, keys in (("A", a), ("B", b)):
        hits.append(tiers.lookup(keys, name + "1", 18, name).kv)
    return sizes, hits


def test_a_session_reservation_is_held_across_the_think_time():
    # per request: A's 8 blocks (unreserved after its answer) are the LRU victim when B's prefix and
    # reservation need room (8 + 8 + 9 > 20), and B's when A's second turn reserves 18 (8 + 18 > 20)
    assert two_sessions("request") == ([8, 8], [0, 0])
    # per session: A still holds its 9 blocks and its lock, so B's 8 blocks do not fit beside the two
    # reservations (8 + 8 + 18 > 20) and are not kept; when A returns it releases its old
    # reservation and finds its 8 blocks, and B finds nothing
    assert two_sessions("session") == ([8, 8], [8, 0])
    with pytest.raises(ServingError, match="--reservation-scope"):
        Policy("radix-lru", False, reservation_scope="session")


# --------------------------------------------------------------------------- constants' sources

def paper_figures() -> set[float]:
    """Every number of the paper's Table I and serving table, as the model keeps them."""
    figures = {v for host, disk in retrieval.PAPER.values() for pair in (host, disk) if pair for v in pair}
    for tiers in inputs.load_workload("paper-chat").paper.values():
        for points in tiers.values():
            figures.update(points.values())
    return figures | {165.0, 2690.0, 0.82, 82.0, 6.35, 0.0635}


def test_every_constant_names_a_published_source_and_none_is_a_paper_figure():
    sources = mechanisms.read_sources()
    assert set(sources) == set(mechanisms.NUMERIC)
    figures = paper_figures()
    for name, s in sources.items():
        assert s.kind in mechanisms.KINDS and len(s.source) > 40, name
        assert not re.search(r"the paper|table i\b|photonic|marvell|2607\.27187", s.source, re.I), name
        assert s.value not in figures, name
    assert not (inputs.DATA / "calibration.toml").exists()
    measured = [n for n, s in sources.items() if s.kind == "measured"]
    assert "dense_fraction" in measured and "call_overhead_us" in measured


def test_a_constant_without_its_source_is_refused(tmp_path):
    bad = tmp_path / "constants.toml"
    bad.write_text((mechanisms.CONSTANTS.read_text()).replace('kind = "measured"\nsource = "Wu', 'kind = "measured"\nsourcex = "Wu'))
    with pytest.raises(ServingError, match="call_overhead_us: must have value, kind and source"):
        mechanisms.read_sources(bad)


# --------------------------------------------------------------------------- overload notice

def serving(*args):
    return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", "serving", *args],
                          capture_output=True, text=True, timeout=300)


def test_an_overloaded_engine_is_said_in_one_line_with_a_time_scale(tmp_path):
    done = serving("--tiers", "host", "--sessions", "300", "--qps", "0.2", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = [x for x in done.stderr.splitlines() if "engine overloaded" in x]
    assert len(lines) == 1 and "--time-scale" in lines[0]
    assert re.search(r"--time-scale [0-9.]+", lines[0])
    calm = serving("--tiers", "host", "--sessions", "100", "--out", str(tmp_path / "calm"))   # 0.02 requests/s
    assert calm.returncode == 0 and "engine overloaded" not in calm.stderr


def test_sweep_writes_a_table_and_a_plot(tmp_path):
    done = serving("retrieval", "--engine", "vllm", "--sweep", "call_overhead_us=2.5,5,10", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "call_overhead_us" in done.stdout and "llama-405b" in done.stdout
