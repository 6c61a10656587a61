"""`pfcxl serving` on hostile inputs: every input is bounded (with why) and checked before any work,
so each ends in one line (exit 2) in bounded time and memory; what runs writes strict JSON and keeps
its clock where float seconds resolve a TTFT."""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import replace

import pytest

from pfcxl.errors import ServingError
from pfcxl.serving import bounds, inputs, sim

from . import bounded_cli
from .test_serving import GPU, HOST, MODEL, TFLOPS, WORKLOAD

DATA = inputs.DATA

pytestmark = pytest.mark.component


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return repr(v)


def edited(tmp_path, kind: str, name: str, key: str, value, tag: str) -> str:
    """A copy of a shipped input with `key` set to `value` (added if the file lacks it)."""
    text = (DATA / kind / f"{name}.toml").read_text()
    line = f"{key} = {toml_value(value)}"
    new, count = re.subn(rf"^{re.escape(key)} = .*$", lambda _: line, text, flags=re.M)
    if not count:                   # an optional field: top-level keys go before the first table
        head, sep, tail = text.partition("\n[")
        new = f"{head}\n{line}\n{sep}{tail}"
    path = tmp_path / f"{tag}.toml"
    path.write_text(new)
    return str(path)


FLAG = {"models": "--model", "gpus": "--gpu", "tiers": "--appliance", "workloads": "--workload"}
QUICK = ["serving", "--sessions", "1", "--tiers", "host,appliance"]


def test_the_issues_inputs_are_one_line_each(tmp_path):
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    cases = {
        "capacity_tb": ["--appliance", edited(tmp_path, "tiers", "appliance-32tb", "capacity_tb", math.inf, "a")],
        "--appliance-bw-scale": ["--appliance-bw-scale", "1e-300"],
        "modules": ["--appliance", edited(tmp_path, "tiers", "appliance-32tb", "modules", 10 ** 9, "b")],
        "granularity_kib": ["--appliance", edited(tmp_path, "tiers", "appliance-32tb", "granularity_kib", 2 ** 40, "c")],
        "nested too deeply": ["--model", str(deep)],
        "--seed": ["--seed=-1"],
        "--sessions": ["--sessions", "1000000000"],
        "input_tokens": ["--workload", edited(tmp_path, "workloads", "paper-chat", "input_tokens", 10 ** 12, "d")],
        "turns": ["--workload", edited(tmp_path, "workloads", "paper-chat", "turns", 2 ** 63 - 1, "e")],
        "rounds": ["--workload", edited(tmp_path, "workloads", "paper-chat", "rounds", 10 ** 9, "f")],
        "output_tokens": ["--workload", edited(tmp_path, "workloads", "paper-chat", "output_tokens", 10 ** 15, "g")],
        "system_prefix_tokens": ["--workload", edited(tmp_path, "workloads", "paper-chat", "system_prefix_tokens",
                                                      10 ** 12, "h")],
        "'1..1000000000'": ["--sessions", "1..1000000000"],
        "1e-300 requests/s": ["--qps", "1e-300"],
        "1e-300 TFLOP/s": ["--prefill-tflops", "1e-300"],
    }
    outcomes = bounded_cli.run([["serving", *args, "--out", str(tmp_path / "out")] for args in cases.values()],
                               limit=1 << 30, timeout=60)
    for words, o in zip(cases, outcomes):
        line = o.one_line_error(2)
        assert words in line and ("must be" in line or "at most" in line or "nested" in line), line
    assert not (tmp_path / "out").exists()                  # refused before any work


@pytest.mark.parametrize("line, shown", [('"a\\nb" = 1', "'a\\nb': unknown field"),
                                         ('name = "x\\ny"', "name: 'x\\ny' must be a non-empty string of printable"),
                                         ('[paper."t\\nx"]', "paper.'t\\nx': unknown table")])
def test_a_key_or_name_with_a_newline_stays_on_one_line(tmp_path, line, shown):
    path = tmp_path / "nl.toml"
    text = (DATA / "workloads" / "paper-chat.toml").read_text().replace('name = "paper-chat"\n', "")
    path.write_text(f"{text}\n{line}\n" if line.startswith("[") else f"{line}\n{text}")   # a key at the top
    with pytest.raises(ServingError) as info:
        inputs.load_workload(path)
    assert "\n" not in str(info.value) and shown in str(info.value), str(info.value)


def test_each_turns_ttft_is_its_waits_and_work_in_every_accepted_run():
    # at a request rate the bounds accept, a turn's TTFT is its link wait, load, GPU wait and
    # prefill: float seconds still resolve it (at 1e-300 requests/s they did not: TTFT 0)
    for qps in (1e-3, 2e-5):
        w = replace(WORKLOAD, qps=qps, rounds=2, turns=3)
        bounds.check(w, MODEL, GPU, [HOST], [4], TFLOPS / 1e12)
        for t in sim.simulate(sim.ServingSetup(w, MODEL, GPU, HOST, 4, TFLOPS, 1)).turns:
            parts = t.link_wait_s + t.load_s + t.gpu_wait_s + t.prefill_s
            assert t.prefill_s > 0 and t.ttft_s == pytest.approx(parts, rel=1e-9)
    with pytest.raises(ServingError, match="simulated clock"):
        bounds.check(replace(WORKLOAD, qps=1e-300), MODEL, GPU, [HOST], [4], TFLOPS / 1e12)


def test_combinations_beyond_the_bounds_are_refused_before_simulating():
    long = replace(WORKLOAD, turns=1000, input_tokens=2000)
    with pytest.raises(ServingError, match="turn 1000 sends a 2,500,012-token prompt"):
        bounds.check(long, MODEL, GPU, [HOST], [1], 300)
    with pytest.raises(ServingError, match="1,000,000 turns"):
        bounds.check(WORKLOAD, MODEL, GPU, [HOST], [100_000], 300)
    wide = replace(MODEL, layers=1024, kv_heads=1024, head_dim=4096, dtype_bytes=4)
    with pytest.raises(ServingError, match="granules of 1 KiB"):
        bounds.check(WORKLOAD, wide, GPU, [replace(HOST, kind="appliance", granularity_kib=1)], [1], 300)


def hostile_case(rng: random.Random, tmp_path, i: int) -> list[str]:
    """One command line with one input set to a value from a hostile pool (mostly out of bounds)."""
    ints = [0, -1, 2 ** 63 - 1, 2 ** 64, 10 ** 9, 10 ** 12, True, "x", 1.5, math.inf]
    floats = [math.inf, -math.inf, math.nan, 1e-300, 1e300, 0, -1.0, "x", True]
    fields = {"models": ("llama-8b", inputs.MODEL_FIELDS), "gpus": ("h200", inputs.GPU_FIELDS),
              "tiers": ("appliance-32tb", {**inputs.TIER_FIELDS, **inputs.TIER_OPTIONAL_FIELDS}),
              "workloads": ("paper-chat", {**inputs.WORKLOAD_FIELDS, **inputs.DEPLOYMENT_FIELDS})}
    pick = rng.random()
    if pick < 0.6:
        kind = rng.choice(list(fields))
        name, spec = fields[kind]
        key = rng.choice(list(spec))
        pool = ints if spec[key][0] is int else floats if spec[key][0] is float else ints + floats
        return [FLAG[kind], edited(tmp_path, kind, name, key, rng.choice(pool), f"f{i}")]
    if pick < 0.9:
        flag = rng.choice(["--qps", "--appliance-tb", "--host-tb", "--appliance-bw-scale", "--prefill-tflops",
                           "--gpus", "--seed", "--sessions"])
        whole = flag in ("--gpus", "--seed", "--sessions")
        value = rng.choice(["0", "-1", str(2 ** 63), "1000000000", "100001"] if whole else
                           ["inf", "-inf", "nan", "1e-300", "1e300", "0", "-1", "1e-9"])
        if flag == "--sessions":
            value = rng.choice([value, f"1..{value}", f"1..100000:{rng.choice(['1', '2', '999'])}", ",".join(["1"] * 101)])
        return [f"{flag}={value}"]          # '=': argparse would take '-1' for an option
    depth = rng.choice([200, 2000, 20000])
    path = tmp_path / f"deep{i}.toml"
    path.write_text(rng.choice(["x = " + "[" * depth + "]" * depth, "[" + ".".join(["a"] * depth) + "]",
                                "x = " + "{a = " * depth + "1" + "}" * depth]) + "\n")
    return [rng.choice(list(FLAG.values())), str(path)]


def strict(text: str):
    def refuse(word):
        raise ValueError(f"{word} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_hostile_serving_inputs_are_one_line_in_bounded_time_and_memory(tmp_path):
    # a generated set over every field of every input file and every option
    rng = random.Random(19)
    cases = [[*QUICK, *hostile_case(rng, tmp_path, i), "--out", str(tmp_path / f"out{i}")] for i in range(45)]
    refused = 0
    for i, o in enumerate(bounded_cli.run(cases, limit=1 << 30, timeout=90)):
        if o.rc == 0:                          # a value that happened to be in bounds: it ran
            doc = strict((tmp_path / f"out{i}" / "results.json").read_text())
            assert all(r["ttft_ms"] > 0 for r in doc["comparison"]), o.argv
        else:
            o.one_line_error(2)
            assert not (tmp_path / f"out{i}").exists(), o.argv
            refused += 1
    assert refused > len(cases) // 2
