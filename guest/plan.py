"""What the guest's init must do for a topology, as a small line-oriented plan file.

The plan is the only topology-specific part of the guest image (/etc/pfcxl/plan):

    module <name>                               insmod /lib/modules/<name>.ko, in this order
    device <serial>                             wait until this memdev is bound to cxl_mem
    region <decoder> <type> <ways> <gran> <size> <mode> <serial>...
                                                cxl create-region -t <type> (ram or pmem), memdevs
                                                in interleave order; a pmem region then gets a
                                                devdax namespace (ndctl), reused if its labels exist
    direct <device> <base> <size>               the direct path (device/topology/data_path.py): the device's
                                                NVDIMM at physical address <base>, made a devdax
                                                namespace, reused if its info block exists
"""

from __future__ import annotations

from pfcxl.device.topology import address_map
from pfcxl.device.topology import data_path
from pfcxl.device.topology import Topology

# What every CXL RAM region needs, by module name. cxl_core is built in (CXL_BUS=y).
CXL_MODULES = ("cxl_acpi", "cxl_port", "cxl_pci", "cxl_mem", "dax_cxl", "device_dax")
# kmem turns a DAX device into system RAM; without it the device stays free for devdax.
KMEM_MODULE = "kmem"
# A pmem region: cxl_pmem makes it an nvdimm region, nd_pmem serves its namespaces and dax_pmem
# their devdax mode. Only loaded when a pmem region is planned: each nvdimm reads its whole label
# area when it probes.
PMEM_MODULES = ("cxl_pmem", "nd_pmem", "dax_pmem")
# The direct path (device/topology/data_path.py): nfit finds QEMU's NVDIMMs, nd_pmem serves their namespaces
# and dax_pmem their devdax mode.
DIRECT_MODULES = ("nfit", "nd_pmem", "dax_pmem")
# cxl create-region -t, by the region's kind
REGION_TYPES = {"volatile": "ram", "persistent": "pmem"}


def modules_needed(topo: Topology) -> list[str]:
    wanted = (list(CXL_MODULES) + (list(PMEM_MODULES) if topo.needs_pmem else [])
              + ([KMEM_MODULE] if topo.needs_kmem else []) + (list(DIRECT_MODULES) if data_path.has_direct(topo) else []))
    return list(dict.fromkeys(wanted))


def render(topo: Topology, module_order: list[str]) -> str:
    decoders = {p.what: p.name for p in address_map.window_placements(topo)}
    lines = [f"# pfcxl plan for topology {topo.name}"]
    lines += [f"module {name}" for name in module_order]
    lines += [f"device {d.serial:#x}" for d in topo.devices]
    for r in topo.regions if data_path.has_cxl(topo) else ():
        serials = " ".join(f"{topo.device(d).serial:#x}" for d in r.devices)
        lines.append(f"region {decoders[r.window]} {REGION_TYPES[r.kind]} {r.ways} {r.granularity} {r.size} "
                     f"{r.mode} {serials}")
    if data_path.has_direct(topo):
        lines += [f"direct {p.what} {p.base:#x} {p.size}" for p in address_map.direct_placements(topo)]
    return "\n".join(lines) + "\n"
