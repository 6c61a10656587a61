"""Guests on the appliance service: shared memory across hosts, private regions, a host killed
mid-write, the service killed mid-write, persistent pools. The service and every guest are real;
nothing is mocked."""

import mmap
import os
import re
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from pfcxl.host_tools.vm.boot_options import BootOptions

from pfcxl.device.appliance import rundir
from pfcxl.device import topology
from pfcxl.host_tools.fleet import multihost
from pfcxl.host_tools import appliance_client as appliance
from pfcxl.guest import pattern
from pfcxl.guest.tool_output import tool_json

from .conftest import boot_on_appliance, daxio, load, pid_alive, qemu_pids_using

pytestmark = pytest.mark.integration
MiB = 1 << 20


def slices_result(output: str) -> dict:
    return tool_json(output, "slices")


def test_three_hosts_each_verify_every_other_hosts_slice(running_appliance, tmp_path):
    # three hosts: each checks two slices besides its own, which proves "every other host" as four did
    run_dir = running_appliance()
    path = topology.resolve("pf-appliance")
    results = multihost.run(topology.load(path), path, 3,
                            "slices /dev/dax0.0 --host {host} --hosts {hosts} --slice 2M --timeout 600",
                            options=BootOptions(run_dir=str(tmp_path / "hosts")), appliance_dir=run_dir)
    assert [r.host for r in results] == [0, 1, 2]
    assert sorted(r.port for r in results) == [0, 1, 2]
    published = {}
    for r in results:
        assert r.error is None and r.status == 0, r.output
        data = slices_result(r.output)
        assert data["mismatches"] == 0
        assert sorted(v["host"] for v in data["verified"]) == sorted({0, 1, 2} - {r.host})
        published[r.host] = data["own_crc32"]
        for v in data["verified"]:
            assert v["crc32"] == v["published_crc32"]
    # every host read the same bytes for each slice: the checksums agree across hosts
    for r in results:
        for v in slices_result(r.output)["verified"]:
            assert v["crc32"] == published[v["host"]]
    with appliance.Client(run_dir) as c:
        status = c.call("status")
    assert status["hosts"] == []                                  # all detached again
    assert sum(m["bytes_changed"] for m in status["modules"]) >= 0


def test_three_hosts_private_regions_a_killed_host_and_a_crashed_appliance(running_appliance, boot):
    """Three hosts on one appliance, in a fixed order (one function per step, so a failure names
    its step): private regions are private; a host killed mid-write disturbs no other host and,
    booted again, finds its data; the service killed while two guests write restarts on the very
    pool they still write. One set of boots serves all three steps."""
    run_dir = running_appliance()
    with appliance.Client(run_dir) as c0, appliance.Client(run_dir) as c1, appliance.Client(run_dir) as c2:
        vms, atts = {}, {}
        for h, c in enumerate((c0, c1, c2)):
            vms[h], atts[h] = boot_on_appliance(boot, c, h)
        _private_regions_are_private(run_dir, c1, vms, atts)
        vms[0], atts[0] = _killed_host_does_not_disturb_the_others_and_finds_its_data(boot, c0, c1, vms, atts)
        _crashed_appliance_restarts_on_the_pool_its_guests_still_write(run_dir, vms, atts)


def _private_regions_are_private(run_dir: Path, c1: appliance.Client, vms: dict, atts: dict) -> None:
    vm0, vm1 = vms[0], vms[1]
    own0, own1 = atts[0].region("private").partition, atts[1].region("private").partition
    assert own0 != own1
    assert daxio(vm0, "fill /dev/dax1.0 --size 4M --seed 5")["status"] == 0
    # host 1's private device is other memory: host 0's pattern is not there, it reads zeros
    seen = daxio(vm1, "verify /dev/dax1.0 --size 4M --seed 5")
    assert seen["status"] == 1 and seen["mismatches"] == 4 * MiB // 8
    assert seen["found"] == "0x0000000000000000"
    # and the service will not hand host 0's region to host 1's connection
    reply, fds = c1.request("region", host=1, name=own0)
    assert not reply["ok"] and fds == [] and "belongs to host 0" in reply["error"]
    # host 1's QEMU holds the shared and its own private memory, never host 0's
    held = {os.readlink(f"/proc/{vm1.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{vm1.pid}/fd")}
    names = {Path(h).name for h in held if h.startswith(str(rundir.shm_dir(run_dir)))}
    assert names == {"shared.pool", f"{own1.replace('/', '-')}.pool"}
    assert daxio(vm0, "verify /dev/dax1.0 --size 4M --seed 5")["mismatches"] == 0


def _wait_written(fd: int, offsets: list[int], what: str) -> None:
    """Until every one of `offsets` in the region behind `fd` holds a nonzero word (a guest's
    write has reached it): the guests are writing, not about to."""
    deadline = time.monotonic() + 300
    while not all(os.pread(fd, 8, o) != bytes(8) for o in offsets) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(os.pread(fd, 8, o) != bytes(8) for o in offsets), f"{what} never started writing"


def _killed_host_does_not_disturb_the_others_and_finds_its_data(boot, c0, c1, vms: dict, atts: dict):
    """Kills host 0 mid-write; returns host 0 booted again and its attachment."""
    vm0 = vms[0]
    before = daxio(vm0, "fill /dev/dax1.0 --size 4M --seed 9")             # finished before the kill
    assert before["status"] == 0
    vm0.start_command("while true; do daxio fill /dev/dax1.0 --offset 64M --size 8M --seed 10; done")
    running = [vms[h].start_command(f"daxio fill /dev/dax0.0 --offset {h * 64}M --size 16M --seed {h}")
               for h in (1, 2)]
    # the kill comes once host 0's loop and both other hosts' fills have begun to write
    _wait_written(atts[0].region("private").fd, [64 * MiB], "host 0's loop")
    _wait_written(atts[1].region("shared").fd, [64 * MiB, 128 * MiB], "hosts 1 and 2")
    os.kill(vm0.pid, signal.SIGKILL)                                      # mid-write
    for h, started in zip((1, 2), running):
        assert vms[h].finish_command(started, 600).status == 0, f"host {h}'s fill failed after host 0 was killed"
        seen = daxio(vms[h], f"verify /dev/dax0.0 --offset {h * 64}M --size 16M --seed {h}")
        assert seen["mismatches"] == 0, f"host {h}'s fill was disturbed by host 0's kill: {seen}"
    assert c1.call("status")["ok"]                                        # the service keeps serving
    vm0.close()
    c0.call("detach", host=0)
    again, att = boot_on_appliance(boot, c0, 0, vm_name="host0-again")
    after = daxio(again, "verify /dev/dax1.0 --size 4M --seed 9")
    assert after["mismatches"] == 0 and after["crc32"] == before["crc32"], "host 0 booted again lost its data"
    return again, att


def _crc(fd: int, offset: int, size: int) -> str:
    with mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ) as m:
        return f"{zlib.crc32(m[offset:offset + size]):#010x}"


GO = 512 * MiB     # where the test tells the guests that the service has restarted (seed 77)


def _crashed_appliance_restarts_on_the_pool_its_guests_still_write(run_dir: Path, vms: dict, atts: dict) -> None:
    # kill -9 of the service while two guests write; a restart on the same directory re-attaches
    # the very pool (shm backing), names the guests as attached to the crashed incarnation, and
    # holds every byte they wrote, before and after the crash.
    path = topology.resolve("pf-appliance")
    topo = topology.load(path)
    vm0, vm1 = vms[0], vms[1]
    before = daxio(vm0, "fill /dev/dax0.0 --size 8M --seed 21")              # done before the crash
    assert before["status"] == 0
    ranges = {0: (256 * MiB, 8 * MiB), 1: (320 * MiB, 8 * MiB)}             # untouched by the steps before

    def fills(h: int) -> str:
        # rewrites its range (seed 99) until the test, through the restarted service, puts the seed-77
        # word at GO; then once more with the seed it is checked against: the crash comes at its first
        # write, so they go on writing through the crash and past the restart
        where = f"/dev/dax0.0 --offset {ranges[h][0] // MiB}M --size {ranges[h][1] // MiB}M"
        return (f"until daxio verify /dev/dax0.0 --offset {GO} --size 8 --seed 77 >/dev/null; do "
                f"daxio fill {where} --seed 99 >/dev/null; done; daxio fill {where} --seed {30 + h}")

    writing = {h: vms[h].start_command(fills(h)) for h in (0, 1)}
    _wait_written(atts[1].region("shared").fd, [o for o, _ in ranges.values()], "hosts 0 and 1")
    crashed = appliance.running_pid(run_dir)
    assert crashed is not None, "no service to crash"
    os.kill(crashed, signal.SIGKILL)                                        # mid-write
    deadline = time.monotonic() + 30
    while appliance._alive(crashed) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not appliance._alive(crashed)
    restarted = appliance.start(topo, path, run_dir)
    inc = atts[1].incarnation
    assert atts[0].incarnation == atts[2].incarnation == inc
    with appliance.Client(run_dir) as c:
        status = c.call("status")
        assert status["pid"] == restarted != crashed
        assert status["pool_id"] == atts[0].pool_id and status["incarnation"] != inc
        assert [(p["host"], p["port"], p["same_memory"], p["incarnation"]) for p in status["previous_incarnations"]] \
            == [(h, atts[h].port, True, inc) for h in (0, 1, 2)], "the restarted service misnames the crashed one's hosts"
        shared = c.attach(3).region("shared").fd                             # from the new incarnation
        os.pwrite(shared, pattern.pattern_bytes(77, GO, 8), GO)               # the guests stop rewriting
        wrote = {}
        for h in (0, 1):
            done = vms[h].finish_command(writing[h], 600)
            assert done.status == 0, done.output
            wrote[h] = tool_json(done.output, "daxio")
        assert _crc(shared, 0, 8 * MiB) == before["crc32"], "the bytes written before the crash are not in the pool"
        for h, (offset, size) in ranges.items():
            assert _crc(shared, offset, size) == wrote[h]["crc32"], f"host {h}'s bytes written after the crash"
    for h in (0, 1):                                                          # and the guests agree
        offset, size = ranges[1 - h]
        seen = daxio(vms[h], f"verify /dev/dax0.0 --offset {offset // MiB}M --size {size // MiB}M --seed {31 - h}")
        assert seen["mismatches"] == 0 and seen["crc32"] == wrote[1 - h]["crc32"]


def test_persistent_pool_survives_a_restart(running_appliance, boot, tmp_path):
    text, n = re.subn(r'^backing = "shm".*$', 'backing = "directory"', topology.resolve("pf-appliance").read_text(),
                      flags=re.M)
    assert n == 1
    path = tmp_path / "pf-appliance-persistent.toml"
    path.write_text(text)
    topo = topology.load(path)
    run_dir = running_appliance(path)
    with appliance.Client(run_dir) as c:
        vm, _ = boot_on_appliance(boot, c, 0, topo=topo)
        # a few MiB at an offset and from 0: the size proves nothing more, and CXL accesses are slow under TCG
        wrote = daxio(vm, "fill /dev/dax0.0 --offset 4M --size 4M --seed 3")
        daxio(vm, "fill /dev/dax1.0 --size 2M --seed 4")
        vm.close()
        first = c.call("checksum")["checksums"]
    appliance.stop(run_dir)
    appliance.start(topo, path, run_dir)
    with appliance.Client(run_dir) as c:
        assert c.call("checksum")["checksums"] == first
        vm, _ = boot_on_appliance(boot, c, 0, topo=topo, vm_name="host0-after-restart")
        shared = daxio(vm, "verify /dev/dax0.0 --offset 4M --size 4M --seed 3")
        assert shared["mismatches"] == 0 and shared["crc32"] == wrote["crc32"]
        assert daxio(vm, "verify /dev/dax1.0 --size 2M --seed 4")["mismatches"] == 0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_a_killed_multihost_takes_its_temporary_appliance_and_directories_along(tmp_path, sig):
    # A topology of its own name, so no default appliance is running for it: multihost starts a
    # temporary one. Killed while its guest boots, it must leave no service, directory, pool or QEMU.
    text = topology.resolve("pf-appliance").read_text().replace('name = "pf-appliance"', 'name = "pf-appliance-kill"')
    path = tmp_path / "pf-appliance-kill.toml"
    path.write_text(text)
    proc = subprocess.Popen([sys.executable, "-m", "pfcxl.host_tools.cli.main", "multihost", "-n", "1", "-t", str(path),
                             "--", "sleep", "600"], stderr=subprocess.PIPE, text=True)
    where = None
    try:
        for line in proc.stderr:
            if line.startswith("starting a temporary appliance in "):
                where = Path(line.split(" in ", 1)[1].strip())
            if line.startswith("booting ") and " guests, " in line:
                break
        assert where is not None and where.exists()
        service = appliance.running_pid(where)
        deadline = time.monotonic() + 60                # the guest's QEMU starts right after that line
        while not qemu_pids_using(where) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert service is not None and qemu_pids_using(where)
        os.kill(proc.pid, sig)
        proc.wait(120)
        deadline = time.monotonic() + 60
        while (where.exists() or pid_alive(service) or qemu_pids_using(where)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not pid_alive(service), f"the temporary appliance (pid {service}) outlived multihost's {sig.name}"
        assert not where.exists() and not rundir.shm_dir(where).exists()
        assert not qemu_pids_using(where)
        if sig == signal.SIGHUP:
            assert proc.returncode != 0 and "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
