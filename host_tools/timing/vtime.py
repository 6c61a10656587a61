"""Virtual time (--clock virtual): the model file the TCG plugin charges the guest's clock by.

The plugin (device/plugin/pfcxl_vtime.h) keeps a per-vCPU cache hierarchy and sends its misses
through the very queueing network the offline engine runs (device/fabric/model.py): this module
writes that network, for the chosen fabric and for local DRAM, as the plugin's model file. The
figures are the ones in device/fabric/constants.py, so a guest's clock and the offline model of
the same stream come from one model and one set of constants.

    text = model_text(topo, "pf")          # what TimingSession writes to RUN_DIR/NAME.vtime
    expected_idle_ns("pf", write=False)    # 283: what a cold dependent load should read
"""

from __future__ import annotations

from dataclasses import dataclass

from pfcxl.device.fabric import constants as fc
from pfcxl.device.fabric import model as fabric_model
from pfcxl.device.fabric import systems as fabric_systems
from pfcxl.device.topology import Topology, address_map
from pfcxl.errors import TimingError
from pfcxl.host_tools.timing import CLOCKS, FABRICS

QEMU_ICOUNT = ("-icount", "shift=0,sleep=off")   # 1 ns per instruction; idle time is skipped
MODEL_VERSION = 1


@dataclass(frozen=True)
class Hierarchy:
    """The modelled CPU: caches, outstanding misses, reorder window, prefetch distance."""

    l1_bytes: int = fc.CPU_L1D_BYTES
    l1_ways: int = fc.CPU_L1D_WAYS
    l2_bytes: int = fc.CPU_L2_BYTES
    l2_ways: int = fc.CPU_L2_WAYS
    l2_hit_ns: float = fc.CPU_L2_HIT_NS
    outstanding: int = fc.CPU_OUTSTANDING_MISSES
    rob: int = fc.CPU_ROB_INSTRUCTIONS
    prefetch_lines: int = fc.CPU_PREFETCH_LINES

    def sets(self, size: int, ways: int) -> int:
        sets = size // fc.CPU_LINE_BYTES // ways
        if sets < 1 or sets & (sets - 1) or sets * ways * fc.CPU_LINE_BYTES != size:
            raise TimingError(f"a {size}-byte {ways}-way cache of {fc.CPU_LINE_BYTES}-byte lines needs a "
                              "power-of-two number of sets")
        return sets


def check_fabric(fabric: str) -> str:
    if fabric not in FABRICS:
        raise TimingError(f"fabric '{fabric}' is not one of {', '.join(FABRICS)}")
    return fabric


def check_clock(clock: str) -> str:
    if clock not in CLOCKS:
        raise TimingError(f"clock '{clock}' is not one of {', '.join(CLOCKS)}")
    return clock


def params(items) -> fabric_model.Params:
    """--fabric-param NAME=VALUE items as the model's parameters; one line when one is wrong."""
    try:
        return fabric_model.Params.parse(items)
    except ValueError as exc:
        raise TimingError(str(exc)) from None


def fabric_for(topo: Topology, fabric: str,
               what_if: fabric_model.Params = fabric_model.DEFAULT_PARAMS) -> fabric_model.FabricModel:
    """The fabric a timed guest of `topo` is charged by (no jitter: virtual time is exact)."""
    try:
        return fabric_systems.models(topo, what_if)[check_fabric(fabric)].without_jitter()
    except ValueError as exc:          # a what-if that leaves a latency shorter than its transfers
        raise TimingError(f"--fabric-param {what_if.changed()}: {exc}") from None


def dram_model() -> fabric_model.FabricModel:
    return fabric_model.local_dram(1)


def expected_idle_ns(topo: Topology, fabric: str, write: bool = False,
                     what_if: fabric_model.Params = fabric_model.DEFAULT_PARAMS) -> int:
    """The idle latency of one 64-byte access the model gives (what a cold dependent load reads);
    pf_hbm's read is the module cache's hit path."""
    model = fabric_for(topo, fabric, what_if)
    return model.idle_ns(write, hit=bool(model.cache_lines) and not write)


def _memory_lines(cls: str, model: fabric_model.FabricModel) -> list[str]:
    line = fc.CPU_LINE_BYTES
    req_r, mem_r, resp_r = model.fixed_ps(False)
    mem_hit = model.fixed_ps(False, hit=True)[1] if model.cache_lines else mem_r
    req_w, mem_w, resp_w = model.fixed_ps(True)
    out = [f"memory {cls} {req_r} {mem_r} {resp_r} {mem_hit} {req_w} {mem_w} {resp_w}"]
    for kind, stages in (("write", model.write_stages), ("memory", (model.memory,)), ("read", model.read_stages)):
        out += [f"stage {cls} {kind} {s.key} {fabric_model.service_ps(line, s.bandwidth_mbs)}  # {s.name}"
                for s in stages]
    return out


def model_text(topo: Topology, fabric: str, hierarchy: Hierarchy = Hierarchy(),
               what_if: fabric_model.Params = fabric_model.DEFAULT_PARAMS) -> str:
    """The plugin's model file (vtime=PATH) for a guest of `topo`: every fabric of FABRICS, in that
    order (the guest's PFCXL_MARK_PROFILE(k) switches to the k-th), `fabric` in force at the start."""
    app = fabric_systems.appliance_for(topo)
    placements = address_map.dax_placements(topo)
    base = placements[0].base if placements else 0
    h = hierarchy
    lines = [f"# pfcxl virtual-time model (host_tools/timing/vtime.py) for topology {topo.name}",
             f"version {MODEL_VERSION}",
             f"l1 {h.sets(h.l1_bytes, h.l1_ways)} {h.l1_ways} 0",
             f"l2 {h.sets(h.l2_bytes, h.l2_ways)} {h.l2_ways} {round(h.l2_hit_ns * fabric_model.PS_PER_NS)}",
             f"cpu {h.outstanding} {h.rob} {h.prefetch_lines}",
             f"start {FABRICS.index(check_fabric(fabric))}"]
    if what_if.changed():
        lines.insert(1, f"# what-if: {' '.join(f'{k}={v}' for k, v in what_if.changed().items())}")
    for name in FABRICS:
        model = fabric_for(topo, name, what_if)
        lines += [f"system {name}  # profile {FABRICS.index(name)}: {fabric_systems.LABELS[name]}, {model.name}",
                  *_memory_lines("fabric", model),
                  f"interleave fabric {base} {app.granularity} {model.modules}"]
        if model.hosts_per_group > 1:     # the electrical pool's switch: hosts queue for its uplink
            lines.append(f"hosts_per_group fabric {model.hosts_per_group}")
        if model.cache_lines:
            lines.append(f"module_cache fabric {model.cache_lines} "
                         f"{fabric_model.service_ps(fc.CPU_LINE_BYTES, model.cache_bandwidth_mbs)}")
    lines += _memory_lines("dram", dram_model())
    return "\n".join(lines) + "\n"


def sequential_bound_gbs(topo: Topology, fabric: str, hierarchy: Hierarchy = Hierarchy(),
                         what_if: fabric_model.Params = fabric_model.DEFAULT_PARAMS) -> float:
    """What one timed host can read from the fabric, sequentially (GB/s): the narrowest read
    stage over the modules the interleave spreads it across, or Little's law on the misses the
    core keeps in flight (outstanding x 64 B / idle read latency), whichever is lower."""
    model = fabric_for(topo, fabric, what_if)
    links = [s.bandwidth_mbs * (model.modules if s.key in ("path", "module") else 1) / 1000
             for s in (model.memory, *model.read_stages)]
    little = hierarchy.outstanding * fc.CPU_LINE_BYTES / model.idle_ns(False)
    return min([*links, little])


def summary(phase: dict) -> str:
    """One line of what the plugin charged in a phase (its JSON event's "vtime" object)."""
    v = phase.get("vtime") or {}
    if not v:
        return "virtual time: the plugin reported no charges"
    fabric_requests = v.get("fabric_reads", 0) + v.get("fabric_writes", 0)
    mean = v.get("fabric_latency_ns", 0) / fabric_requests if fabric_requests else 0
    return (f"virtual time ({v.get('system')}): {v.get('charged_ns', 0) / 1e3:,.1f} us of stalls charged to the "
            f"guest's clock; {fabric_requests:,} fabric requests (mean {mean:.1f} ns each, queueing included), "
            f"{v.get('dram_reads', 0) + v.get('dram_writes', 0):,} DRAM; L1 hits {v.get('l1_hits', 0):,}, "
            f"L2 hits {v.get('l2_hits', 0):,}, misses {v.get('misses', 0):,}, prefetches {v.get('prefetches', 0):,}, "
            f"write-backs {v.get('writebacks', 0):,}")
