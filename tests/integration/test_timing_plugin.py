"""The TCG plugin in real guests (pf-nic): exact request counts and addresses in trace and count
mode, its overhead on a workload that never touches CXL, and injected latency seen by an
in-guest pointer chase.

The numbers printed here (run with -s to see them) are measurements on a shared TCG host; only
the counts are asserted exactly. The injection test asserts what no load can change: a chase
never runs faster than the latency injected into each of its loads; it prints how the measured
difference between the PF and electrical profiles compares with the modelled one.
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from pfcxl.device.topology import address_map
from pfcxl.device.fabric import model as fabric_model
from pfcxl.device import topology
from pfcxl.host_tools.timing import calibration
from pfcxl.host_tools.timing import config as timing
from pfcxl.host_tools.timing import plugin as timing_plugin
from pfcxl.guest.tool_output import json_lines, tool_json, tool_prefix

pytestmark = pytest.mark.integration

TOPOLOGY = "pf-nic"
READS, WRITES = 1000, 500
# idle reads, 283 and 833 ns: photonic fabric vs electrical switch
PF_READ_NS, ELECTRICAL_READ_NS = fabric_model.idle_ns("pf", False), fabric_model.idle_ns("electrical", False)
CHASE = calibration.CALIBRATION_COMMAND   # in-TLB dependent chase over the DAX device
ROUNDS = 3   # the overhead is printed, not asserted: the medians of 3 rounds show it
INJECT_ROUNDS = 9   # a chase run takes 10-30 ms: more of them cost little and steady the minimum


@pytest.fixture
def timed(boot):
    """timed(config or None, name) -> (machine, its timing session or None): a ready pf-nic guest
    with the plugin."""
    def _boot(config: timing.TimingConfig | None, name: str):
        machine = boot(TOPOLOGY, vm_name=name, timing=config)
        return machine, machine.timing

    return _boot


def guest(vm, command: str, tool: str) -> dict:
    result = vm.run(command, timeout=900)
    assert result.status == 0, f"{command}: status {result.status}\n{result.output}"
    return tool_json(result.output, tool)


def guest_lines(vm, command: str, tool: str, n: int) -> list[dict]:
    """A guest command that runs `tool` n times (one console round trip for all): its n result
    lines, in order."""
    result = vm.run(command, timeout=900)
    assert result.status == 0, f"{command}: status {result.status}\n{result.output}"
    found = json_lines(result.output, tool_prefix(tool))
    assert len(found) == n, f"{command}: {len(found)} {tool} lines, expected {n}\n{result.output}"
    return found


def test_trace_has_exactly_the_guests_accesses(timed):
    topo = topology.load(topology.resolve(TOPOLOGY))
    dax = address_map.dax_placements(topo)[0]
    window = address_map.window_placements(topo)[0]
    doorbell = timing_plugin.doorbell_hpa(topo)
    # a small ring: the guest fills it several times and the plugin must wait for the drainer
    vm, session = timed(timing.TimingConfig("trace", capacity=256), "trace")
    touch = guest(vm, f"cxl_touch --reads {READS} --writes {WRITES} --seed 3", "cxl_touch")
    phase = session.wait_phases(1)[0]
    records = session.stop()
    # the plugin slept through the boot (no memory callbacks) and init's `pfcxl_mark arm` woke it
    # before the guest reported ready: the accesses above were all seen
    events = session.events()
    assert next(e for e in events if e["event"] == "start")["armed"] == 0
    assert [e["event"] for e in events].index("armed") < [e["event"] for e in events].index("phase")

    assert (phase["reads"], phase["writes"], phase["records"]) == (READS, WRITES, READS + WRITES)
    assert len(records) == READS + WRITES and session.ring.dropped == 0
    reads, writes = records[records["write"] == 0], records[records["write"] == 1]
    assert (len(reads), len(writes)) == (READS, WRITES)
    hpa = records["hpa"].astype(np.int64)
    assert ((hpa >= window.base) & (hpa < window.base + window.size)).all()
    assert ((hpa >= dax.base) & (hpa < dax.base + dax.size)).all()
    assert (hpa % 64 == 0).all() and not (hpa == doorbell).any()
    assert len(np.unique(hpa)) == READS + WRITES              # distinct lines, as the guest chose
    # the very lines the guest touched: offsets from the DAX device's base add up to its sums
    assert int((reads["hpa"] - dax.base).sum()) == touch["read_offsets_sum"]
    assert int((writes["hpa"] - dax.base).sum()) == touch["write_offsets_sum"]
    assert (records["size"] == 8).all() and (records["vcpu"] == 0).all() and (records["host"] == 0).all()
    assert (np.diff(records["insn"].astype(np.int64)) > 0).all()   # stamps advance
    assert (records["write"][:READS] == 0).all()                   # loads first, then stores
    print(f"\ntrace: {len(records)} records, insn stamps {int(records['insn'][0])}..{int(records['insn'][-1])}")


LOCAL_WORK = {   # workloads that never touch CXL; each run lasts some seconds of guest time under TCG
    # stays in the softmmu TLB, every iteration a dependent load: the plugin's worst case
    "small chase": "chase --local --lines 32 --span 2M --loads 1000000",
    # misses the TLB on every load
    "large chase": "chase --local --lines 4096 --span 16M --loads 100000",
}


def test_count_mode_counts_the_same_and_local_work_adds_nothing(timed, shared_machine):
    """Count mode: each phase carries the guest's counts, and nothing outside the phases is
    counted. The same count-mode guest then measures the plugin's overhead on workloads that never
    touch CXL, against the session's pf-nic guest without the plugin (local memory only, nothing
    changed): the two take turns, so the shared host's load drifts over both alike. Those chases
    must add no phase and no request to what the plugin counted when it exits."""
    vm, session = timed(timing.TimingConfig("count"), "count")
    guest(vm, f"cxl_touch --reads {READS} --writes {WRITES} --seed 3", "cxl_touch")
    guest(vm, "cxl_touch --reads 20 --writes 10 --seed 4 --span 2M", "cxl_touch")
    first, second = session.wait_phases(2)
    assert (first["reads"], first["writes"], first["bytes"]) == (READS, WRITES, 8 * (READS + WRITES))
    assert (second["reads"], second["writes"]) == (20, 10)
    assert first["vcpus"] == [{"vcpu": 0, "reads": READS, "writes": WRITES, "bytes": 8 * (READS + WRITES)}]

    plain = shared_machine(TOPOLOGY)
    both = " && ".join(LOCAL_WORK.values())      # one guest command runs every workload once
    ns = {(who, label): [] for who in ("plain", "counted") for label in LOCAL_WORK}
    for _ in range(ROUNDS):
        for who, machine in (("plain", plain), ("counted", vm)):
            chases = guest_lines(machine, both, "chase", len(LOCAL_WORK))
            for label, chase in zip(LOCAL_WORK, chases):
                assert chase["where"] == "local", chase
                ns[who, label].append(chase["ns"])
    assert all(v > 0 for runs in ns.values() for v in runs), ns
    report = []
    for label in LOCAL_WORK:
        p, c = statistics.median(ns["plain", label]), statistics.median(ns["counted", label])
        report.append(f"{label} {c / p:.2f}x ({p / 1e6:.1f} -> {c / 1e6:.1f} ms)")
    print("\nplugin overhead, count mode vs no plugin (guest wall clock, medians of "
          f"{ROUNDS}): " + ", ".join(report))

    vm.close()
    exit_line = next(e for e in session.events() if e["event"] == "exit")
    assert exit_line["phases"] == 2, f"the local chases opened a phase: {exit_line}"
    # nothing outside the phases was counted: boot, the tools' setup stores and the local chases
    assert (exit_line["reads"], exit_line["writes"]) == (READS + 20, WRITES + 10), (
        f"the plugin counted requests outside the two cxl_touch phases: {exit_line}")


def test_injected_latency_is_a_floor_under_every_load(timed):
    """Inject mode busy-waits on the TSC for each CXL request, so the guest's chase, timed by the
    same TSC, can never run faster than the injected latency per load: other work on the shared
    host only stretches a run. With baseline 0 the plugin injects the whole modelled latency, so
    that floor is the model's figure itself, which no load on the machine can break. Profile 0
    injects nothing and is the emulator's own cost, measured in the same guest; the difference
    against the model is printed (a measurement, not asserted: it depends on the host's load)."""
    config = timing.TimingConfig("inject", read_ns=(0.0, PF_READ_NS, ELECTRICAL_READ_NS), baseline_ns=0.0)
    vm, session = timed(config, "inject")
    runs: dict[int, list[float]] = {0: [], 1: [], 2: []}
    # interleaved, so drift on the shared host hits all alike; one guest command runs them all
    rounds = " ".join(str(r) for r in range(INJECT_ROUNDS))
    profiles = " ".join(str(p) for p in runs)
    chases = guest_lines(vm, f"for r in {rounds}; do for p in {profiles}; do {CHASE} --profile $p || exit; done; done",
                         "chase", INJECT_ROUNDS * len(runs))
    for n, chase in enumerate(chases):
        assert chase["profile"] == n % len(runs) and chase["where"] == "dax", chase
        runs[chase["profile"]].append(chase["ns_per_load"])
    start = next(e for e in session.events() if e["event"] == "start")
    spins = [p["read_spin_ns"] for p in start["profiles"]]
    assert spins == pytest.approx([0.0, PF_READ_NS, ELECTRICAL_READ_NS], abs=1.0), start["profiles"]
    emulator, pf_ns, el_ns = (min(runs[k]) for k in (0, 1, 2))
    print(f"\ninject (baseline 0, fastest of {INJECT_ROUNDS}): emulator alone {emulator:.0f} ns/load, "
          f"PF {pf_ns:.0f} (+{pf_ns - emulator:.0f}), electrical {el_ns:.0f} (+{el_ns - emulator:.0f}); "
          f"electrical - PF {el_ns - pf_ns:.0f} ns against {ELECTRICAL_READ_NS - PF_READ_NS:.0f} modelled")
    # the TSC rates of the plugin's spin and of the guest's clock are each calibrated to ~0.1%
    for name, modelled, measured in (("PF", PF_READ_NS, runs[1]), ("electrical", ELECTRICAL_READ_NS, runs[2])):
        assert min(measured) >= 0.97 * modelled, (
            f"a chase under the {name} profile ran at {min(measured):.0f} ns/load, below the "
            f"{modelled:.0f} ns the plugin injects into every CXL read: {measured}")
    # and the injection is what separates them: the un-injected runs, with the same emulator
    # cost, are faster than the electrical floor on any machine where the emulator costs less
    if emulator < 0.97 * ELECTRICAL_READ_NS:
        assert emulator < min(runs[2]), runs
    # calibrate_baseline, what Machine runs for inject mode without a baseline, on profile 0 (no
    # spin, the plugin's per-request work as in count mode): the median of its runs
    cal = calibration.calibrate_baseline(vm, f"{CHASE} --profile 0", runs=3)
    assert len(cal["runs"]) == 3 and all(r > 0 for r in cal["runs"]), cal
    assert cal["baseline_ns"] == sorted(cal["runs"])[1], cal


def test_inject_without_a_baseline_measures_it_first_under_a_name_of_its_own(tmp_path):
    """`--timing inject` with no --baseline-ns (as the help text documents) boots a count-mode
    guest first, measures the emulator's cost per CXL request there, and hands that to the plugin
    of the guest that runs the command. The profile is the one that is not the default, so the
    option is seen to reach the plugin; every profile's latencies are tests/unit/test_labels_and_help.py's.
    The run shares its --run-dir with another run whose calibrating guest holds the name
    'calibrate' (held here: the name is an flock, so this process holds it against the CLI's):
    this run's count-mode guest takes calibrate-1, so the plugin event log its baseline is read
    from (and its console and QEMU logs) are its own. Both were named 'calibrate' before."""
    from pfcxl.host_tools.vm.guest_names import guest_name
    from .conftest import pfcxl_cli
    profile = "electrical"
    run_dir = tmp_path / "run"
    (run_dir / "calibrate").mkdir(parents=True)
    with guest_name(run_dir / "calibrate", "calibrate") as held:      # the other run's calibrating guest
        assert held == "calibrate"
        done = pfcxl_cli("run", "-t", TOPOLOGY, "--timing", "inject", "--inject-profile", profile,
                         "--run-dir", str(run_dir), "--", "chase", "--lines", "64", "--loads", "2000")
    assert done.returncode == 0, done.stderr
    start = next(e for e in timing.plugin_events(timing.plugin_log(run_dir, "guest")) if e["event"] == "start")
    probe = timing.plugin_events(timing.plugin_log(run_dir / "calibrate", "calibrate-1"))
    # the measuring guest ran, in count mode, under a name of its own
    assert [e["mode"] for e in probe if e["event"] == "start"] == ["count"], probe
    assert not (run_dir / "calibrate" / "calibrate.console.log").exists()
    assert start["mode"] == "inject" and start["baseline_ns"] > 0, start
    assert start["profiles"][0]["read_ns"] == fabric_model.idle_ns(profile, False), start
