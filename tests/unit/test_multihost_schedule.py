"""multihost boots at most `parallel_boots` guests at a time, launching the next as one is ready.

QEMU is replaced by a recording Machine here: what is checked is the order of launches and
waits, which a real boot cannot show without asserting on timings."""

import dataclasses
import contextlib

import pytest

from pfcxl.device import topology
from pfcxl.errors import PfcxlError, VMError
from pfcxl.host_tools.fleet import multihost
from pfcxl.host_tools.vm.boot_options import BootOptions

pytestmark = pytest.mark.unit


class FakeAttachment:
    port, incarnation, pool_id = 0, 1, "pool"


class RecordingMachine:
    events: list[tuple[str, int]] = []
    fail: set[int] = set()
    options: dict[int, BootOptions] = {}

    def __init__(self, topo, *, options, **kw):
        self.host, self.attachment, self.pid = options.host, FakeAttachment(), None
        self.options[options.host] = options

    def launch(self):
        self.events.append(("launch", self.host))

    def boot_image(self):
        return "image"

    def wait_ready(self):
        self.events.append(("ready", self.host))
        if self.host in self.fail:
            raise VMError(f"host{self.host}: kernel panic")

    def qmp(self, command):
        self.events.append((command, self.host))

    def start_command(self, command, timeout):
        self.events.append(("command", self.host))
        return command

    def finish_command(self, token, timeout):
        return type("Done", (), {"status": 0, "data": token.encode()})()

    def close(self):
        pass


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    RecordingMachine.events, RecordingMachine.fail, RecordingMachine.options = [], set(), {}
    monkeypatch.setattr(multihost, "Machine", RecordingMachine)
    monkeypatch.setattr(multihost, "appliance_for",
                        contextlib.contextmanager(lambda *a: (yield (tmp_path, False))))
    monkeypatch.setattr(multihost, "check_incarnation", lambda *a: None)
    path = topology.resolve("pf-appliance")
    def run(hosts, options=BootOptions(), **kw):
        return multihost.run(topology.load(path), path, hosts, "echo {host}",
                             options=dataclasses.replace(options, run_dir=str(tmp_path / "hosts")), **kw)
    return run


def booting_at_each_step(events):
    booting, seen = set(), []
    for kind, host in events:
        if kind not in ("launch", "ready"):
            continue
        (booting.add if kind == "launch" else booting.discard)(host)
        seen.append(len(booting))
    return seen


def test_at_most_parallel_boots_guests_boot_at_once(recorded):
    results = recorded(7, parallel_boots=2)
    events = RecordingMachine.events
    assert max(booting_at_each_step(events)) == 2
    # the next guest starts only once one is ready, and every guest gets booted and its command
    assert events[:5] == [("launch", 0), ("launch", 1), ("ready", 0), ("stop", 0), ("launch", 2)]
    assert sorted(h for kind, h in events if kind == "launch") == list(range(7))
    assert [(r.host, r.status, r.output) for r in results] == [(h, 0, f"echo {h}") for h in range(7)]


def test_a_failed_boot_frees_its_slot_and_is_reported(recorded):
    RecordingMachine.fail = {1}
    results = recorded(4, parallel_boots=2)
    assert max(booting_at_each_step(RecordingMachine.events)) == 2
    assert [r.status for r in results] == [0, None, 0, 0]
    assert "kernel panic" in results[1].error


def test_default_is_one_boot_per_cpu(recorded):
    recorded(5)
    assert max(booting_at_each_step(RecordingMachine.events)) == min(5, multihost.boot_slots())


def test_parallel_boots_must_be_positive(recorded):
    with pytest.raises(PfcxlError, match="0 parallel boots: at least 1"):
        recorded(2, parallel_boots=0)
    assert RecordingMachine.events == []


def test_ready_guests_are_paused_until_the_last_is_ready_then_all_resume_before_any_command(recorded):
    recorded(5, parallel_boots=2)
    events = RecordingMachine.events
    for h in range(5):                   # paused right after it is ready ...
        assert events[events.index(("ready", h)) + 1] == ("stop", h)
    last_ready = max(events.index(("ready", h)) for h in range(5))
    resumed = [events.index(("cont", h)) for h in range(5)]
    first_command = min(events.index(("command", h)) for h in range(5))
    assert last_ready < min(resumed) and max(resumed) < first_command     # ... and resumed only then


def test_a_failed_boot_is_neither_paused_nor_resumed(recorded):
    RecordingMachine.fail = {1}
    results = recorded(3, parallel_boots=2)
    events = RecordingMachine.events
    # host 1 did boot and fail (not merely never start); the others were paused and resumed
    assert ("launch", 1) in events and ("ready", 1) in events and "kernel panic" in results[1].error
    assert ("stop", 1) not in events and ("cont", 1) not in events
    assert all(("stop", h) in events and ("cont", h) in events for h in (0, 2))


def test_every_host_boots_the_given_options_with_its_own_host_id_and_run_directory(recorded, tmp_path):
    given = BootOptions(append="quiet", data_path="direct", qemu_args=("-name", "x"), lean=False)
    recorded(3, parallel_boots=2, options=given)
    assert sorted(RecordingMachine.options) == [0, 1, 2]
    for h, options in RecordingMachine.options.items():
        assert options == BootOptions(append="quiet", data_path="direct", qemu_args=("-name", "x"), lean=False,
                                      host=h, appliance=str(tmp_path), run_dir=str(tmp_path / "hosts" / f"host{h}"))
