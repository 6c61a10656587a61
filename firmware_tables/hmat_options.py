"""The host side of a timed topology as QEMU options: one generic port per host bridge and the
HMAT entries from the CPUs' node to it (QEMU builds SRAT and HMAT from these)."""

from __future__ import annotations

from pfcxl.device.fabric import constants as fabric_constants
from pfcxl.device.topology import Topology


def numa_args(topo: Topology, host: fabric_constants.PathTiming) -> list[str]:
    """Generic port affinity (one proximity domain per host bridge) and the HMAT entries from the
    CPUs' node 0 to each of them: the host side of the path (CXL request + response)."""
    lines = []
    for n, hb in enumerate(topo.host_bridges, start=1):
        lines.append(f"-numa node,nodeid={n}")
        lines.append(f"-object acpi-generic-port,id=gp-{hb.id},pci-bus={hb.id},node={n}")
        for kind, value in (("read-latency", host.read_latency_ns), ("write-latency", host.write_latency_ns)):
            lines.append(f"-numa hmat-lb,initiator=0,target={n},hierarchy=memory,data-type={kind},latency={value}")
        for kind, value in (("read-bandwidth", host.read_bandwidth_mbs), ("write-bandwidth", host.write_bandwidth_mbs)):
            lines.append(f"-numa hmat-lb,initiator=0,target={n},hierarchy=memory,data-type={kind},bandwidth={value}M")
    return lines
