"""`pfcxl bench compare` on what is not two bench results (another tool's results, bytes that are
not JSON, mutated files): one line each, in bounded time and memory; and on two bench results: rows
labelled by what they measured, metrics of one file only listed."""

from __future__ import annotations

import pytest
import copy
import json
import math
import random

from . import bounded_cli
from tests.unit.test_bench_report import render, sample
from pfcxl.host_tools.bench import report as bench_report

COLUMNS = ("pf", "electrical", "dram")

pytestmark = pytest.mark.component


def with_modelled_rows(results: dict, scale: float = 1.0) -> dict:
    """`results` with modelled figures for every bandwidth and loaded-latency row (as bench_model writes)."""
    out = copy.deepcopy(results)
    runs = {r["name"]: r for r in out["results"]}
    bw = runs["bandwidth/cxl"]
    bw["modelled"]["rows"] = [{"load": 5.0, "offered_gbs": 128.0, **{s: {"gbs": scale * (10 * i + k + 1)}
                                                                    for k, s in enumerate(COLUMNS)}}
                              for i in range(len(bw["data"]["results"]))]
    loaded = runs["loaded_latency/cxl"]
    loaded["modelled"] = {"rows": [{"offered_gbs": 1.0, **{s: {"latency_p50_ns": scale * (300 + i), "chase_loads": 7}
                                                            for s in COLUMNS}} for i in range(len(loaded["data"]["rows"]))]}
    return out


def write(path, doc) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


SERVING = {"calibration": {"prefill_tflops_per_gpu": 400.0}, "comparison": [{"tier": "appliance", "sessions": 50}],
           "runs": [{"model": "llama-70b", "sessions": 50}]}


def test_the_issues_files_are_one_line_each(tmp_path):
    good = write(tmp_path / "good.json", sample())
    bad_utf8 = tmp_path / "latin1.json"
    bad_utf8.write_bytes(b'{"environment": {"topology": "caf\xe9"}}')
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    cases = {write(tmp_path / "list.json", []): "the document must be an object",
             write(tmp_path / "empty.json", {}): "environment must be an object",
             str(bad_utf8): "not UTF-8",
             str(deep): "nested too deeply",
             write(tmp_path / "serving.json", SERVING): "is a `pfcxl serving` result",
             write(tmp_path / "no-results.json", {"environment": {}}): "results must be a list",
             write(tmp_path / "bad-run.json", {"environment": {}, "results": [7]}): "results[0] must be an object",
             write(tmp_path / "nameless.json", {"environment": {}, "results": [{}]}): "results[0].name must be text"}
    outcomes = bounded_cli.run([["bench", "compare", path, good] for path in cases], limit=1 << 30)
    for (path, words), o in zip(cases.items(), outcomes):
        line = o.one_line_error(1)
        assert path in line and words in line, line


def mutate(doc, rng: random.Random):
    """`doc` with one randomly chosen value (anywhere in it) replaced by a hostile one."""
    doc = copy.deepcopy(doc)
    spots, todo = [], [doc]
    while todo:
        node = todo.pop()
        keys = range(len(node)) if isinstance(node, list) else list(node) if isinstance(node, dict) else ()
        for k in keys:
            spots.append((node, k))
            todo.append(node[k])
    node, key = rng.choice(spots)
    node[key] = rng.choice([None, "x", [], {}, -1, 0, True, 1e308, math.nan, math.inf, [[[[1]]]], {"a": {}},
                            "é" * 100, 2 ** 70])
    return doc


def test_mutated_results_compare_or_fail_in_one_line_in_bounded_time_and_memory(tmp_path):
    # a generated set: one value anywhere in a results file replaced (by null, a string, a list,
    # a number out of range, NaN, ...); compare either works or says which field is wrong
    base = with_modelled_rows(sample())
    good = write(tmp_path / "good.json", base)
    rng = random.Random(20)
    cases = [["bench", "compare", write(tmp_path / f"m{i}.json", mutate(base, rng)), good] for i in range(60)]
    cases += [["bench", "compare", good, c[2]] for c in cases[:20]]
    outcomes = bounded_cli.run(cases, limit=1 << 30)
    failed = 0
    for o in outcomes:
        if o.rc == 0:
            assert "B / A" in o.stdout and not o.stderr, (o.argv, o.stderr)
        else:
            line = o.one_line_error(1)
            mutated = o.argv[2] if o.argv[3] == good else o.argv[3]
            assert line.startswith(f"pfcxl: error: {mutated}: not a pfcxl bench results file: "), line
            failed += 1
    assert 0 < failed < len(outcomes)           # both kinds happened: the set tests something


def test_compare_labels_modelled_rows_by_what_they_measured_and_lists_one_sided_metrics():
    a = with_modelled_rows(sample())
    b = with_modelled_rows(sample(2.0), scale=2.0)
    b["results"] = [r for r in b["results"] if r["name"] != "idle_latency/local"]
    text = render([bench_report.compare(a, b)])
    assert " row " not in text
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in x.strip().strip("│").split("│")]
                                              for x in text.splitlines()) if len(cells) == 4}
    assert rows["bandwidth/cxl seq read 64B x1 modelled PF appliance (DDR5 path) GB/s"] == ["11.0", "22.0", "2.00"]
    assert rows["loaded_latency/cxl delay 2000 local DRAM (model, context) chase p50 ns"] == ["301.0", "602.0", "2.00"]
    assert rows["idle_latency/local read ns"] == ["700.0", "-", "-"]          # in A only
    assert rows["idle_latency/local write ns"] == ["800.0", "-", "-"]
    assert "only in A: 2 metrics, only in B: 0" in text
