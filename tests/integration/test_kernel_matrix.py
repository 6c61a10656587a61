"""The kernel matrix (`make test-kernels`, or pytest --kernels default,latest,PATH): on each
kernel, the guest-discovery comparison demo prints, a region's bytes rebuilt on the host from the
backing files, the direct path against the CXL path, and the KV store's put/get across two hosts
on the appliance, and a system-ram region's access0 against the predictor's rule for that
kernel (host_tools/vm/perf_predict.py). Each kernel is given as: default (setup's Debian 6.12), a Debian version or
`latest` (--kernel-package), or a path (a build tree, or FILE:MODULES_DIR)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pfcxl import cache
from pfcxl.device.topology import address_map
from pfcxl.device.appliance import rundir
from pfcxl.device import topology
from pfcxl.device.topology.units import MiB
from pfcxl.guest import pattern
from pfcxl.host_tools.cli import main as cli
from pfcxl.host_tools.vm import discovery
from pfcxl.host_tools.fleet import multihost
from pfcxl.host_tools.vm.boot_options import BootOptions
from pfcxl.host_tools.vm import perf_predict
from pfcxl.host_tools.vm import qemu
from pfcxl.guest.tool_output import tool_json

from .conftest import daxio, load, read_region_from_backing

pytestmark = pytest.mark.integration
SIZE = 4 * MiB


def machine_options(spec: str) -> dict:
    """Machine's keyword arguments for one kernel of the list."""
    if spec == "default":
        return {}
    if "/" not in spec:
        return {"kernel_package": spec}
    kernel, _, modules = spec.partition(":")
    return {"kernel": kernel, "modules": modules or None}


def check_kernel(vm, spec: str) -> None:
    """The guest booted the kernel asked for, and PFCXL-READY says where it came from."""
    if spec == "default":
        assert vm.ready["kernel"] == cache.read_manifest()["kernel_release"]
        assert vm.ready["kernel_origin"].endswith("(make setup)")
    elif "/" not in spec:
        assert vm.ready["kernel_origin"].endswith(f"(--kernel-package {spec})")
    else:
        assert vm.ready["kernel_origin"] == f"--kernel {Path(spec.partition(':')[0]).absolute()}"


def test_discovery_matches_and_the_host_rebuilds_the_region(boot, tmp_path, matrix_kernel):
    topo = load("two-hb-interleave")
    run_dir = tmp_path / "run"
    vm = boot(topo, run_dir=run_dir, **machine_options(matrix_kernel))
    check_kernel(vm, matrix_kernel)
    checks = discovery.compare(topo, discovery.discover(vm))
    assert checks and all(c.ok for c in checks), [c for c in checks if not c.ok]
    [device] = [p.name for p in address_map.dax_placements(topo)]
    wrote = daxio(vm, f"fill /dev/{device} --size {SIZE} --seed 61")
    assert wrote["status"] == 0 and wrote["size"] == SIZE, wrote
    vm.close()
    [region] = topo.regions
    rebuilt = read_region_from_backing(topo, region, qemu.backing_paths(topo, run_dir), SIZE)
    assert rebuilt == pattern.pattern_bytes(61, 0, SIZE)


def test_the_direct_path_and_the_cxl_path_hold_the_same_bytes(boot, tmp_path, matrix_kernel):
    topo = load("pf-nic")
    run_dir = tmp_path / "run"
    vm = boot("pf-nic", run_dir=run_dir, data_path="both", **machine_options(matrix_kernel))
    by_kind = {d["kind"]: d for d in vm.ready["dax"]}
    cxl, direct = by_kind["cxl"], by_kind["direct"]
    base = direct["offset"]           # one device: region offset = device offset
    wrote = daxio(vm, f"fill {cxl['path']} --offset {base + 8 * MiB} --size {SIZE} --seed 62")
    seen = daxio(vm, f"crc {direct['path']} --offset {8 * MiB} --size {SIZE}")
    assert wrote["status"] == seen["status"] == 0 and seen["crc32"] == wrote["crc32"]
    vm.close()
    with open(qemu.backing_paths(topo, run_dir)["pfnic0"], "rb") as f:
        f.seek(base + 8 * MiB)
        assert f.read(SIZE) == pattern.pattern_bytes(62, base + 8 * MiB, SIZE)


def test_kv_store_put_and_get_across_two_hosts(running_appliance, tmp_path, matrix_kernel):
    run_dir = running_appliance()
    pool = rundir.shm_dir(run_dir) / "shared.pool"
    assert cli.main(["kv", "format", "--pool", str(pool), "--hosts", "2", "--slots", "16"]) == 0
    path = topology.resolve("pf-appliance")
    results = multihost.run(topology.load(path), path, 2,
                            "kvstore run /dev/dax0.0 --host {host} --hosts {hosts} --blocks 2 --sizes 65536,4104 "
                            "--timeout 900", appliance_dir=run_dir,
                            options=BootOptions(**machine_options(matrix_kernel), run_dir=str(tmp_path / "hosts")))
    for r in results:
        assert r.error is None and r.status == 0, (r.host, r.error, r.output[-2000:])
        got = tool_json(r.output, "kvstore")
        # each host stored its 2 blocks and loaded all 4, every byte checked
        assert got["stored"] == 2 and got["loaded"] == 4 and got["missing"] == 0 and got["mismatched"] == 0


def test_a_system_ram_regions_access0_follows_the_kernels_rule(boot, matrix_kernel):
    # access0/ is filled only when the region's memory goes online (kmem): the region as system-ram
    plain = load("pf-nic")
    topo = dataclasses.replace(plain, regions=tuple(dataclasses.replace(r, mode="system-ram") for r in plain.regions))
    vm = boot(topo, **machine_options(matrix_kernel))
    assert vm.ready["regions"][0]["mode"] == "system-ram"
    (documented,) = perf_predict.predict(topo)
    printed, rule = documented.for_kernel(vm.ready["kernel"])
    seen = {attr: int(vm.check(f"cat /sys/bus/cxl/devices/region0/access0/{attr}")) for attr in printed.as_sysfs()}
    assert seen == printed.as_sysfs(), f"{vm.ready['kernel']}: rule {rule}; documented {documented.as_sysfs()}"
