"""pfcxl bench end to end: real guests, real benchmarks, the fabric models fed by the traced
accesses; failures are named and the other results kept."""

import json

import pytest

from pfcxl.host_tools.bench import report as bench_report

from .conftest import pfcxl_cli

pytestmark = pytest.mark.integration
PNG = b"\x89PNG\r\n\x1a\n"


def results(path):
    return json.loads((path / "results.json").read_text())


def test_quick_suite_reproduces_the_papers_idle_table(tmp_path):
    out = tmp_path / "pf"
    done = pfcxl_cli("bench", "--topology", "pf-nic", "--timing", "trace", "--out", str(out), timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    data = results(out)
    env = data["environment"]
    for key in ("pfcxl", "qemu", "kernel", "topology", "timing_mode", "host_cpu", "suite", "image"):
        assert env[key], key
    assert env["timing_mode"] == "trace" and env["topology"] == "pf-nic"
    runs = {r["name"]: r for r in data["results"]}
    assert set(runs) == {f"{t}/{s}" for t in ("idle_latency", "loaded_latency", "bandwidth") for s in ("cxl", "local")}
    assert all(r["status"] == "ok" for r in runs.values())
    chase = runs["idle_latency/cxl"]
    assert chase["data"]["visited_lines_per_lap"] == chase["data"]["lines"]
    pf = chase["modelled"]["pf"]
    assert pf["read"]["p50"] == 283 and pf["write"]["p50"] == 224            # the paper's idle figures
    assert pf["idle_terms_ns"] == {"read": [24, 212, 47], "write": [24, 153, 47]}
    assert chase["modelled"]["reads"] >= chase["data"]["read"]["loads"]      # every measured load was traced
    assert all(r["bytes_moved"] == r["bytes_requested"] for r in runs["bandwidth/cxl"]["data"]["results"])
    assert runs["idle_latency/local"]["modelled"] == {}                      # local memory is not traced
    for png in ("latency_cdf.png", "loaded_latency.png", "bandwidth.png", "latency_bandwidth.png"):
        assert (out / png).read_bytes()[:8] == PNG
    for label in ("measured in emulator", "modelled PF appliance", "modelled electrical switch pool", "local DRAM"):
        assert label in done.stdout
    assert_modelled_rows(runs, done.stdout)


def assert_modelled_rows(runs, stdout):
    """Every loaded-latency and bandwidth row of the CXL runs carries the modelled figures the
    report prints: its captured stream replayed at its nominal load on each system."""
    loaded, bw = runs["loaded_latency/cxl"], runs["bandwidth/cxl"]
    assert len(loaded["modelled"]["rows"]) == len(loaded["data"]["rows"])
    for data, m in zip(loaded["data"]["rows"], loaded["modelled"]["rows"]):
        assert m["chase_requests"] > 0 and m["traffic_requests"] > 0
        for system in ("pf", "electrical", "dram"):
            assert m[system]["chase_loads"] >= 1
            low = "low-sample: " if m[system]["chase_loads"] < bench_report.MIN_CHASE_LOADS else ""
            assert f"{m[system]['latency_p50_ns']:.0f} ({low}{m[system]['chase_loads']} loads)" in stdout
        assert m["pf"]["latency_p50_ns"] < m["electrical"]["latency_p50_ns"]
    light = loaded["modelled"]["rows"][-1]                  # the longest delay: traffic far below any link
    assert light["pf"]["latency_p50_ns"] == pytest.approx(283, abs=1)
    assert len(bw["modelled"]["rows"]) == len(bw["data"]["results"]) > 0
    for m in bw["modelled"]["rows"]:
        # offered the host link's rate: the full mesh carries more than the switch link lets through
        assert m["pf"]["gbs"] > 1.5 * m["electrical"]["gbs"]
        assert f"{m['pf']['gbs']:.1f}" in stdout and f"{m['electrical']['gbs']:.1f}" in stdout
    knee = bw["modelled"]["curve"]["electrical"]["knee"]
    assert knee and f"{knee['offered_gbs']:.1f}" in stdout


def test_electrical_switch_lands_in_belugas_range(tmp_path):
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps([{"name": "idle_latency/cxl", "system": "cxl", "timeout": 600,
                                  "command": "idle_latency --target {dax} --span 4M --mode read --laps 1"}]))
    out = tmp_path / "el"
    done = pfcxl_cli("bench", "--topology", "electrical-switch", "--suite", str(suite), "--timing", "trace",
                     "--out", str(out), timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    modelled = results(out)["results"][0]["modelled"]
    assert 800 <= modelled["electrical"]["read"]["p50"] <= 900
    assert modelled["pf"]["read"]["p50"] == 283


def test_both_data_paths_get_a_column_each_and_a_crash_and_a_hang_are_named(tmp_path):
    """One suite on --data-path both (one guest, rebooted once): the CXL bandwidth run is repeated
    on the direct device, each in a column of its own; then a benchmark that crashes and one that
    hangs are named, the guest is rebooted after the hang, and every other result is kept."""
    suite = tmp_path / "suite.json"
    command = "bandwidth --target {target} --pattern seq,random --op read,write --sizes 64,1024 --bytes 256K --span 4M"
    suite.write_text(json.dumps([
        {"name": "bandwidth/cxl", "system": "cxl", "timeout": 600,
         "command": command.format(target="{dax}") + " --mark-rows 1"},
        {"name": "bandwidth/local", "system": "local", "timeout": 600, "command": command.format(target="anon")},
        {"name": "crasher", "system": "local", "timeout": 120, "command": "sh -c 'kill -SEGV $$'"},
        {"name": "hanger", "system": "local", "timeout": 5, "command": "sleep 600"},
        {"name": "after", "system": "local", "timeout": 120, "command": "idle_latency --target anon --span 1M"},
    ]))
    out = tmp_path / "both"
    done = pfcxl_cli("bench", "--suite", str(suite), "--data-path", "both", "--out", str(out), timeout=1200)
    assert done.returncode == 1, done.stderr[-3000:]                             # two benchmarks failed
    assert "Traceback" not in done.stderr
    data = results(out)
    assert data["environment"]["data_path"] == "both"
    runs = {r["name"]: r for r in data["results"]}
    assert list(runs) == ["bandwidth/cxl", "bandwidth/direct", "bandwidth/local", "crasher", "hanger", "after"]
    # the runs before the crash and the one after the hang (the guest rebooted) are ok; only the two failed
    assert [name for name, r in runs.items() if r["status"] != "ok"] == ["crasher", "hanger"], runs
    assert runs["crasher"]["status"] == "failed" and "benchmark crasher exited with status" in runs["crasher"]["error"]
    assert runs["hanger"]["status"] == "error" and "benchmark hanger" in runs["hanger"]["error"]
    assert "did not finish within 5s" in runs["hanger"]["error"]
    assert "crasher" in done.stdout and "hanger" in done.stdout                 # the table of failures
    # the direct run used the direct device the guest reported, not the CXL one
    assert runs["bandwidth/direct"]["command"] != runs["bandwidth/cxl"]["command"]
    for name in ("bandwidth/cxl", "bandwidth/direct"):
        rows = runs[name]["data"]["results"]
        assert len(rows) == 8 and all(r["bytes_moved"] == r["bytes_requested"] for r in rows), name
    assert "direct device (measured in emulator) MB/s" in done.stdout
    # without --timing trace the CXL rows are still captured and modelled, one per row
    modelled = runs["bandwidth/cxl"]["modelled"]["rows"]
    assert len(modelled) == 8 and all(m["pf"]["gbs"] > m["electrical"]["gbs"] > 0 for m in modelled)
    assert runs["bandwidth/local"]["modelled"] == {}
