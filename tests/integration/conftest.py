"""Integration fixtures: real QEMU under TCG, the real guest kernel and cxl/daxctl.

Every VM a test boots is shut down at teardown, and the teardown checks that its QEMU process
is really gone. `shared_machine(topology)` is one booted guest per topology and options for the
whole session: only for tests that look and do not change what another test could see (no
writes to /dev/daxN.M, no region or module changes, no close()); tests of the cold path (image,
first boot, CEDT override, failures, persistence) and tests that write boot their own with `boot`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pfcxl import Machine
from pfcxl.device.topology import address_map
from pfcxl.device import topology
from pfcxl.process import is_running
from pfcxl.guest.tool_output import tool_json

READY_TIMEOUT = 300   # generous: CI machines are shared; a healthy boot takes seconds


def load(name: str) -> topology.Topology:
    return topology.load(topology.resolve(name))


def pid_alive(pid: int) -> bool:
    return is_running(pid)       # a zombie is gone for our purposes


def qemu_pids_using(path: Path) -> list[int]:
    """QEMU processes whose command line mentions `path` (our run directories)."""
    done = subprocess.run(["pgrep", "-f", f"qemu-system-x86_64.*{path}"], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()]


@pytest.fixture
def boot(tmp_path):
    """boot(topology name or Topology, run_dir=None, vm_name='guest', **Machine options) -> a ready
    pfcxl.Machine; every one is closed at teardown and its QEMU checked to be gone."""
    machines: list[Machine] = []

    def _boot(name: str | topology.Topology, run_dir: Path | None = None, vm_name: str = "guest",
              **options) -> Machine:
        options.setdefault("ready_timeout", READY_TIMEOUT)
        machine = Machine(name, run_dir=run_dir or tmp_path / vm_name, name=vm_name, **options)
        machines.append(machine)
        return machine.start()

    yield _boot
    pids = [m.pid for m in machines]
    for machine in machines:
        machine.close()
    assert not [p for p in pids if p and pid_alive(p)], "QEMU left running after shutdown"


@pytest.fixture(scope="session")
def shared_machine(tmp_path_factory):
    """shared_machine(topology name, **Machine options) -> a ready Machine booted once per session
    for that topology and those options; closed, and its QEMU checked gone, at the session's end.
    Between the tests that use them the guests are paused (QMP stop): an idle guest under TCG still
    costs a few percent of a CPU, and these live for the whole session."""
    machines: dict[tuple, Machine] = {}

    def _shared(name: str, **options) -> Machine:
        key = (name, tuple(sorted(options.items())))
        if key not in machines:
            options.setdefault("ready_timeout", READY_TIMEOUT)
            run_dir = tmp_path_factory.mktemp(f"shared-{name}")
            machines[key] = Machine(name, run_dir=run_dir, name="shared", **options).start()
        machine = machines[key]
        assert machine.pid and pid_alive(machine.pid), f"the shared {name} guest is gone (a test closed it?)"
        return machine

    def _pause(run: bool) -> None:
        for machine in machines.values():
            if machine.pid and pid_alive(machine.pid):
                machine.qmp("cont" if run else "stop")

    _shared.pause = _pause     # type: ignore[attr-defined]
    yield _shared
    pids = [m.pid for m in machines.values()]
    for machine in machines.values():
        machine.close()
    assert not [p for p in pids if p and pid_alive(p)], "QEMU left running after shutdown"


@pytest.fixture(autouse=True)
def _shared_machines_run_only_for_their_tests(request):
    """The session's shared guests run during a test that uses them (directly or through a
    fixture) and are paused otherwise; the guest's clock stops with it, so it sees no gap."""
    if "shared_machine" not in request.fixturenames:
        yield
        return
    shared = request.getfixturevalue("shared_machine")
    shared.pause(True)
    yield
    shared.pause(False)


def daxio(vm: Machine, args: str) -> dict:
    """Run the guest's daxio tool and return its JSON line."""
    result = vm.run(f"daxio {args}", timeout=600)
    data = tool_json(result.output, "daxio", what=f"daxio (status {result.status})")
    data["status"] = result.status
    return data


def read_region_from_backing(topo: topology.Topology, region, backing: dict[str, Path], size: int) -> bytes:
    """The first `size` bytes of `region`, reassembled granule by granule from the device files
    through address_map.locate() (QEMU's routing)."""
    files = {dev: open(backing[dev], "rb") for dev in region.devices}
    try:
        parts = []
        for offset in range(0, size, region.granularity):
            device, dpa = address_map.locate(topo, region, offset)
            files[device].seek(dpa)
            parts.append(files[device].read(region.granularity))
        return b"".join(parts)
    finally:
        for f in files.values():
            f.close()


@pytest.fixture
def machine_name():
    """Names for machines kept up (`pfcxl up --name`), unique to this pytest process, so two runs
    of the suite at once never reach for the same machine; each is brought down afterwards."""
    from pfcxl.host_tools.fleet import detached
    names: list[str] = []

    def _name(tag: str) -> str:
        names.append(f"t{os.getpid()}-{tag}")
        return names[-1]

    yield _name
    for n in names:
        if detached.machine_dir(n).exists():
            detached.down(n)


def pfcxl_cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", *args], capture_output=True,
                          text=True, **kwargs)


def guest_file(vm: Machine, path: str) -> bytes:
    """A binary file from the guest (base64 over the console)."""
    import base64
    out = vm.check(f"base64 {path} | tr -d '\\n'; echo")
    return base64.b64decode(out.strip())


@pytest.fixture
def running_appliance(tmp_path):
    """A pf-appliance service in a temporary run directory, stopped at teardown."""
    from pfcxl.host_tools import appliance_client as appliance

    def _start(topo_path=None):
        path = topo_path or topology.resolve("pf-appliance")
        run_dir = tmp_path / f"appliance-{len(started)}"
        appliance.start(topology.load(path), path, run_dir)
        started.append(run_dir)
        return run_dir

    started: list[Path] = []
    yield _start
    for run_dir in started:
        appliance.stop(run_dir)
        assert not (run_dir / appliance.PID).exists()


def boot_on_appliance(boot, client, host: int, topo=None, vm_name: str | None = None):
    """Attach `host` through `client` and boot a guest on the appliance's memory."""
    topo = topo or load("pf-appliance")
    att = client.attach(host)
    return boot(topo, vm_name=vm_name or f"host{host}", attachment=att), att
