"""`pfcxl topology show|check|list` and `pfcxl tables`: what a topology describes and the firmware
tables it gives, without booting. Modules are imported in the command that uses them, so that
`pfcxl exec`, `ps` and `--help` do not pay for them (host_tools/cli/main.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pfcxl.errors import PfcxlError

from pfcxl.host_tools import argtypes
from pfcxl.host_tools.ui import err, out


def load(arg: str | None):
    """The validated Topology of a shipped name or TOML path (default pf-nic)."""
    from pfcxl.device import topology
    return topology.load(topology.resolve(arg))


def cmd_topology_show(args) -> int:
    from rich.table import Table

    from pfcxl.device.topology import address_map
    from pfcxl.device.topology.units import hexaddr, human

    topo = load(args.topology)
    t = Table(title=f"{topo.name}: {topo.description}", title_justify="left")
    for col in ("kind", "id", "attached to", "details"):
        t.add_column(col)
    g = topo.guest
    room = f"maxmem {human(g.maxmem)}, {g.slots} slots" if g.hotplug_room else "no hotplug room"
    t.add_row("guest", "-", "-", f"{human(g.memory)} RAM ({room}), {g.cpus} vCPU")
    chbs = address_map.chbs_bases(topo)
    for hb in topo.host_bridges:
        t.add_row("host bridge", hb.id, "pcie.0", f"bus_nr {hb.bus_nr}, CHBS {hexaddr(chbs[hb.id])}")
    for rp in topo.root_ports:
        t.add_row("root port", rp.id, rp.host_bridge, f"port {rp.port}, chassis {rp.chassis} slot {rp.slot}")
    for sw in topo.switches:
        t.add_row("switch", sw.id, sw.root_port, f"{len(sw.downstream)} downstream ports")
        for dp in sw.downstream:
            t.add_row("  downstream", dp.id, sw.id, f"port {dp.port}, chassis {dp.chassis} slot {dp.slot}")
    for d in topo.devices:
        t.add_row("type 3 device", d.id, d.port, f"{human(d.capacity)} {d.kind}"
                  + (f", label area {human(d.lsa)}" if d.lsa else "") + f", serial {d.serial:#x}")
    out.print(t)
    m = Table(title="predicted host physical address map (QEMU 10 q35, Linux 6.12)", title_justify="left")
    for col in ("linux name", "topology", "base", "end", "size", "ways", "granularity"):
        m.add_column(col)
    # a pmem region's DAX device belongs to its namespace, which libnvdimm names and sizes
    daxes = [p for p, r in zip(address_map.dax_placements(topo), topo.regions) if r.kind != "persistent"]
    for p in address_map.window_placements(topo) + address_map.region_placements(topo) + daxes:
        m.add_row(p.name, p.what, hexaddr(p.base), hexaddr(p.base + p.size - 1), human(p.size),
                  str(p.ways), human(p.granularity))
    out.print(m)
    return 0


def cmd_topology_check(args) -> int:
    from pfcxl.device import topology

    for path in args.files:
        topo = topology.load(path)
        out.print(f"{path}: ok ({topo.name}: {len(topo.devices)} devices, {len(topo.windows)} windows, "
                  f"{len(topo.regions)} regions)")
    return 0


def cmd_topology_list(args) -> int:
    from pfcxl.device import topology

    for path in topology.shipped_topologies():
        topo = topology.load(path)
        out.print(f"{topo.name:20} {topo.description}")
    return 0


def cmd_tables(args) -> int:
    if args.items[:1] == ["decode"]:
        from pfcxl.host_tools.cli.tables import decode_files
        return decode_files(args.items[1:], args.kind)
    if len(args.items) > 1:
        raise PfcxlError(f"pfcxl tables takes one topology, got {' '.join(args.items)} "
                         "(to decode files: pfcxl tables decode FILE...)")
    from rich.table import Table

    from pfcxl.firmware_tables import table_files

    topo = load(args.items[0] if args.items else None)
    out_dir = Path(args.out or f"tables-{topo.name}")
    argtypes.writable_dir(out_dir, "--out")
    written = table_files.write(topo, out_dir)
    t = Table(title=f"{topo.name}: firmware tables in {out_dir}", title_justify="left")
    for col in ("file", "bytes", "what"):
        t.add_column(col)
    for path in written:
        t.add_row(path.name, str(path.stat().st_size), _describe_table_file(path))
    out.print(t)
    if topo.profile is None:
        err.print("[dim]no `profile` in this topology: devices keep QEMU's default CDAT; no generic port "
                  "or HMAT options[/dim]")
    return 0


def _describe_table_file(path: Path) -> str:
    return {".dat": "ACPI CEDT (binary)", ".cdat": "CXL CDAT (binary, for cdat=)",
            ".txt": "decoded dump", ".args": "QEMU options: generic port + HMAT"}.get(path.suffix, "")


def add_topology_parser(sub) -> None:
    topo = sub.add_parser("topology", help="show, check or list topologies",
                          description="Topologies are TOML files describing host bridges, switches, CXL memory "
                          "devices and their timing; shipped ones are named (pfcxl topology list), others given "
                          "by path.")
    tsub = topo.add_subparsers(dest="topology_cmd", metavar="ACTION", required=True)
    p = tsub.add_parser("show", help="the topology as a table with its predicted address map",
                        description="Print a topology's devices, switches and windows as tables, with the "
                        "address map the guest is predicted to build (CFMWS windows, regions, DAX devices, "
                        "interleave) and the modelled latencies. Starts nothing.")
    p.add_argument("topology", nargs="?", help="name or TOML path (default: pf-nic)")
    p.set_defaults(func=cmd_topology_show)
    p = tsub.add_parser("check", help="validate topology files; one line per mistake",
                        description="Load and validate each topology file against the rules pfcxl and the "
                        "Linux CXL driver impose (sizes, alignment, interleave, port counts): 'ok' and a summary "
                        "per good file, one line per mistake of a bad one (and the topology-error exit status).")
    p.add_argument("files", nargs="+", metavar="FILE", help="topology TOML files (or shipped names)")
    p.set_defaults(func=cmd_topology_check)
    p = tsub.add_parser("list", help="the shipped topologies",
                        description="List the shipped topologies with their one-line descriptions; give "
                        "any of these names where a topology is asked for.")
    p.set_defaults(func=cmd_topology_list)


TABLES_DESCRIPTION = """\
pfcxl tables [TOPOLOGY] [--out DIR]: write CEDT.dat, one CDAT per device and switch,
  the generic-port/HMAT QEMU options and decoded dumps.
pfcxl tables decode FILE...: decode any CEDT or CDAT (ours, QEMU's, a real machine's)
  and list every violation found; exit 1 if there are any, 6 if a file is not a CEDT or CDAT."""


def add_tables_parser(sub) -> None:
    p = sub.add_parser("tables", help="write a topology's CEDT, CDATs and HMAT options; or decode tables",
                       description=TABLES_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("items", nargs="*", metavar="TOPOLOGY | decode FILE...",
                   help="a topology (name or TOML path; default pf-nic), or decode and the table files")
    p.add_argument("--out", help="output directory (default: tables-<topology name>)")
    p.add_argument("--as", dest="kind", choices=("cedt", "cdat"),
                   help="decode: read files as this table kind (default: CEDT if the file says so, else CDAT)")
    p.set_defaults(func=cmd_tables)
