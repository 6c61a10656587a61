"""Machine.traced_run, the one traced-run sequence the CLI, the bench, multihost and the paper
bandwidth script use (host_tools/timing/traced_run.py), in a real pf-nic guest with the plugin in trace mode:
a command is bracketed into exactly one phase whose counts are the records drained for it, the
markers add nothing to its output, the session drains on so the next command gets only its own
records, and a command that marks its rows itself is cut into them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pfcxl.errors import PfcxlError

pytestmark = pytest.mark.integration

TOUCHES = [(300, 200), (40, 10)]        # cxl_touch reads, writes: one traced run each


@pytest.mark.pfcxl(topology="pf-nic", timing="trace")
def test_a_traced_run_is_one_phase_with_its_own_records_and_rows_cut_by_phase(pfcxl_machine):
    m = pfcxl_machine
    for reads, writes in TOUCHES:
        traced = m.traced_run(f"cxl_touch --reads {reads} --writes {writes} --seed 5 --no-mark", timeout=900)
        assert traced.result.ok, traced.result.output
        lines = traced.result.output.splitlines()
        assert [json.loads(line)["tool"] for line in lines if line.startswith("{")] == ["cxl_touch"]
        assert [(p["reads"], p["writes"]) for p in traced.phases] == [(reads, writes)]
        got = traced.records
        assert len(got) == reads + writes and int((got["write"] == 0).sum()) == reads
        report = traced.model(dependent=True)
        assert (report["reads"], report["writes"]) == (reads, writes)
        assert report["pf"]["read"]["count"] == reads and report["pf"]["write"]["count"] == writes
        assert traced.emulator_cost()["ns_per_request"] > 0         # labelled emulator overhead
    assert traced.appliance_figures() is None                       # no appliance models this host

    # a command that marks its rows: not bracketed, each row one phase, the records cut by them
    sizes = (64, 256)
    traced = m.traced_run(f"bandwidth --target /dev/dax0.0 --pattern seq --op read --sizes {','.join(map(str, sizes))} "
                          "--bytes 64K --span 64K --threads 1 --mark-rows 1", timeout=900)
    assert traced.result.ok and traced.phases == [], traced.result.output
    rows = json.loads(next(line for line in traced.result.output.splitlines() if line.startswith("{")))["results"]
    pieces = traced.rows(len(rows))
    assert len(pieces) == len(sizes) and sum(len(p) for p in pieces) == len(traced.records) > 0
    assert all(len(p) for p in pieces)                                         # every row traced
    assert np.array_equal(np.concatenate(pieces), traced.records)
    # a row more than it ran: every phase it ran was in when rows() above returned, so asking for
    # one more fails without waiting for a phase that cannot come
    with pytest.raises(PfcxlError, match="phases"):
        traced.rows(len(rows) + 1, timeout=0)


def test_a_machine_nothing_traces_runs_the_command_as_it_is(shared_machine):
    plain = shared_machine("pf-nic")      # the session's pf-nic guest without timing: echo changes nothing
    traced = plain.traced_run("echo plain")
    assert (traced.result.output, traced.records, traced.phases) == ("plain\n", None, [])
    with pytest.raises(PfcxlError, match=f"^{plain.name}: only a trace-mode run has records to model"):
        traced.model()
    with pytest.raises(PfcxlError, match=f"^{plain.name}: nothing traces this machine"):
        plain.traced_run("echo plain", bracket=True)
