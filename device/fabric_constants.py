"""Every timing and bandwidth figure of the emulated fabrics, in one place, with its source.

The firmware-table generator (CDAT DSLBIS/SSLBIS, generic port HMAT entries) reads these, and so
will the fabric model. Nothing else in pfcxl writes a latency or bandwidth literal.

Sources:
  [PF]  Marvell, "A Photonic-CXL Memory Appliance for Scalable KV Cache Management in LLM
        Inference", arXiv 2607.27187 (July 2026), as digested in shared/seed/DIGEST.md:
        latency model T = T_CXL_req + T_mem + T_CXL_resp; idle write 24 + 153 + 47 = 224 ns,
        idle read 24 + 212 + 47 = 283 ns; 25.6 GB/s effective per port; 128 GB/s per host
        per direction (PCIe Gen6 limit).
  [EL]  The same paper's electrical CXL baseline: switch hop 70-500 ns plus arbitration, and
        Beluga's electrical CXL 2.0 switched pool at 800-900 ns average for 64 B accesses.
  [PCIe] PCIe 5.0 x16: 32 GT/s x 16 lanes ~ 64 GB/s per direction (128b/130b encoding).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PathTiming:
    """Idle latency (ns) and bandwidth (MB/s, decimal: 1 GB/s = 1000 MB/s) of one path segment."""

    read_latency_ns: int
    write_latency_ns: int
    read_bandwidth_mbs: int
    write_bandwidth_mbs: int


# --- Photonic-fabric appliance [PF] -------------------------------------------------------------
PF_T_REQ_NS = 24            # CXL request: host -> PF-NIC -> photonic packet
PF_T_RESP_NS = 47           # CXL response back to the host
PF_T_MEM_READ_NS = 212      # memory module read (DDR5 behind the module's controller)
PF_T_MEM_WRITE_NS = 153     # memory module write
PF_PORT_BANDWIDTH_MBS = 25_600     # effective per port after protocol and metadata overhead
PF_HOST_BANDWIDTH_MBS = 128_000    # per host, one direction, capped by PCIe Gen6

# Module side: what the PF-NIC's CDAT DSLBIS advertises for its memory.
PF_MODULE = PathTiming(PF_T_MEM_READ_NS, PF_T_MEM_WRITE_NS, PF_PORT_BANDWIDTH_MBS, PF_PORT_BANDWIDTH_MBS)
# Host side: CPU to the host bridge and back, what the generic port's HMAT entries advertise.
PF_HOST_PATH = PathTiming(PF_T_REQ_NS + PF_T_RESP_NS, PF_T_REQ_NS + PF_T_RESP_NS,
                          PF_HOST_BANDWIDTH_MBS, PF_HOST_BANDWIDTH_MBS)

# --- Electrical CXL switch pool [EL] ---------------------------------------------------------------
# The same DDR5 media and host link as the appliance; the switch hop is what differs. The seed
# gives 70-500 ns per hop plus arbitration and 800-900 ns end to end for Beluga: with the 71 ns
# host path and 212 ns media read, a 550 ns switch traversal (hop + arbitration) puts the idle
# read at 71 + 550 + 212 = 833 ns, inside Beluga's range.
EL_SWITCH_HOP_NS = 550
EL_SWITCH_BANDWIDTH_MBS = 64_000   # the switch's upstream link, PCIe 5.0 x16 [PCIe], shared by its devices
EL_MODULE = PF_MODULE
EL_HOST_PATH = PF_HOST_PATH
EL_SWITCH = PathTiming(EL_SWITCH_HOP_NS, EL_SWITCH_HOP_NS, EL_SWITCH_BANDWIDTH_MBS, EL_SWITCH_BANDWIDTH_MBS)

PROFILES = {
    # name -> (device DSLBIS, switch SSLBIS or None, host path for the generic port)
    "pf": (PF_MODULE, None, PF_HOST_PATH),
    "electrical": (EL_MODULE, EL_SWITCH, EL_HOST_PATH),
}


def idle_read_ns(profile: str) -> int:
    device, switch, host = PROFILES[profile]
    return host.read_latency_ns + (switch.read_latency_ns if switch else 0) + device.read_latency_ns


def idle_write_ns(profile: str) -> int:
    device, switch, host = PROFILES[profile]
    return host.write_latency_ns + (switch.write_latency_ns if switch else 0) + device.write_latency_ns
