"""Whose CEDT a boot uses: QEMU's own, or ours put in its place through the initrd table upgrade."""

from __future__ import annotations

from pfcxl.device.topology import Topology
from pfcxl.errors import TableError

from pfcxl.firmware_tables import CEDT_MODES, acpi, cedt

# A table in the initrd replaces the firmware's only with the same OEM IDs and a higher revision.
OVERRIDE_OEM_REVISION = acpi.QEMU_OEM_REVISION + 1


def cedt_for_boot(topo: Topology, mode: str = "auto") -> bytes | None:
    """Our CEDT to put in place of QEMU's through the initrd table upgrade, or None for QEMU's.

    auto: ours only when the topology asks for something QEMU cannot write (window restrictions
    other than 0x000F, a QTG ID); ours: always; qemu: never (refused if the topology needs ours).
    """
    if mode not in CEDT_MODES:
        raise TableError(f"CEDT mode '{mode}' must be one of {', '.join(CEDT_MODES)}")
    expressible = all(w.qemu_expressible for w in topo.windows)
    if mode == "qemu" and not expressible:
        raise TableError("this topology sets CFMWS fields QEMU cannot write (restrictions, QTG ID); "
                         "it needs our CEDT (--cedt ours or auto)")
    if mode == "ours" or (mode == "auto" and not expressible):
        return cedt.from_topology(topo, oem_revision=OVERRIDE_OEM_REVISION)
    return None
