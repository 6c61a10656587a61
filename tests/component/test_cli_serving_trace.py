"""`pfcxl serving --trace`, `--capacity-sweep` and `pfcxl serving retrieval` from the command line,
and the retrieval model (pfcxl.serving.retrieval). No VM."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pfcxl.serving import compute, inputs, mechanisms, retrieval

from . import bounded_cli
from tests.unit.test_serving_traces import BAD, GOOD

pytestmark = pytest.mark.component


def pfcxl(*args):
    return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", "serving", *args], capture_output=True,
                          text=True, timeout=300)


def small_trace(tmp_path, n=60):
    """n requests, 2 s apart, in 6 conversations that grow by one 512-token block a turn."""
    lines = []
    for i in range(n):
        conv, turn = i % 6, i // 6
        ids = [1000 * conv + j for j in range(turn + 2)]
        lines.append(json.dumps({"timestamp": 2000 * i, "input_length": 512 * len(ids) - 100, "output_length": 50,
                                 "hash_ids": ids}))
    path = tmp_path / "small.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_trace_run_reports_each_tier_and_writes_json_and_cdf(tmp_path):
    done = pfcxl("--trace", str(small_trace(tmp_path)), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["setup"]["model"] == "llama-70b" and doc["setup"]["kv_bytes_per_token"] == 80 * 8 * 128 * 2 * 2
    for role in ("appliance", "host"):
        run = doc["runs"][role]
        assert run["requests"] == 60 and run["span_s"] == 118
        assert run["hit_rate"] == pytest.approx(run["gpu_hit_rate"] + run["kv_hit_rate"])
        assert run["ttft_ms"]["p50"] <= run["ttft_ms"]["p90"] <= run["ttft_ms"]["p99"]
        assert 0 < run["hit_rate"] < 1
    assert (tmp_path / "out" / "ttft_cdf.png").read_bytes()[:4] == b"\x89PNG"


def test_capacity_sweep_marks_the_ceiling_and_the_tiers(tmp_path):
    done = pfcxl("--trace", str(small_trace(tmp_path)), "--capacity-sweep", "0,1024,2TB", "--sequence-only",
                 "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    caps = [p["kv_capacity_tokens"] for p in doc["sweep"]]
    assert caps == [0, 1024, 2e12 / 327_680]
    rates = [p["hit_rate"] for p in doc["sweep"]]
    assert rates[0] == 0 and rates == sorted(rates) and rates[-1] == doc["ceiling"]["hit_rate"]
    assert "sequence-only" in doc["setup"]["mode"] and "sequence-only" in done.stdout
    assert sorted(doc["setup"]["marks_tokens"].values()) == [2e12 / 327_680, 32e12 / 327_680]
    assert (tmp_path / "out" / "capacity_sweep.png").read_bytes()[:4] == b"\x89PNG"


OPTION_ERRORS = [
    (["--time-scale", "0"], "--time-scale"),
    (["--kv-capacity", "lots"], "--kv-capacity: 'lots'"),
    (["--kv-capacity", "3XB"], "--kv-capacity: '3XB'"),
    (["--capacity-sweep", "1e4,x"], "--capacity-sweep: 'x'"),
    (["--kv-capacity", "1e6", "--capacity-sweep"], "give one"),
    (["--block-tokens", "0"], "--block-tokens"),
    (["--policy", "fifo"], "--policy: 'fifo'"),
    (["--reservation"], "--reservation"),
    (["--hit-accounting", "all"], "--hit-accounting: 'all'"),
]


MISSING = [
    (["--trace", "missing.jsonl"], "no such file"),
    (["--trace", "nope"], "no such bundled trace"),
    (["--sequence-only"], "--sequence-only is a trace-replay option"),
]
HOSTS_ERRORS = [
    (["--hosts", "0"], "--hosts: 0 must be"),
    (["--hosts", "2", "--cache", "global"], "--cache: 'global' must be one of local, shared"),
    (["--hosts", "2", "--capacity-sweep"], "--hosts replays one capacity per host"),
    (["--cache", "local"], "--cache is an option of the N-host replay: use it with --hosts N")]


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> dict:
    """Every refused command line of this module through the real command line, all in one child
    process (bounded_cli: the CLI's imports paid once), each with its own --out: case -> (outcome,
    the case's directory)."""
    trace = small_trace(tmp_path_factory.mktemp("trace"))
    empty = tmp_path_factory.mktemp("empty") / "empty.jsonl"
    empty.write_text("\n")
    disk = tmp_path_factory.mktemp("disk") / "disk.toml"
    disk.write_text('name = "x"\nread_gbs = 3\n')
    argvs = {**{("option", *args): ["--trace", str(trace), *args] for args, _ in OPTION_ERRORS},
             **{("missing", *args): args for args, _ in MISSING},
             **{("hosts", *args): ["--trace", str(trace), *args] for args, _ in HOSTS_ERRORS},
             ("empty",): ["--trace", str(empty)]}
    dirs = {case: tmp_path_factory.mktemp("case") for case in argvs}
    cases = {case: ["serving", *argv, "--out", str(dirs[case] / "out")] for case, argv in argvs.items()}
    cases[("disk",)] = ["serving", "retrieval", "--disk", str(disk)]
    dirs[("disk",)] = disk.parent
    done = bounded_cli.run_named(cases, limit=1 << 30)
    return {case: (done[case], dirs[case]) for case in cases}


def one_line(done, where, *words):
    assert done.rc == 2, (done.argv, done.rc, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pfcxl: error: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert not (where / "out").exists()


@pytest.mark.parametrize("args, words", OPTION_ERRORS)
def test_bad_trace_options_are_one_line(refused, args, words):
    one_line(*refused[("option", *args)], words)


def test_each_bad_trace_line_is_one_cli_line(tmp_path):
    # every bad line of test_serving_traces.BAD through the real command line, all in one child
    # process (bounded_cli: the CLI's imports paid once), each with its own file and --out
    cases, paths = [], []
    for n, (text, words) in enumerate(case for case in BAD if case[1]):
        case_dir = tmp_path / f"case{n}"
        case_dir.mkdir()
        path = case_dir / "t.jsonl"
        path.write_text("\n".join([json.dumps(GOOD), text, json.dumps(GOOD)]) + "\n")
        cases.append(["serving", "--trace", str(path), "--out", str(case_dir / "out")])
        paths.append((path, words))
    outcomes = bounded_cli.run(cases, limit=1 << 30)
    assert len(outcomes) == len(paths) > 20
    for outcome, (path, words) in zip(outcomes, paths):
        line = outcome.one_line_error(2)
        assert f"{path} line 2: " in line and words in line, (outcome.argv, line)
        assert not (path.parent / "out").exists(), outcome.argv


@pytest.mark.parametrize("args, words", MISSING)
def test_missing_trace_or_option_without_trace_is_one_line(refused, args, words):
    one_line(*refused[("missing", *args)], words)


def test_empty_trace_is_an_error_not_zeros(refused):
    one_line(*refused[("empty",)], "no requests")


# --------------------------------------------------------------------------- retrieval (Table I)

H200 = inputs.load_gpu("h200")
HOST = inputs.load_tier("host-dram-2tb")
DISK = retrieval.load_disk("nvme-gen4")
MECH = mechanisms.load(engine="vllm")
FLOPS = mechanisms.published_prefill_tflops(H200) * 1e12


def test_retrieval_point_is_recompute_time_over_load_time():
    model = inputs.load_model("llama-8b")
    p = retrieval.point(model, H200, 1, HOST, DISK, FLOPS, batch=2, context=4096, c=MECH)
    # one pass over two sequences from scratch: dense GEMMs at 43% of 989 TFLOP/s, attention at 60%
    dense = 2 * 2 * 8.03e9 * 4096 / (0.43 * 989e12)
    attention = 2 * 4 * 32 * 32 * 128 * 4096 * 4097 / 2 / (0.6 * 989e12)
    assert model.params_billion == 8.03 and (model.layers, model.attention_heads, model.head_dim) == (32, 32, 128)
    assert p.recompute_s == pytest.approx(dense + attention)
    # vLLM: 2 x 256 blocks x 32 layers x (K, V) cudaMemcpyAsync calls at 5 us; the bytes alone take less
    calls = 2 * 256 * 32 * 2
    assert p.host_s == pytest.approx(calls * 5e-6)
    assert 2 * 4096 * 131_072 / (63e9 * 0.83) < p.host_s
    assert p.disk_s == pytest.approx(2 * 4096 * 131_072 / 7.45e9 + p.host_s)


def test_retrieval_keeps_only_what_fits_and_speedup_grows_with_context():
    model = inputs.load_model("llama-70b")
    pts = retrieval.points(model, H200, 2, HOST, DISK, FLOPS, MECH)
    room = compute.gpu_kv_bytes(model, H200, 2, retrieval.UTILISATION)
    assert pts and all(p.batch * p.context * model.kv_bytes_per_token <= room for p in pts)
    for b in retrieval.BATCHES:
        row = [p.host_speedup for p in pts if p.batch == b]
        assert row[-1] > row[0]                 # the quadratic term wins at long contexts
    assert all(p.disk_speedup < p.host_speedup for p in pts)


def test_retrieval_cli_prints_every_paper_row_with_ratios(tmp_path):
    done = pfcxl("retrieval", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "retrieval.json").read_text())
    assert [(r["model"], r["gpu"], r["gpus"]) for r in doc["rows"]] == list(retrieval.PAPER) * 2
    assert [r["engine"] for r in doc["rows"]] == ["lmcache"] * 5 + ["vllm"] * 5
    assert all(r["host"][0] <= r["host"][1] for r in doc["rows"])
    for r in doc["rows"]:                       # the ratio at each end is model over paper
        assert r["host_ratio"] == pytest.approx([r["host"][0] / r["paper_host"][0], r["host"][1] / r["paper_host"][1]])
    off = sum(retrieval.outside(r["host_ratio"]) + retrieval.outside(r["disk_ratio"]) for r in doc["rows"])
    assert off and done.stdout.count("!") >= off
    assert "outside 2x" in done.stdout and "Table I: where the model is still off" in done.stdout


def test_disk_file_must_name_its_source(refused):
    one_line(*refused[("disk",)], "disk.toml: source: missing")


def test_hosts_replay_from_the_command_line_gives_the_hand_computed_hits(tmp_path):
    from tests.replay_cases import DOZEN, HAND
    trace = tmp_path / "dozen.jsonl"
    trace.write_text("".join(json.dumps(dict(timestamp=1000 * i, input_length=512 * len(b), output_length=1,
                                             hash_ids=b)) + "\n" for i, b in enumerate(DOZEN)))
    done = pfcxl("--trace", str(trace), "--hosts", "3", "--routing", "round-robin", "--out", str(tmp_path / "o"))
    assert done.returncode == 0, done.stderr
    runs = json.loads((tmp_path / "o" / "results.json").read_text())["runs"]
    assert [r["hosts"][0]["host"] for r in runs] == [0, 0] and len(runs) == 2      # local, then shared
    for cache, run in zip(("local", "shared"), runs):
        assert [(h["hits"], h["own"], h["other"]) for h in run["hosts"]] == HAND[(cache, "round-robin")]
    assert "3 hosts, routing round-robin" in done.stdout.replace("\n", " ")


@pytest.mark.parametrize("args,words", HOSTS_ERRORS)
def test_hosts_replay_bad_options_are_one_line(refused, args, words):
    done, where = refused[("hosts", *args)]
    assert done.rc != 0 and words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr and not isinstance(done.rc, str), done.rc     # not escaped
    assert not (where / "out").exists()
