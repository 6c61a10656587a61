"""Unmodified programs on CXL memory: pf-nic-numa's system-ram region is a NUMA node with memory
and no CPUs; numactl (added to the Debian image with packages=["numactl"]) binds an unchanged
python3 to it; the program's pages land on that node (/proc/PID/numa_maps) and the timing plugin
counts its accesses on the CXL path, against the same program bound to node 0."""

import re

import pytest

from pfcxl.host_tools.timing import config as timing

pytestmark = pytest.mark.integration

SIZE = 8 << 20         # bytes the program allocates and writes
PAGE = 4096
# allocate SIZE bytes and write every one (bytes * int: one memset); then wait to be looked at
PROGRAM = (f"import time; b = b'Z' * {SIZE}; assert b[{SIZE} - 1:] == b'Z'; "
           "open('/tmp/touched', 'w').close(); time.sleep(900)")


def node_pages(numa_maps: str) -> tuple[dict[int, int], dict[int, int]]:
    """(pages per node over every mapping, pages per node over the anonymous ones) of a numa_maps."""
    every: dict[int, int] = {}
    anon: dict[int, int] = {}
    for line in numa_maps.splitlines():
        for node, pages in re.findall(r"\bN(\d+)=(\d+)", line):
            every[int(node)] = every.get(int(node), 0) + int(pages)
            if " anon=" in line:
                anon[int(node)] = anon.get(int(node), 0) + int(pages)
    return every, anon


def bound_run(vm, node: int) -> tuple[dict, str]:
    """The program under `numactl --membind=NODE`, in one counted phase; (the phase's counters,
    the program's numa_maps while it holds its memory)."""
    command = (f"rm -f /tmp/touched; pfcxl_mark start; numactl --membind={node} python3 -S -c \"{PROGRAM}\" & pid=$!; "
               "while [ ! -e /tmp/touched ]; do kill -0 $pid || exit 1; sleep 0.2; done; pfcxl_mark stop; "
               "cat /proc/$pid/numa_maps; kill $pid")
    before = len(vm.timing.phases())
    done = vm.run(command, timeout=1800)
    assert done.status == 0, done.output[-3000:]
    phases = vm.timing.wait_phases(before + 1, timeout=120)
    return phases[-1], done.output


@pytest.mark.pfcxl(topology="pf-nic-numa", image="debian", packages=["numactl"], timing=timing.TimingConfig("count"),
                   ready_timeout=1800)
def test_a_bound_program_lands_on_the_cxl_node_and_the_plugin_counts_it(pfcxl_machine):
    vm = pfcxl_machine
    [ram] = [r for r in vm.ready["regions"] if r["mode"] == "system-ram"]
    node = int(vm.check(f"cat /sys/bus/dax/devices/{ram['dax']}/target_node"))
    size = vm.topology.regions[int(ram["region"].removeprefix("region"))].size
    # the node: all of the region's memory online, no CPUs
    assert node != 0
    assert vm.check(f"cat /sys/devices/system/node/node{node}/cpulist").strip() == ""
    total_kb = int(re.search(r"MemTotal:\s+(\d+) kB", vm.check(f"cat /sys/devices/system/node/node{node}/meminfo"))[1])
    assert total_kb * 1024 == size
    assert f"node {node} cpus:\n" in vm.check("numactl --hardware") + "\n"

    local, local_maps = bound_run(vm, 0)
    cxl, cxl_maps = bound_run(vm, node)

    # pages: the bound program's anonymous memory is on the CXL node, the SIZE bytes at least
    every, anon = node_pages(cxl_maps)
    assert anon.get(node, 0) >= SIZE // PAGE
    assert anon.get(node, 0) >= 0.95 * sum(anon.values()), anon
    assert node_pages(local_maps)[0].get(node, 0) == 0
    # accesses: every written byte went down the CXL path (the kernel's zeroing of each fresh page
    # and the program's own writes); bound to node 0 the same program makes next to none
    assert cxl["writes"] > 0 and cxl["bytes"] >= SIZE, cxl
    assert local["bytes"] < SIZE // 100, local
    print(f"\nnode {node}: {anon.get(node, 0)} anon pages; plugin on CXL: bound {cxl['reads']} reads, "
          f"{cxl['writes']} writes, {cxl['bytes']} bytes; node 0: {local['bytes']} bytes")
