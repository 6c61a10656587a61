"""What we know of QEMU 10.0.2's behaviour, each fact once: read from its source and checked on
this machine (docs/notes/qemu-10-facts.md). device/topology/address_map.py computes the address placement from
these; the table generator, the predictor and the topology rules read the rest.
"""

from __future__ import annotations

from pfcxl.device.facts import cxl_spec

from pfcxl.device.fabric.constants import PathTiming
from pfcxl.device.topology.units import GiB, MiB

# --- q35 address placement (hw/i386/pc.c, hw/cxl/cxl-host.c) -------------------------------------
LOWMEM_SPLIT = 0x8000_0000     # RAM above this goes above 4 GiB when RAM >= LOWMEM_LIMIT
LOWMEM_LIMIT = 0xB000_0000
FOUR_GIB = 4 * GiB
HOTPLUG_SLOT_SIZE = GiB        # each -m slot adds 1 GiB of device-memory space before CXL
CXL_BASE_ALIGN = GiB           # the hotplug area starts at RAM's end rounded up to 1 GiB
WINDOW_GAP = MiB               # the first window starts 1 MiB above the CHBS area, then rounds up
# Host bridges: CHBS version 1 (CXL 2.0+), one component-register block each, handed out from the
# top in creation order; the CEDT lists them in an internal hash order (compare them as a set).
CHBS_VERSION = 1
CHBS_LENGTH = cxl_spec.CHBS_LENGTH[CHBS_VERSION]

# --- what QEMU writes into a CFMWS --------------------------------------------------------------
RESTRICTIONS = 0x000F          # every window: type 2 + type 3, volatile + persistent
QTG_ID = 0

# --- devices -------------------------------------------------------------------------------------
NO_SERIAL = (1 << 64) - 1      # cxl-type3 'sn' default: no serial number
# Its CDAT when none is given: a volatile Type 3 (hw/mem/cxl_type3.c), and a switch's
# (hw/pci-bridge/cxl_upstream.c), as Linux reads them back.
DEFAULT_DEVICE_CDAT = PathTiming(150, 250, 16_000, 16_000)
DEFAULT_SWITCH_CDAT = PathTiming(150, 150, 16 * 1024, 16 * 1024)
# Every CXL link trains at 32 GT/s x16, no flit mode (68-byte flits) (docs/notes, section 4.1).
LINK_GTS = cxl_spec.PCIE_GEN5_GTS
LINK_WIDTH = 16
FLIT_BYTES = 68
