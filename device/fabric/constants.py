"""Every timing and bandwidth figure of the emulated fabrics, in one place, with its source.

The firmware-table generator (CDAT DSLBIS/SSLBIS, generic port HMAT entries) reads these, and so
will the fabric model. Nothing else in pfcxl writes a latency or bandwidth literal.

Sources:
  [PF]  Marvell, "A Photonic-CXL Memory Appliance for Scalable KV Cache Management in LLM
        Inference", arXiv 2607.27187 (July 2026), summarised in docs/paper.md:
        latency model T = T_CXL_req + T_mem + T_CXL_resp; idle write 24 + 153 + 47 = 224 ns,
        idle read 24 + 212 + 47 = 283 ns; 25.6 GB/s effective per port; 128 GB/s per host
        per direction (PCIe Gen6 limit).
  [EL]  The same paper's electrical CXL baseline: switch hop 70-500 ns plus arbitration, and
        Beluga's electrical CXL 2.0 switched pool at 800-900 ns average for 64 B accesses.
  [PCIe] PCIe 5.0 x16: 32 GT/s x 16 lanes ~ 64 GB/s per direction (128b/130b encoding).
"""

from __future__ import annotations

from dataclasses import dataclass

from pfcxl.device.facts.cxl_spec import PCIE_GEN5_X16_MBS


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
EL_SWITCH_BANDWIDTH_MBS = PCIE_GEN5_X16_MBS   # the switch's upstream link [PCIe], shared by its devices
EL_MODULE = PF_MODULE
EL_HOST_PATH = PF_HOST_PATH
EL_SWITCH = PathTiming(EL_SWITCH_HOP_NS, EL_SWITCH_HOP_NS, EL_SWITCH_BANDWIDTH_MBS, EL_SWITCH_BANDWIDTH_MBS)

PROFILES = {
    # name -> (device DSLBIS, switch SSLBIS or None, host path for the generic port)
    "pf": (PF_MODULE, None, PF_HOST_PATH),
    "electrical": (EL_MODULE, EL_SWITCH, EL_HOST_PATH),
}


# --- Timing model (device/fabric/model.py, device/fabric/engine.py) ------------------------------
# How the model reads the figures above: PF_PORT_BANDWIDTH_MBS is each host-module optical path (the
# full mesh's "port") per direction, PF_HOST_BANDWIDTH_MBS each host's PCIe Gen6 link per direction;
# a host reaches its 128 GB/s by spreading over 5+ modules, and 16 hosts streaming to 16 distinct
# modules fill 16 ports at 25.6 GB/s each, the paper's bandwidth result. (MODELLING DECISION: the
# digest gives both figures without saying which element the 25.6 GB/s port is.)
# The paper's latencies are for one 64-byte access (Beluga's comparison is quoted for 64 B too):
# the model folds the transfer time of those 64 bytes on every link into the paper's terms, so an
# idle 64-B access reproduces 24 + 153 + 47 and 24 + 212 + 47 exactly. [PF]
REFERENCE_ACCESS_BYTES = 64

# The guest's clock. MODELLING DECISION: a trace record carries the instructions its vCPU had
# executed; the engine reads one instruction as one ns (a core retiring 1 G instructions/s between
# memory accesses), and the appliance's telemetry puts every host's stream on that one scale
# (docs/appliance-timing.md). TCG's own speed never enters it.
NS_PER_INSTRUCTION = 1.0

# Memory module internals. ASSUMPTIONS (the paper gives the parts, not their speeds):
#   DDR5: 8 channels x DDR5-6400 x 8 bytes = 409.6 GB/s per module, i.e. exactly 16 ports x 25.6 GB/s:
#   a module can absorb all 16 of its optical paths at once, so the ports, not the DDR5, bound the
#   paper's 100%-per-port bandwidth result.
PF_MODULE_DDR5_BANDWIDTH_MBS = 409_600
#   HBM3E: 2 stacks x 1024 bits x 9.6 Gb/s = 2 x 1228.8 GB/s per module (the cache's headroom).
PF_MODULE_HBM_BANDWIDTH_MBS = 2_457_600
#   A read that hits the module's HBM3E cache skips the DDR5 controller and media: 150 ns instead of
#   212 ns for T_mem (idle read hit 24 + 150 + 47 = 221 ns). The paper reports no hit latency.
PF_T_MEM_READ_HIT_NS = 150
#   The cache is managed in 64-byte lines (the trace's line).
PF_HBM_LINE_BYTES = 64

# The paper's loaded latencies [PF]: writes mostly 210-250 ns; reads mostly 275-290 ns (tail to 320).
PF_PAPER_LOADED_WRITE_NS = (210, 250)
PF_PAPER_LOADED_READ_NS = (275, 290)

# Loaded variability. CALIBRATION to the paper's loaded ranges (writes mostly 210-250 ns, reads mostly
# 275-290 ns with a tail to 320 ns): each access's latency gets an integer jitter of +-v ns, v uniform
# in 0..J (J per direction), drawn in exactly symmetric pairs so the idle median stays exactly
# 224 / 283 ns (fabric_engine.draw_jitter). Writes vary more than reads in the paper (a 40 ns band
# against 15 ns); +-14 ns puts an idle write's lower bound on the paper's 210 ns.
PF_JITTER_READ_NS = 4
PF_JITTER_WRITE_NS = 14

# "The paper's load". CALIBRATION, our definition (the digest gives the distributions, not the load
# that produced them): the bandwidth experiment's port pattern, i.e. each of the 16 hosts streams to
# its own module (host i -> module i, all 16 ports in use), 64-B accesses, half reads and half writes,
# Poisson arrivals offering this fraction of the port's 25.6 GB/s in each direction. With the jitter
# above it gives (tests/unit/test_fabric_model.py, 320k accesses, seed 7): writes 99.6% in 210-250 ns
# (p50 226.9, p99.9 256); reads 85% in 275-290 ns (p50 285.3, p99 300, p99.9 308, max 319).
PF_PAPER_LOAD_PORT_UTILISATION = 0.7

# Electrical switched pool. ASSUMPTIONS: the 550-ns switch traversal [EL] is split evenly between
# the request and the response; hosts attach in groups of 4 to a switch whose one x16 link
# (EL_SWITCH_BANDWIDTH_MBS per direction) carries the whole group's traffic into the pool, and each
# memory device (the same module as the appliance's, 25.6 GB/s) sits behind one device link shared
# by every host that uses it. The switch arbitrates first come, first served.
EL_SWITCH_REQ_NS = EL_SWITCH_HOP_NS // 2
EL_SWITCH_RESP_NS = EL_SWITCH_HOP_NS - EL_SWITCH_REQ_NS
EL_HOSTS_PER_SWITCH = 4

# Context rows. ASSUMPTIONS, typical figures for a current two-socket server (not from the paper):
LOCAL_DDR5_NS = 100                  # load-to-use latency of the socket's own DDR5
LOCAL_DDR5_BANDWIDTH_MBS = 307_200   # 8 channels x DDR5-4800 x 8 bytes
REMOTE_DDR5_NS = 170                 # host DRAM on the other socket: one inter-socket hop more
REMOTE_DDR5_BANDWIDTH_MBS = 128_000  # bounded by the inter-socket links

# --- The guest's CPU in virtual time (host_tools/timing/vtime.py, device/plugin/pfcxl_vtime.h) -----
# Under --clock virtual every guest access goes through a modelled per-vCPU cache hierarchy; its
# misses cross the fabric models above. The hierarchy is a Golden Cove core's, the core of Intel's
# 4th-generation Xeon Scalable processors (Sapphire Rapids, e.g. the Xeon Platinum 8480+) [GLC]:
#   [GLC] Intel, "Intel 64 and IA-32 Architectures Optimization Reference Manual" (Golden Cove
#         microarchitecture: 48 KiB 12-way L1 data cache, 2 MiB 16-way L2 on server parts, 64-byte
#         lines, 512-entry reorder buffer, 48 outstanding L2 misses, an L2 streamer that runs up to
#         20 lines ahead of the loads it follows); Intel Architecture Day 2021 (the same figures).
# The virtual CPU retires one instruction per ns (NS_PER_INSTRUCTION): it has no pipeline, so the
# L1 hit is free and only what leaves L1 costs time.
CPU_LINE_BYTES = 64
CPU_L1D_BYTES = 48 * 1024
CPU_L1D_WAYS = 12
CPU_L2_BYTES = 2 * 1024 * 1024
CPU_L2_WAYS = 16
# L2 load-to-use latency: 16 cycles [GLC] at the 8480+'s 2.0 GHz base clock.
CPU_L2_HIT_NS = 8
CPU_OUTSTANDING_MISSES = 48   # memory-level parallelism: misses in flight at once [GLC]
CPU_ROB_INSTRUCTIONS = 512    # how far the core runs past its oldest outstanding miss [GLC]
CPU_PREFETCH_LINES = 20       # the stream prefetcher's distance ahead of the loads [GLC]
