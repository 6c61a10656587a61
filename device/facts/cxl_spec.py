"""Facts of the CXL 3.1 and PCIe specifications that pfcxl relies on, each once.

Table builders, decoders and topology rules read these; nothing else writes them as literals
(tests/unit/test_facts_once.py checks that).
"""

from __future__ import annotations

KiB, MiB = 1 << 10, 1 << 20

# CFMWS windows and HDM decoders: base and size in 256 MiB units (CXL 3.1 9.18.1.3, 8.2.4.20).
CFMWS_GRANULE = 256 * MiB
# Interleave ways <-> ENIW encoding (CXL 3.1 Table 9-22): powers of two, and 3 x powers of two.
ENIW_OF_WAYS = {1: 0, 2: 1, 4: 2, 8: 3, 16: 4, 3: 8, 6: 9, 12: 10}
VALID_WAYS = tuple(sorted(ENIW_OF_WAYS))
MAX_WINDOW_TARGETS = max(VALID_WAYS)
# Interleave granularity: HBIG g means 256 B << g, g = 0..6 (256 B .. 16 KiB).
MIN_GRANULARITY = 256
HBIG_MAX = 6
MAX_GRANULARITY = MIN_GRANULARITY << HBIG_MAX
# CFMWS window restrictions (CXL 3.1 Table 9-21): bit -> meaning; bits above 5 are reserved.
RESTRICTION_BITS = {0: "device coherent (type 2)", 1: "host-only coherent (type 3)", 2: "volatile",
                    3: "persistent", 4: "fixed device configuration", 5: "back-invalidate"}
RESTRICTION_MASK = sum(1 << bit for bit in RESTRICTION_BITS)
# CHBS: the register block a host bridge's base points at, by CXL version field.
CHBS_LENGTH = {0: 0x2000, 1: 0x10000}   # CXL 1.1 RCRB / CXL 2.0+ component registers


def pcie_lane_mbs(gts: int) -> int:
    """Raw MB/s per lane per direction at `gts` GT/s (before encoding overhead)."""
    return gts * 1000 // 8


PCIE_GEN5_GTS = 32
PCIE_GEN5_X16_MBS = pcie_lane_mbs(PCIE_GEN5_GTS) * 16    # 64 GB/s per direction
