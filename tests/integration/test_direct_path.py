"""The direct data path (pfcxl.device.topology.data_path): the device's very backing file as an NVDIMM
devdax device next to the CXL region; bytes written through one path read back through the other
and in the backing file on the host."""

import json
import re
import zlib

import numpy as np
import pytest

from pfcxl.device.topology import address_map
from pfcxl.device.topology import data_path
from pfcxl.device.appliance import rundir
from pfcxl.device.topology.units import MiB
from pfcxl.guest import pattern
from pfcxl.guest.python import pfcxl_kvstore as kv
from pfcxl.host_tools.vm import qemu
from pfcxl.host_tools.timing import config as timing
from pfcxl.host_tools import appliance_client as appliance
from pfcxl.guest.tool_output import tool_json

from .conftest import boot_on_appliance, daxio, load, pfcxl_cli

pytestmark = pytest.mark.integration

SIZE = 4 * MiB
READS, WRITES = 1000, 500


def _devices(ready: dict) -> tuple[dict, dict]:
    """The CXL and the direct entry of a pf-nic guest's PFCXL-READY dax list."""
    by_kind = {d["kind"]: d for d in ready["dax"]}
    assert set(by_kind) == {"cxl", "direct"} and len(ready["dax"]) == 2, ready
    return by_kind["cxl"], by_kind["direct"]


def _plugin_counts_and_traces_the_direct_device_exactly(vm) -> None:
    """cxl_touch's K loads and W stores on the direct device: the plugin (trace mode), told the
    direct window's physical range, counts exactly them and traces their very lines."""
    [placement] = address_map.direct_placements(vm.topology)
    [direct] = [d for d in vm.ready["dax"] if d["kind"] == "direct"]
    base = placement.base + direct["offset"]     # the direct device's byte 0
    done = vm.run(f"cxl_touch --dax {direct['path']} --reads {READS} --writes {WRITES} --seed 4", timeout=900)
    assert done.status == 0, done.output
    touch = tool_json(done.output, "cxl_touch")
    phase = vm.timing.wait_phases(1)[0]
    records = vm.timing.stop()
    assert (phase["reads"], phase["writes"], phase["records"]) == (READS, WRITES, READS + WRITES), phase
    assert len(records) == READS + WRITES
    hpa = records["hpa"].astype(np.int64)
    assert ((hpa >= base) & (hpa < placement.base + placement.size)).all(), "a record outside the direct device"
    reads, writes = records[records["write"] == 0], records[records["write"] == 1]
    assert int((reads["hpa"] - base).sum()) == touch["read_offsets_sum"], "the traced loads are not cxl_touch's"
    assert int((writes["hpa"] - base).sum()) == touch["write_offsets_sum"], "the traced stores are not cxl_touch's"


def test_both_paths_and_the_backing_file_hold_the_same_bytes_and_the_plugin_traces_the_direct_one(boot, tmp_path):
    """One pf-nic guest with both paths and the trace plugin: first the plugin's exact count and
    trace of the direct device (cxl_touch writes at random; the fills below overwrite what they
    check), then the bytes through both paths and in the backing file (the plugin only observes)."""
    topo = load("pf-nic")
    run_dir = tmp_path / "run"
    vm = boot("pf-nic", run_dir=run_dir, data_path="both", timing=timing.TimingConfig("trace"))
    cxl, direct = _devices(vm.ready)
    _plugin_counts_and_traces_the_direct_device_exactly(vm)
    [placement] = address_map.direct_placements(topo)
    assert direct["device"] == "pfnic0" and direct["path"].startswith("/dev/dax")
    # the info block's 2 MiB come first; the rest of the device, to a 2 MiB boundary, is the data
    assert direct["offset"] == 2 * MiB and direct["size"] == placement.size - 2 * MiB
    base = direct["offset"]     # pf-nic's region is one device: region offset = device offset

    # CXL -> direct: a pattern written through the region reads back through the direct device
    wrote = daxio(vm, f"fill {cxl['path']} --offset {base + 8 * MiB} --size {SIZE} --seed 5")
    assert wrote["status"] == 0
    seen = daxio(vm, f"crc {direct['path']} --offset {8 * MiB} --size {SIZE}")
    assert seen["status"] == 0 and seen["crc32"] == wrote["crc32"]

    # direct -> CXL
    wrote = daxio(vm, f"fill {direct['path']} --offset {16 * MiB} --size {SIZE} --seed 6")
    seen = daxio(vm, f"crc {cxl['path']} --offset {base + 16 * MiB} --size {SIZE}")
    assert wrote["status"] == seen["status"] == 0 and seen["crc32"] == wrote["crc32"]
    vm.close()

    # the host: both patterns in the backing file, at device offset base + the direct offset
    with open(qemu.backing_paths(topo, run_dir)["pfnic0"], "rb") as f:
        f.seek(base + 8 * MiB)
        assert f.read(SIZE) == pattern.pattern_bytes(5, base + 8 * MiB, SIZE)
        f.seek(base + 16 * MiB)
        assert f.read(SIZE) == pattern.pattern_bytes(6, 16 * MiB, SIZE)
    assert zlib.crc32(pattern.pattern_bytes(6, 16 * MiB, SIZE)) == int(wrote["crc32"], 16)


def test_direct_only_has_no_cxl_region_and_finds_its_namespace_again(boot, tmp_path):
    """The second boot, on the same memory, has the trace plugin: after it has read the first boot's
    bytes, the plugin's exact count and trace of the direct device on a direct-only guest."""
    run_dir = tmp_path / "run"
    first = boot("pf-nic", run_dir=run_dir, vm_name="first", data_path="direct")
    assert first.ready["regions"] == []
    [direct] = first.ready["dax"]
    assert direct["kind"] == "direct"
    assert daxio(first, f"fill {direct['path']} --size {SIZE} --seed 9")["status"] == 0
    first.close()
    # a second boot on the same memory reuses the namespace its info block describes: same data
    second = boot("pf-nic", run_dir=run_dir, vm_name="second", data_path="direct", timing=timing.TimingConfig("trace"))
    assert second.ready["dax"] == [direct]
    assert daxio(second, f"verify {direct['path']} --size {SIZE} --seed 9")["mismatches"] == 0
    _plugin_counts_and_traces_the_direct_device_exactly(second)


def test_a_second_host_on_the_appliance_and_the_pool_see_the_direct_writes(running_appliance, boot):
    """A KV store formatted on the host survives the first direct boots (their namespaces' info
    blocks take the pool's first 2 MiB; the store lives after them), and one store is seen through
    the CXL region, the direct device and the pool file. Then raw bytes: host 0 writes the shared
    pool through its direct device, host 1 reads it through its CXL region and writes back through
    its own direct device, and the pool file holds both."""
    topo = data_path.with_data_path(load("pf-appliance"), "both")
    run_dir = running_appliance()
    pool_file = str(rundir.shm_dir(run_dir) / "shared.pool")
    assert pfcxl_cli("kv", "format", "--pool", pool_file, "--hosts", "3", "--slots", "16").returncode == 0
    with kv.Store.open(pool_file, host=2) as s:
        assert s.put("from-host", pattern.pattern_bytes(3, 0, 64 * 1024))
    with appliance.Client(run_dir) as c0, appliance.Client(run_dir) as c1:
        vm0, att0 = boot_on_appliance(boot, c0, 0, topo)
        vm1, att1 = boot_on_appliance(boot, c1, 1, topo)
        direct0 = next(d for d in vm0.ready["dax"] if d["kind"] == "direct" and d["device"] == "pool")
        direct1 = next(d for d in vm1.ready["dax"] if d["kind"] == "direct" and d["device"] == "pool")
        cxl0 = next(d for d in vm0.ready["dax"] if d["kind"] == "cxl" and d["region"] == "region0")
        cxl1 = next(d for d in vm1.ready["dax"] if d["kind"] == "cxl" and d["region"] == "region0")
        assert direct0["offset"] == direct1["offset"] == 2 * MiB
        base = direct0["offset"]    # the pool region is the one "pool" device: region offset = device offset

        # the KV store (its default base: 2 MiB on the CXL path, 0 on the direct one): the host's
        # block through both paths, host 0's CXL write read by host 1 directly, and back
        crc = f"0x{zlib.crc32(pattern.pattern_bytes(3, 0, 64 * 1024)):08x}"
        for vm, dev in ((vm0, cxl0["path"]), (vm1, direct1["path"])):
            got = json.loads(vm.check(f"kvstore get {dev} --key from-host"))
            assert got["hit"] == 1 and got["crc32"] == crc, (dev, got)
        assert json.loads(vm0.check(f"kvstore put {cxl0['path']} --host 0 --key via-cxl --size 1M"))["stored"] == 1
        assert json.loads(vm1.check(f"kvstore get {direct1['path']} --key via-cxl --size 1M"))["match"] == 1
        assert json.loads(vm1.check(f"kvstore put {direct1['path']} --host 1 --key via-direct --size 1M"))["stored"]
        assert json.loads(vm0.check(f"kvstore get {cxl0['path']} --key via-direct --size 1M"))["match"] == 1
        done = pfcxl_cli("kv", "verify", "--pool", pool_file, "--json")
        assert done.returncode == 0 and json.loads(done.stdout) == {"good": 3, "bad": [], "claims": 0}

        wrote = daxio(vm0, f"fill {direct0['path']} --offset {8 * MiB} --size {SIZE} --seed 21")
        seen = daxio(vm1, f"crc {cxl1['path']} --offset {base + 8 * MiB} --size {SIZE}")
        assert wrote["status"] == seen["status"] == 0 and seen["crc32"] == wrote["crc32"]
        wrote = daxio(vm1, f"fill {direct1['path']} --offset {16 * MiB} --size {SIZE} --seed 22")
        seen = daxio(vm0, f"verify {direct0['path']} --offset {16 * MiB} --size {SIZE} --seed 22")
        assert wrote["status"] == 0 and seen["mismatches"] == 0

        shared = att0.region("shared")
        with open(rundir.shm_dir(run_dir) / "shared.pool", "rb") as pool:
            for offset, seed in ((8 * MiB, 21), (16 * MiB, 22)):
                pool.seek(shared.pool_offset + base + offset)
                assert pool.read(SIZE) == pattern.pattern_bytes(seed, offset, SIZE)


@pytest.mark.pfcxl(topology="pf-nic", data_path="both", timing=timing.TimingConfig("count"))
def test_count_mode_counts_both_paths_in_one_phase(pfcxl_machine):
    vm = pfcxl_machine
    by_kind = {d["kind"]: d["path"] for d in vm.ready["dax"]}
    vm.check("pfcxl_mark start")
    for kind, (reads, writes) in (("cxl", (300, 200)), ("direct", (700, 100))):
        vm.check(f"cxl_touch --dax {by_kind[kind]} --reads {reads} --writes {writes} --no-mark")
    vm.check("pfcxl_mark stop")
    phase = vm.timing.wait_phases(1)[0]
    assert (phase["reads"], phase["writes"]) == (300 + 700, 200 + 100)


def test_run_with_timing_counts_on_a_direct_only_guest():
    """`pfcxl run --timing count` brackets the command with markers on the guest's DAX device,
    which for a direct-only guest is the direct one."""
    done = pfcxl_cli("run", "--data-path", "direct", "--timing", "count", "--",
                     "cxl_touch --dax /dev/$(ls /sys/bus/dax/devices) --reads 300 --writes 200 --no-mark", timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    # the phase's totals, before "records" (rich may wrap the line on stderr)
    totals = re.search(r'\],\s*"reads":\s*(\d+),\s*"writes":\s*(\d+),', done.stderr.replace("\n", ""))
    assert totals and totals.groups() == ("300", "200"), done.stderr[-2000:]


def test_multihost_cli_gives_every_host_its_direct_devices(tmp_path):
    """`pfcxl multihost --data-path direct`: each host's NVDIMMs sit where address_map predicts."""
    topo = data_path.with_data_path(load("pf-appliance"), "direct")
    want = sorted(f"{p.base:#x}" for p in address_map.direct_placements(topo))
    done = pfcxl_cli("multihost", "-n", "2", "--data-path", "direct", "--",
                     "cat /sys/bus/nd/devices/region*/resource", timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    hosts = done.stdout.split("== host ")[1:]
    assert len(hosts) == 2
    for output in hosts:
        assert sorted(output.split()[5:]) == want, output
