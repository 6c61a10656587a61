"""Guests on the appliance service: shared memory across hosts, private regions, a host killed
mid-write, persistent pools. The service and every guest are real; nothing is mocked."""

import json
import os
import signal
import time

import pytest

from pfcxl.device import topology
from pfcxl.host_tools import appliance, multihost

from .conftest import boot_on_appliance, daxio, load

pytestmark = pytest.mark.integration
MiB = 1 << 20


def slices_result(output: str) -> dict:
    line = next(l for l in output.splitlines() if l.startswith('{"tool":"slices"'))
    return json.loads(line)


def test_four_hosts_each_verify_every_other_hosts_slice(running_appliance, tmp_path):
    run_dir = running_appliance()
    path = topology.resolve("pf-appliance")
    results = multihost.run(topology.load(path), path, 4,
                            "slices /dev/dax0.0 --host {host} --hosts {hosts} --slice 8M --timeout 600",
                            run_dir=tmp_path / "hosts", appliance_dir=run_dir)
    assert [r.host for r in results] == [0, 1, 2, 3]
    assert sorted(r.port for r in results) == [0, 1, 2, 3]
    published = {}
    for r in results:
        assert r.error is None and r.status == 0, r.output
        data = slices_result(r.output)
        assert data["mismatches"] == 0
        assert sorted(v["host"] for v in data["verified"]) == sorted({0, 1, 2, 3} - {r.host})
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


def test_private_regions_are_private(running_appliance, boot):
    run_dir = running_appliance()
    with appliance.Client(run_dir) as c0, appliance.Client(run_dir) as c1:
        vm0, att0 = boot_on_appliance(boot, c0, 0)
        vm1, att1 = boot_on_appliance(boot, c1, 1)
        own0, own1 = att0.region("private").partition, att1.region("private").partition
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
        names = {h.split("memfd:")[1].split(" ")[0] for h in held if "memfd:pfcxl" in h}
        assert names == {"pfcxl-shared", f"pfcxl-{own1.replace('/', '-')}"}
        assert daxio(vm0, "verify /dev/dax1.0 --size 4M --seed 5")["mismatches"] == 0


def test_killed_host_does_not_disturb_the_others_and_finds_its_data(running_appliance, boot):
    run_dir = running_appliance()
    with appliance.Client(run_dir) as c0, appliance.Client(run_dir) as c1, appliance.Client(run_dir) as c2:
        vm0, _ = boot_on_appliance(boot, c0, 0)
        vm1, _ = boot_on_appliance(boot, c1, 1)
        vm2, _ = boot_on_appliance(boot, c2, 2)
        before = daxio(vm0, "fill /dev/dax1.0 --size 16M --seed 9")            # finished before the kill
        assert before["status"] == 0
        vm0.start_command("while true; do daxio fill /dev/dax1.0 --offset 64M --size 32M --seed 10; done")
        running = [vm.start_command(f"daxio fill /dev/dax0.0 --offset {h * 64}M --size 32M --seed {h}")
                   for h, vm in ((1, vm1), (2, vm2))]
        time.sleep(3)
        os.kill(vm0.pid, signal.SIGKILL)                                      # mid-write
        for (h, vm), started in zip(((1, vm1), (2, vm2)), running):
            assert vm.finish_command(started, 600).status == 0
            assert daxio(vm, f"verify /dev/dax0.0 --offset {h * 64}M --size 32M --seed {h}")["mismatches"] == 0
        assert c1.call("status")["ok"]                                        # the service keeps serving
        vm0.close()
        c0.call("detach", host=0)
        again, _ = boot_on_appliance(boot, c0, 0, vm_name="host0-again")
        after = daxio(again, "verify /dev/dax1.0 --size 16M --seed 9")
        assert after["mismatches"] == 0 and after["crc32"] == before["crc32"]


def test_persistent_pool_survives_a_restart(running_appliance, boot, tmp_path):
    text = topology.resolve("pf-appliance").read_text().replace('backing = "memfd"', 'backing = "directory"')
    path = tmp_path / "pf-appliance-persistent.toml"
    path.write_text(text)
    topo = topology.load(path)
    run_dir = running_appliance(path)
    with appliance.Client(run_dir) as c:
        vm, _ = boot_on_appliance(boot, c, 0, topo=topo)
        wrote = daxio(vm, "fill /dev/dax0.0 --offset 4M --size 16M --seed 3")
        daxio(vm, "fill /dev/dax1.0 --size 8M --seed 4")
        vm.close()
        first = c.call("checksum")["checksums"]
    appliance.stop(run_dir)
    appliance.start(topo, path, run_dir)
    with appliance.Client(run_dir) as c:
        assert c.call("checksum")["checksums"] == first
        vm, _ = boot_on_appliance(boot, c, 0, topo=topo, vm_name="host0-after-restart")
        shared = daxio(vm, "verify /dev/dax0.0 --offset 4M --size 16M --seed 3")
        assert shared["mismatches"] == 0 and shared["crc32"] == wrote["crc32"]
        assert daxio(vm, "verify /dev/dax1.0 --size 8M --seed 4")["mismatches"] == 0
