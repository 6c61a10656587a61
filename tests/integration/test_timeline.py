"""Several timed guests in one virtual timeline (device/plugin/pfcxl_timeline.h): an appliance
started with a quantum keeps its --clock virtual hosts in step, so one host's traffic shows in
another's own clock. Two timed pf-appliance guests (and one on the emulator's clock, which stays
out) run rounds of a cold chase on host 0 beside a sequential stream on host 1.

On the PF appliance every host has its own path to each module: the stream leaves the chase at
the idle latency, and the offline engine's replay of both hosts' traced requests says the same.
On the electrical pool the two hosts share one switch uplink; at the default constants a
single core's stream (48 misses in flight, about 3.7 GB/s) hardly loads its 64 GB/s, so the
test narrows it with a what-if (switch_link_mbs=2000): the stream is then held to the uplink's
bandwidth and the chase waits behind it, in the guests' own clocks, as long as the offline
engine's replay of both hosts' requests says."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pfcxl import Machine
from pfcxl.appliance import Appliance
from pfcxl.device.appliance import timeline
from pfcxl.guest.tool_output import tool_json
from pfcxl.host_tools.timing import vtime
from pfcxl.host_tools.bench import virtual_loaded
from pfcxl.host_tools.fleet.timed import bracketed, offline_latency_ns, run_round
from pfcxl.host_tools.vm.boot_options import BootOptions

pytestmark = pytest.mark.integration

TOPOLOGY = "pf-appliance"
LOADS = 3000
# each in a phase of its own from its first command on (pfcxl_mark on dax0.0's doorbell), so both
# join the round at the same point of their command; the stream reads the host's private region
CHASE = f"chase --cold --lines {LOADS} --span 64M --loads {LOADS}"
STREAM = "chase --dax /dev/dax1.0 --stream --no-mark --span 64M --loads {loads}"
NARROW = ("switch_link_mbs=2000",)


@pytest.fixture(scope="module", params=[("pf", ()), ("electrical", NARROW)], ids=["pf", "electrical"])
def fleet(request, tmp_path_factory):
    fabric, what_if = request.param
    said: list[str] = []
    with Appliance(TOPOLOGY, quantum_ns=1000, temporary=True) as app:
        timed = [Machine(TOPOLOGY, host=h, appliance=app.directory, clock="virtual", fabric=fabric, timing="trace",
                         fabric_params=what_if, name=f"t{h}", ready_timeout=300,
                         run_dir=tmp_path_factory.mktemp(f"t{h}")) for h in range(2)]
        untimed = Machine(TOPOLOGY, host=2, appliance=app.directory, name="u2", ready_timeout=300,
                          progress=said.append, run_dir=tmp_path_factory.mktemp("u2")) if fabric == "pf" else None
        machines = timed + ([untimed] if untimed else [])
        try:
            for m in machines:
                m.launch()
            for m in machines:
                m.wait_ready()
            yield {"fabric": fabric, "what_if": what_if, "hosts": timed, "untimed": untimed, "said": said,
                   "timeline": timeline.path_in(app.directory)}
        finally:
            for m in machines:
                m.close()


def round_of(fleet, commands: list[str]) -> list:
    """One round: commands[h] on host h, all started together; their traced runs."""
    return run_round(fleet["hosts"], fleet["timeline"], commands)


def chase_row(run) -> dict:
    return tool_json(run.result.output.splitlines()[0], "chase")


def offline_walk_ns(fleet, runs) -> float:
    """The offline engine's replay of every host's traced requests of the round, on the timeline's
    clock: host 0's walk, its last reads."""
    return offline_latency_ns(fleet["hosts"], runs, fleet["fabric"], fleet["what_if"], last=LOADS)


def test_a_chase_beside_a_stream_pays_only_what_the_fabric_shares(fleet):
    topo = fleet["hosts"][0].topology
    idle = vtime.expected_idle_ns(topo, fleet["fabric"], what_if=vtime.params(fleet["what_if"]))
    alone = chase_row(round_of(fleet, [CHASE])[0])
    assert alone["p50_ns_per_load"] == pytest.approx(idle, rel=0.01)
    runs = round_of(fleet, [CHASE, STREAM.format(loads=400_000)])
    loaded, stream = chase_row(runs[0]), chase_row(runs[1])
    if fleet["fabric"] == "pf":
        # its own path to every module: nothing the stream does reaches the chase, and the
        # offline engine, replaying both hosts' requests together, agrees
        assert loaded["p50_ns_per_load"] == pytest.approx(idle, rel=0.01)
        assert offline_walk_ns(fleet, runs) == pytest.approx(loaded["ns_per_load"], rel=0.10)
    else:
        # the shared uplink: the stream gets its bandwidth (64 B a line), the chase queues behind it
        uplink_ns_per_line = 64 / 2.0
        assert stream["p50_ns_per_load"] == pytest.approx(uplink_ns_per_line, rel=0.03)
        assert loaded["p50_ns_per_load"] > 1.3 * alone["p50_ns_per_load"]
        # what the guest's clock paid agrees with the offline engine's replay of both hosts'
        # requests (before the charge also held up the requests in flight, it paid about 70%)
        assert offline_walk_ns(fleet, runs) == pytest.approx(loaded["ns_per_load"], rel=0.10)
        # the same round again (a new start, the same requests) reads the same in both clocks: to
        # 0.2% (the guests' interrupts are not all in step: rounds differed by up to 0.10% in the
        # runs measured since a charge also holds up the requests in flight; unaligned starts, 0.9%)
        again = round_of(fleet, [CHASE, STREAM.format(loads=400_000)])
        # (in TSC ticks, which under --clock virtual are virtual ns with no calibration in them)
        assert chase_row(again[0])["p50_ticks_per_load"] == pytest.approx(loaded["p50_ticks_per_load"], rel=0.002)
        assert chase_row(again[1])["p50_ticks_per_load"] == pytest.approx(stream["p50_ticks_per_load"], rel=0.002)
    state = timeline.read(fleet["timeline"])
    assert {h["host"] for h in state["hosts"]} == {0, 1} and not state["started"]
    assert state["hosts"][1]["contention_ns"] > 0 or fleet["fabric"] == "pf"


def test_a_cold_chase_in_the_hosts_private_region_pays_the_fabric(fleet):
    """dax1.0, the host's private region: its doorbell empties the modelled caches too (it was
    unknown to the plugin, and the chase's lines hit at 8 ns)."""
    topo = fleet["hosts"][0].topology
    idle = vtime.expected_idle_ns(topo, fleet["fabric"], what_if=vtime.params(fleet["what_if"]))
    private = chase_row(round_of(fleet, [f"chase --dax /dev/dax1.0 --no-mark --cold --lines {LOADS} --span 64M "
                                         f"--loads {LOADS}"])[0])
    assert private["p50_ns_per_load"] == pytest.approx(idle, rel=0.01)


def test_a_sleep_lasts_as_long_in_the_timeline_as_in_the_guest(fleet):
    """Host 0 sleeps 50 ms of its own clock (its vCPU halts; icount's sleep=off jumps the clock at
    once), then chases; host 1's stream, 13 ms of virtual time, is over by then, whatever the
    hosts' speeds: the chase reads the idle latency."""
    if fleet["fabric"] != "electrical":
        pytest.skip("on the electrical fleet, where the stream would slow the chase")
    topo = fleet["hosts"][0].topology
    idle = vtime.expected_idle_ns(topo, "electrical", what_if=vtime.params(fleet["what_if"]))
    before = timeline.read(fleet["timeline"])["quanta"]
    runs = round_of(fleet, [f"sleep 0.05; {CHASE}", STREAM.format(loads=400_000)])
    assert chase_row(runs[0])["p50_ns_per_load"] == pytest.approx(idle, rel=0.01)
    hosts = {h["host"]: h for h in timeline.read(fleet["timeline"])["hosts"]}
    assert hosts[0]["left_quantum"] - before > 50_000 > hosts[1]["left_quantum"] - before


def test_a_host_on_the_emulators_clock_stays_out_in_one_line(fleet):
    if fleet["untimed"] is None:
        pytest.skip("the untimed host boots beside the pf fleet only")
    lines = [s for s in fleet["said"] if "stays out of the appliance's timeline" in s]
    assert len(lines) == 1 and "--clock virtual" in lines[0]
    result = fleet["untimed"].run(bracketed("true"), timeout=120)
    assert result.status == 0
    assert 2 not in {h["host"] for h in timeline.read(fleet["timeline"])["hosts"]}


def test_a_paced_stream_loads_the_chase_as_the_model_says(fleet):
    """`pfcxl bench --clock virtual -t pf-appliance`'s points (host_tools/bench/virtual_loaded.py) on
    this fleet: host 1's stream at full pace holds the narrowed uplink and host 0's chase waits
    behind it; paced to a sixteenth of the uplink, it leaves the chase near its idle latency.
    Every point agrees with the offline engine's replay of both hosts' requests."""
    if fleet["fabric"] != "electrical":
        pytest.skip("on the electrical fleet, whose narrowed uplink one stream fills")
    options = BootOptions(clock="virtual", fabric="electrical", fabric_params=fleet["what_if"])
    alone, full, paced = virtual_loaded.curve_points(fleet["hosts"], fleet["timeline"], options, gaps=(0, 512))
    assert alone["gap_ticks"] is None and alone["chase_p50_ns"] == pytest.approx(833, rel=0.01)
    assert full["traffic_gbs"] == pytest.approx(2.0, rel=0.05)           # the uplink's bandwidth
    assert paced["traffic_gbs"] == pytest.approx(64 / 512, rel=0.05)    # the pace asked for
    assert full["chase_p50_ns"] > 1.5 * alone["chase_p50_ns"]
    assert paced["chase_p50_ns"] < 1.1 * alone["chase_p50_ns"]
    for p in (alone, full, paced):
        assert p["traffic_outlasted_chase"]
        assert p["chase_mean_ns"] == pytest.approx(p["model_mean_ns"], rel=0.10), p


def test_a_killed_host_is_dropped_and_the_other_goes_on(fleet):
    if fleet["fabric"] != "electrical":
        pytest.skip("once: on the electrical fleet, after its rounds")
    victim = fleet["hosts"][1]
    timeline.expect(fleet["timeline"], 2)
    chase = fleet["hosts"][0].start_traced(bracketed(CHASE), 600, bracket=False)
    victim.start_command(bracketed(STREAM.format(loads=50_000_000)), 600)
    deadline = time.monotonic() + 120
    while not timeline.read(fleet["timeline"])["started"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert victim.pid is not None
    # killed, and not reaped: a zombie until the Machine closes, which the waiters must see through
    os.kill(victim.pid, signal.SIGKILL)
    run = fleet["hosts"][0].finish_traced(chase, 120)
    assert run.result.status == 0 and chase_row(run)["loads"] == LOADS
    state = timeline.read(fleet["timeline"])
    assert state["gone"] == [1]
    assert [h["state"] for h in state["hosts"]] == ["left", "gone"]
