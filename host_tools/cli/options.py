"""Options several commands share that argparse builds from one definition (light: the parser
imports it)."""

from __future__ import annotations

import argparse

from pfcxl.host_tools.timing import CLOCKS, FABRICS


def add_clock_options(p: argparse.ArgumentParser, fabric: bool = True) -> None:
    """--clock and --fabric: the guest lives in fabric time (host_tools/timing/vtime.py)."""
    p.add_argument("--clock", choices=CLOCKS, default="emulator",
                   help="whose time the guest's clock keeps: emulator (default: the host's; TCG's cost, never "
                   "fabric latency) or virtual (the timed QEMU under -icount, one vCPU, 1 ns per instruction: "
                   "the plugin charges every memory request the modelled cache and fabric latency, so guest "
                   "programs read fabric time; needs `make setup-timed`)")
    if fabric:
        p.add_argument("--fabric", choices=FABRICS, default="pf",
                       help="--clock virtual: the fabric CXL requests are charged by: pf (the appliance's DDR5 "
                       "path, default), pf_hbm (with its HBM3E cache) or electrical (the switched pool)")
    p.add_argument("--fabric-param", dest="fabric_params", action="append", metavar="NAME=VALUE",
                   help="what-if: change one figure of the fabric model, for --clock virtual's charges and for "
                   "the offline model of a trace alike (repeatable). Names: module_read_ns, module_write_ns, "
                   "hbm_hit_ns, port_mbs, host_link_mbs, switch_hop_ns, switch_link_mbs, hbm_cache (bytes a "
                   "module); positive whole numbers")

