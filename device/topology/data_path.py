"""The guest's data paths to a topology's memory: the CXL region, the direct device, or both.

`direct` plugs each device's backing object (its run-directory file or the appliance's memfd) a
second time, as a label-less QEMU NVDIMM over the very same bytes. The guest turns its raw
namespace into a device-DAX namespace (ndctl), so /dev/daxN.M is guest-RAM-speed memory without
the emulated CXL I/O path. `both` keeps the CXL region next to it.

What the direct device shows of a device: the namespace's info block sits in the device's first
bytes (see guest/init/init), so direct byte 0 is device byte `offset`, which PFCXL-READY reports
per direct device. CXL regions see the info block like any other byte: writing it through the
CXL path destroys the direct device's namespace on the next boot.
"""

from __future__ import annotations

import dataclasses

from pfcxl.errors import TopologyError

from pfcxl.device.topology.model import Topology
from pfcxl.device.topology.units import MiB, human

DATA_PATHS = ("cxl", "direct", "both")
# Where direct byte 0 lies in its device: init's `ndctl create-namespace --map=mem --align=2M`
# puts the namespace's info block at 4 KiB and the data at the next 2 MiB boundary.
DIRECT_OFFSET = 2 * MiB


def has_direct(topo: Topology) -> bool:
    return topo.guest.data_path != "cxl"


def has_cxl(topo: Topology) -> bool:
    return topo.guest.data_path != "direct"


def problems(topo: Topology) -> list[str]:
    """Why this QEMU (10, q35) cannot give `topo` its direct path: one message each, or none."""
    path = topo.guest.data_path
    if path not in DATA_PATHS:
        return [f"'{path}' is not one of {', '.join(DATA_PATHS)}"]
    if path == "cxl":
        return []
    out = [f"'{path}' maps volatile memory only, but device '{d.id}' is persistent "
           "(its pmem region is already an nvdimm namespace)" for d in topo.devices if d.kind == "persistent"]
    guest, need = topo.guest, sum(d.capacity for d in topo.devices)
    room = guest.maxmem - guest.memory
    if not guest.hotplug_room:
        out.append(f"'{path}' plugs each device as an NVDIMM, which needs DIMM hotplug room: "
                   f"guest.maxmem ({human(guest.maxmem)}) must exceed guest.memory by {human(need)}")
    elif need > room:
        out.append(f"'{path}' plugs {len(topo.devices)} device(s) of {human(need)} as NVDIMMs, more than "
                   f"the hotplug room guest.maxmem - guest.memory = {human(room)}")
    if guest.hotplug_room and len(topo.devices) > guest.slots:
        out.append(f"'{path}' needs one DIMM slot per device ({len(topo.devices)}), "
                   f"but guest.slots is {guest.slots}")
    return out


def with_data_path(topo: Topology, path: str | None) -> Topology:
    """`topo` with its guest's data path set to `path` (None: as the topology says), checked."""
    if path is None or path == topo.guest.data_path:
        return topo
    changed = dataclasses.replace(topo, guest=dataclasses.replace(topo.guest, data_path=path))
    lines = problems(changed)
    if lines:
        raise TopologyError("\n".join(f"--data-path {path} on topology '{topo.name}': {m}" for m in lines))
    return changed
