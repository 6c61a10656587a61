"""Every firmware table of a topology (TableSet): the CEDT, each device's and switch's CDAT and
the generic-port/HMAT entries (as QEMU options, since QEMU builds HMAT itself). Files are
written by table_files.py; whose CEDT a boot uses is decided in boot_policy.py."""

from __future__ import annotations

from dataclasses import dataclass

from pfcxl.device.fabric import constants as fabric_constants
from pfcxl.device.topology import Topology
from pfcxl.errors import TableError

from pfcxl.firmware_tables import cdat, cedt
from pfcxl.firmware_tables.hmat_options import numa_args



@dataclass(frozen=True)
class TableSet:
    cedt: bytes
    device_cdat: dict[str, bytes]      # device id -> CDAT (only when the topology has timing)
    switch_cdat: dict[str, bytes]      # switch id -> CDAT (only when the topology has timing)
    numa_args: list[str]               # generic port and HMAT options (only with timing)


def _profile(topo: Topology):
    if topo.timing is None:
        return None
    if topo.timing not in fabric_constants.PROFILES:
        raise TableError(f"timing profile '{topo.timing}' is unknown "
                         f"(known: {', '.join(fabric_constants.PROFILES)})")
    return fabric_constants.PROFILES[topo.timing]


def tables_for(topo: Topology, *, cedt_oem_revision: int = 1) -> TableSet:
    profile = _profile(topo)
    devices, switches, numa = {}, {}, []
    if profile is not None:
        device_timing, switch_timing, host = profile
        for d in topo.devices:
            devices[d.id] = cdat.build(cdat.device_entries(d.capacity, device_timing,
                                                           non_volatile=d.kind == "persistent"))
        # A profile without switch figures (the photonic fabric has no switch) leaves QEMU's own.
        for sw in topo.switches if switch_timing else ():
            switches[sw.id] = cdat.build(cdat.switch_entries([p.port for p in sw.downstream], switch_timing))
        numa = numa_args(topo, host)
    return TableSet(cedt.from_topology(topo, oem_revision=cedt_oem_revision), devices, switches, numa)


