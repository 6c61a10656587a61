"""Synthetic access traces for the fabric engine: the paper's load, port-saturating streams and the
benchmark's mixed trace. Records follow trace_format; stamps are in picoseconds, so run them with
`ns_per_insn=PS_STAMP` (one "instruction" per picosecond).
"""

from __future__ import annotations

import numpy as np

from pfcxl.device.fabric import constants as fc
from pfcxl.device.fabric.engine import trace_dtype
from pfcxl.device.topology.model import Appliance
from pfcxl.device.trace.records import LINE

PS_STAMP = 0.001           # ns per instruction for these traces: insn stamps are picoseconds


def module_offsets(appliance: Appliance, module: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Pool offset of the `index`-th line of `module`'s share of the shared region (the inverse of
    pool.where's interleave)."""
    g, m = appliance.granularity, appliance.modules
    per_granule = g // LINE
    rotation, line = np.divmod(index % (appliance.shared // (m * LINE)), per_granule)
    return (rotation * m + module) * g + line * LINE


def paper_load(appliance: Appliance, accesses_per_host: int, *, seed: int = 1,
               utilisation: float = fc.PF_PAPER_LOAD_PORT_UTILISATION, base_hpa: int = 0) -> np.ndarray:
    """The paper's load as we define it (fabric_constants.PF_PAPER_LOAD_PORT_UTILISATION): host i
    streams to module i (every port in use, as in the bandwidth experiment), 64-B accesses at
    random lines, reads and writes equally likely, Poisson arrivals offering `utilisation` of the
    port's 25.6 GB/s in each direction."""
    return own_module_poisson(appliance, accesses_per_host, utilisation * fc.PF_PORT_BANDWIDTH_MBS / 1000,
                              seed=seed, base_hpa=base_hpa)


def own_module_poisson(appliance: Appliance, accesses_per_host: int, gbs_per_direction: float, *,
                       size: int = LINE, reads: float = 0.5, seed: int = 1, base_hpa: int = 0) -> np.ndarray:
    """Host i sends `size`-byte accesses to random lines of module i, a fraction `reads` of them
    reads, Poisson arrivals offering `gbs_per_direction` of reads and as much of writes (for
    reads=0.5; the total offered is 2 x gbs_per_direction)."""
    rng = np.random.default_rng(seed)
    hosts = min(appliance.ports, appliance.modules)
    mean_gap_ps = size / (2 * gbs_per_direction) * 1000
    n = hosts * accesses_per_host
    t = np.cumsum(rng.exponential(mean_gap_ps, (hosts, accesses_per_host)), axis=1)
    tr = np.zeros(n, trace_dtype())
    host = np.repeat(np.arange(hosts), accesses_per_host)
    step = max(size // LINE, 1)
    tr["insn"] = np.rint(t.ravel())
    tr["host"] = host
    tr["write"] = rng.random(n) >= reads
    tr["size"] = size
    tr["hpa"] = base_hpa + module_offsets(appliance, host, rng.integers(0, 1 << 40, n) // step * step)
    return tr[np.argsort(tr["insn"], kind="stable")]


def stream(appliance: Appliance, hosts: int, size: int, accesses_per_host: int, *, write: bool,
           linear: bool, seed: int = 1, base_hpa: int = 0, module_of_host=None) -> np.ndarray:
    """Host h streams `size`-byte transfers to module `module_of_host(h)` (default h), all issued at
    once (offered load far above any link): linear walks or random lines, size-aligned."""
    rng = np.random.default_rng(seed)
    host = np.repeat(np.arange(hosts), accesses_per_host)
    module = host if module_of_host is None else np.asarray([module_of_host(h) for h in range(hosts)])[host]
    step = max(size // LINE, 1)
    k = np.tile(np.arange(accesses_per_host), hosts)
    index = k * step if linear else rng.integers(0, 1 << 40, len(host)) // step * step
    offset = module_offsets(appliance, module, index) + (rng.integers(0, LINE // size, len(host)) * size
                                                         if size < LINE else 0)
    tr = np.zeros(len(host), trace_dtype())
    tr["host"], tr["size"], tr["write"], tr["hpa"] = host, size, write, base_hpa + offset
    return tr


def mixed(appliance: Appliance, n: int, *, seed: int = 1, host_gbs: float = 40.0,
          base_hpa: int = 0) -> np.ndarray:
    """The benchmark's trace: `n` accesses from all hosts, transfers of 32 B to 1 KB (powers of two,
    size-aligned), even hosts walking linearly and odd hosts at random over the shared region,
    reads and writes equally likely, Poisson arrivals offering `host_gbs` per host."""
    rng = np.random.default_rng(seed)
    hosts = appliance.ports
    sizes = np.array([32, 64, 128, 256, 512, 1024])
    size = sizes[rng.integers(0, len(sizes), n)]
    host = rng.integers(0, hosts, n)
    t = np.cumsum(rng.exponential(sizes.mean() / (host_gbs * hosts) * 1000, n))   # ps
    # linear hosts: each walks its own stretch of the region; random hosts: anywhere
    walk = np.zeros(n, np.int64)
    order = np.argsort(host, kind="stable")
    walk[order] = np.cumsum(size[order]) - size[order]
    start = host * (appliance.shared // hosts)
    offset = np.where(host % 2 == 0, start + walk, rng.integers(0, appliance.shared, n))
    offset = offset % appliance.shared // size * size
    tr = np.zeros(n, trace_dtype())
    tr["insn"], tr["hpa"], tr["size"] = np.rint(t), base_hpa + offset, size
    tr["write"], tr["host"] = rng.random(n) < 0.5, host
    return tr
