"""The serving model (pfcxl.serving): its inputs, mechanics, calibration and CLI. No VM; seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from pfcxl.errors import ServingError
from pfcxl.serving import calibrate, chunks, compute, inputs, mechanisms, sim, tiers
from pfcxl.serving.chunks import KV_CHUNK_TOKENS

from . import bounded_cli

GiB = 1 << 30
WORKLOAD = inputs.load_workload("paper-chat")
MODEL = inputs.load_model(WORKLOAD.model)
GPU = inputs.load_gpu(WORKLOAD.gpu)
APPLIANCE = inputs.load_tier(WORKLOAD.appliance)
HOST = inputs.load_tier(WORKLOAD.host)
TFLOPS = mechanisms.published_prefill_tflops(GPU) * 1e12

pytestmark = pytest.mark.component


def run(tier=HOST, sessions=20, seed=1, workload=WORKLOAD, flops=TFLOPS):
    return sim.simulate(sim.ServingSetup(workload, MODEL, GPU, tier, sessions, flops, seed))


# --------------------------------------------------------------------------- inputs


@pytest.mark.parametrize("name, per_token, seed_gib", [("llama-405b", 516_096, 48), ("llama-8b", 131_072, 12),
                                                      ("llama-70b", 327_680, None)])
def test_kv_bytes_per_token_follow_the_published_configs_and_the_seed(name, per_token, seed_gib):
    model = inputs.load_model(name)
    assert model.kv_bytes_per_token == per_token
    if seed_gib:   # the seed's "48 GB / 12 GB per 100K tokens" are binary gigabytes
        assert round(model.kv_bytes_per_token * 100_000 / GiB) == seed_gib


def test_every_shipped_input_loads():
    for kind, loader in (("models", inputs.load_model), ("gpus", inputs.load_gpu), ("tiers", inputs.load_tier),
                         ("workloads", inputs.load_workload)):
        assert inputs.shipped_names(kind)
        for name in inputs.shipped_names(kind):
            assert loader(name).name == name


GOOD_MODEL = inputs.resolve("models", "llama-8b").read_text()


@pytest.mark.parametrize("kind, text, words", [
    ("models", GOOD_MODEL.replace("layers = 32", "layers = -3"), ["layers", "-3", "whole number from 1 to 1,024"]),
    ("models", GOOD_MODEL.replace("kv_heads = 8\n", ""), ["kv_heads", "missing"]),
    ("models", GOOD_MODEL.replace("head_dim = 128", 'head_dim = "128"'), ["head_dim", "'128'"]),
    ("models", GOOD_MODEL + "kv_head = 8\n", ["kv_head", "unknown field"]),
    ("models", GOOD_MODEL.replace("dtype_bytes = 2", "dtype_bytes = 3"), ["dtype_bytes", "1, 2 or 4"]),
    ("models", "layers = [", ["not valid TOML"]),
    ("tiers", 'kind = "ssd"\ncapacity_tb = 2\n', ["kind", "'ssd'", "appliance, host-dram"]),
    ("tiers", 'kind = "appliance"\ncapacity_tb = 0\n', ["capacity_tb", "from 0.001 to 1,000,000"]),
    ("tiers", 'kind = "appliance"\ncapacity_tb = 1\ngranularity_kib = 3\n', ["granularity_kib", "power of two"]),
    ("workloads", inputs.resolve("workloads", "paper-chat").read_text().replace("qps = 0.02", "qps = -1"),
     ["qps", "-1"]),
    ("workloads", inputs.resolve("workloads", "paper-chat").read_text().replace("gpus = 8", "gpus = 0"),
     ["deployment.gpus", "0"]),
])
def test_a_bad_input_file_gets_one_line_naming_the_file_and_field(tmp_path, kind, text, words):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    loader = {"models": inputs.load_model, "tiers": inputs.load_tier, "workloads": inputs.load_workload}[kind]
    with pytest.raises(ServingError) as exc:
        loader(path)
    message = str(exc.value)
    assert "\n" not in message and message.startswith("bad.toml: ")
    for word in words:
        assert word in message


# --------------------------------------------------------------------------- mechanics


def test_hit_rate_is_full_when_capacity_exceeds_the_working_set():
    """With a 32 TB tier every chunk ever stored is found again, and the hit rate is exactly the
    workload's ceiling: each turn finds the whole chunks of its previous turn's prompt (the first
    turn, the shared prefix)."""
    result = run(APPLIANCE, sessions=20)
    summary = result.summary()
    assert summary["hit_of_reusable"] == 1.0
    expected = sum(chunks.whole_chunks(sim.prompt_tokens(WORKLOAD, t.turn - 1)) * KV_CHUNK_TOKENS if t.turn
                   else WORKLOAD.system_prefix_tokens for t in result.turns)
    assert sum(t.hit_tokens for t in result.turns) == expected
    assert 0.80 < summary["hit_rate"] < 0.82       # the paper's 82%, less the partial chunks recomputed
    small = run(replace(APPLIANCE, capacity_tb=0.05), sessions=20).summary()
    assert small["hit_of_reusable"] < 0.5          # the same run without room does miss


def test_ttft_is_monotone_in_the_miss_rate():
    points = []
    for tb in (0.02, 0.1, 0.2, 0.25, 0.3, 0.4, 1.0):
        s = run(replace(HOST, capacity_tb=tb), sessions=20).summary()
        points.append((1 - s["hit_rate"], s["ttft_ms"]["mean"]))
    points.sort()
    assert len({round(m, 3) for m, _ in points}) >= 4, points     # the sweep spans several miss rates
    for (m1, t1), (m2, t2) in zip(points, points[1:]):
        assert t2 >= t1, points
    assert points[-1][1] > 2 * points[0][1]


def test_the_same_seed_gives_the_same_result():
    a, b = run(sessions=30, seed=7), run(sessions=30, seed=7)
    assert a.turns == b.turns and a.to_json() == b.to_json()
    assert run(sessions=30, seed=8).turns != a.turns


def test_doubling_appliance_bandwidth_never_increases_ttft():
    double = replace(APPLIANCE, bandwidth_scale=2.0)
    cbytes = chunks.chunk_bytes(MODEL.kv_bytes_per_token)
    one, two = tiers.appliance_chunk_seconds(APPLIANCE, cbytes), tiers.appliance_chunk_seconds(double, cbytes)
    assert two < one
    assert one == pytest.approx(cbytes / 128e9, rel=0.01)       # the host's 128 GB/s PCIe Gen6 link bounds it
    a, b = run(APPLIANCE, sessions=20), run(double, sessions=20)
    by_turn = {(t.session, t.conversation, t.turn): t for t in b.turns}
    assert len(by_turn) == len(a.turns)
    for t in a.turns:
        assert by_turn[t.session, t.conversation, t.turn].ttft_s <= t.ttft_s
    assert b.summary()["ttft_ms"]["mean"] < a.summary()["ttft_ms"]["mean"]
    # and under pressure (evictions, queueing), on average
    tight = replace(APPLIANCE, capacity_tb=0.2)
    assert (run(replace(tight, bandwidth_scale=2.0), sessions=30).summary()["ttft_ms"]["mean"]
            <= run(tight, sessions=30).summary()["ttft_ms"]["mean"])


def test_prefill_flops_count_weights_and_causal_attention():
    m = inputs.load_model("llama-8b")
    assert compute.prefill_flops(m, 1, 0) == pytest.approx(2 * 8.03e9 + 4 * 32 * 32 * 128 * 1)
    # attending to a cached prefix costs more than the same tokens alone
    assert compute.prefill_flops(m, 1000, 5000) > compute.prefill_flops(m, 1000, 0)


def test_weights_that_do_not_fit_are_refused_with_one_line():
    with pytest.raises(ServingError, match="llama-405b needs 810 GB of weights; 2 x h200"):
        compute.gpu_kv_bytes(MODEL, GPU, 2, 0.9)


def test_calibrate_is_an_opt_in_fit_that_reaches_the_paper_and_is_not_stored():
    fitted = calibrate.fit(WORKLOAD)
    assert abs(fitted.fitted_ms - calibrate.target_ms(WORKLOAD)) <= calibrate.TOLERANCE_MS
    assert fitted.prefill_tflops_per_gpu != pytest.approx(mechanisms.published_prefill_tflops(GPU), rel=0.01)
    assert not hasattr(calibrate, "save")


# --------------------------------------------------------------------------- CLI


def pfcxl(*args):
    return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", "serving", *args], capture_output=True,
                          text=True, timeout=300)


def test_cli_sweep_writes_the_table_json_and_plots(tmp_path):
    done = pfcxl("--model", "llama-70b", "--sessions", "10..20:10", "--appliance-tb", "8", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [(r["tier"], r["sessions"]) for r in doc["comparison"]] == [
        ("appliance", 10), ("appliance", 20), ("host", 10), ("host", 20)]
    assert all(r["paper_ttft_ms"] is None for r in doc["comparison"])          # not the paper's setup
    assert {r["model"] for r in doc["runs"]} == {"llama-70b"} and doc["runs"][0]["tier"]["capacity_tb"] == 8
    for name in ("ttft.png", "hit_rate.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "llama-70b" in done.stdout and "appliance" in done.stdout


BAD_INPUT = [
    (["--sessions", "0..5"], ["--sessions", "'0..5'"]),
    (["--tiers", "ssd"], ["--tiers", "'ssd'"]),
    (["--appliance-tb", "-1"], ["--appliance-tb", "-1.0"]),
    (["--model", "llama-9b"], ["no model named 'llama-9b'"]),
    (["--calibrate", "--model", "llama-8b"], ["--calibrate", "paper's setup"]),
    (["--sweep", "nonsense"], ["--sweep", "'nonsense'", "call_overhead_us"]),
    (["--store-answer", "--trace", "conversation"], ["--store-answer", "session model"]),
]


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> dict:
    """The refused command lines of this module, all in one child process (bounded_cli: the CLI's
    imports paid once), each with its own --out: case -> (outcome, its --out)."""
    bad = tmp_path_factory.mktemp("model") / "mine.toml"
    bad.write_text(GOOD_MODEL.replace("attention_heads = 32", "attention_heads = 0"))
    argvs = {tuple(args): args for args, _ in BAD_INPUT} | {("bad model",): ["--model", str(bad)]}
    outs = {case: tmp_path_factory.mktemp("case") / "out" for case in argvs}
    done = bounded_cli.run_named({case: ["serving", *argv, "--out", str(outs[case])] for case, argv in argvs.items()},
                                 limit=1 << 30)
    return {case: (done[case], outs[case]) for case in argvs}


@pytest.mark.parametrize("args, words", BAD_INPUT)
def test_cli_bad_input_is_one_line_without_traceback(refused, args, words):
    done, out = refused[tuple(args)]
    assert done.rc == 2, (done.rc, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pfcxl: error: "), done.stderr
    for word in words:
        assert word in lines[0]
    assert not out.exists()


def test_cli_bad_model_file_names_the_file_and_field(refused):
    done, _ = refused[("bad model",)]
    assert done.rc == 2, (done.rc, done.stderr)
    assert done.stderr.strip() == ("pfcxl: error: mine.toml: attention_heads: 0 must be a whole number from 1 to 1,024 "
                                   "(a bound far beyond any published model)")
