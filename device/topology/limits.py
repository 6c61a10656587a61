"""What QEMU 10.0.2 and Linux 6.12 accept, beyond the topology's own structure.

A topology that breaks one of these would pass its structural rules, then fail only after a boot
timeout, or at `cxl create-region` with a message that does not say why. Each limit was read
from their sources and tried on this machine (see docs/notes/topology-limits.md).
"""

from __future__ import annotations

from pfcxl.device.facts.cxl_spec import MAX_GRANULARITY

from pfcxl.device.facts.qemu import NO_SERIAL

from pfcxl.device.topology import address_map
from pfcxl.device.topology.model import Device, DownstreamPort, HostBridge, RootPort, Switch, Topology, Window
from pfcxl.device.topology.reader import Problems
from pfcxl.device.topology.units import GiB, MiB, human

MAX_CHASSIS = 255               # QEMU's pcie port 'chassis' is a uint8
MAX_SLOT = 8191                 # PCIe Slot Capabilities: 13-bit Physical Slot Number (QEMU truncates more)
SLOTS_PER_BUS = 32              # device numbers on a PCI bus: root ports per host bridge, ports per switch
MAX_BUS = 255
# Linux makes a decoder's granularity its parent's granularity x ways: that must stay encodable.
LINUX_MAX_GRANULARITY = MAX_GRANULARITY
LINUX_MAX_PORT_WAYS = 8         # a host bridge or switch decoder interleaves at most 8 ports
# QEMU q35 with TCG's -cpu max (an AMD CPU model, 40 physical address bits): the highest address
# it uses is the CXL windows' end rounded up to 1 GiB plus a 32 GiB 64-bit PCI hole. At or above
# AMD's HyperTransport hole QEMU moves RAM above 1 TiB, past what 40 bits reach, and refuses to start.
AMD_HT_START = 0xFD_0000_0000
PCI_HOLE64 = 32 * GiB
# Linux 6.12 x86: interrupt vectors left for PCI MSI/MSI-X per vCPU (measured: one vCPU holds 192).
# Each PCIe port takes one (pcieport: PME/AER/hotplug, probed first). cxl_pci takes one for the
# mailbox, then needs one per event log (four); short of those it fails the probe with -ENOSPC.
MSI_VECTORS_PER_CPU = 192
VECTORS_PER_PORT = 1
VECTORS_PER_DEVICE = 5


def check_ports(problems: Problems, bridges: list[HostBridge], root_ports: list[RootPort],
                switches: list[Switch], devices: list[Device]) -> None:
    """Slot and chassis widths, ports per bus, serial numbers and bus number room."""
    ports: list[RootPort | DownstreamPort] = [*root_ports, *(d for s in switches for d in s.downstream)]
    for p in ports:
        kind = "root_port" if isinstance(p, RootPort) else "downstream port"
        if not 0 <= p.chassis <= MAX_CHASSIS:
            problems.add(f"{kind} '{p.id}'.chassis", f"{p.chassis} must be between 0 and {MAX_CHASSIS} "
                         "(QEMU's chassis number is 8 bits)")
        if not 0 <= p.slot <= MAX_SLOT:
            problems.add(f"{kind} '{p.id}'.slot", f"{p.slot} must be between 0 and {MAX_SLOT} (the 13-bit "
                         "PCIe physical slot number)")
    for b in bridges:
        count = sum(rp.host_bridge == b.id for rp in root_ports)
        if count > SLOTS_PER_BUS:
            problems.add(f"host_bridge '{b.id}'", f"{count} root ports: a host bridge's bus has "
                         f"{SLOTS_PER_BUS} device slots, one per root port")
    for s in switches:
        if len(s.downstream) > SLOTS_PER_BUS:
            problems.add(f"switch '{s.id}'.downstream", f"{len(s.downstream)} ports: a switch's internal "
                         f"bus has {SLOTS_PER_BUS} device slots")
    for d in devices:
        if d.serial == NO_SERIAL:
            problems.add(f"device '{d.id}'.serial", f"{d.serial:#x} is QEMU's 'no serial' value; "
                         "Linux needs a serial to tell memdevs apart")
    _check_bus_room(problems, bridges, root_ports, switches)


def _check_bus_room(problems: Problems, bridges: list[HostBridge], root_ports: list[RootPort],
                    switches: list[Switch]) -> None:
    """Firmware numbers the buses below a host bridge from its bus_nr up: its own bus, one per root
    port, and for a switch two more (its upstream port's) plus one per downstream port. The next
    host bridge must start above them, and all must stay within bus 255."""
    switch_of = {s.root_port: s for s in switches}
    needs = {b.id: 1 for b in bridges}
    for rp in root_ports:
        if rp.host_bridge in needs:
            sw = switch_of.get(rp.id)
            needs[rp.host_bridge] += 1 + (1 + len(sw.downstream) if sw else 0)
    ordered = sorted((b for b in bridges if 1 <= b.bus_nr <= MAX_BUS), key=lambda b: b.bus_nr)
    for b, after in zip(ordered, ordered[1:] + [None]):
        last = b.bus_nr + needs[b.id] - 1
        limit, what = (after.bus_nr - 1, f"host_bridge '{after.id}' (bus_nr {after.bus_nr})") if after \
            else (MAX_BUS, "the last bus, 255")
        if after and after.bus_nr == b.bus_nr:
            continue            # the same bus_nr twice is reported as a collision
        if last > limit:
            problems.add(f"host_bridge '{b.id}'.bus_nr", f"needs buses {b.bus_nr}-{last} (its own, one per "
                         "root port, two per switch plus one per downstream port), which runs into "
                         f"{what}")


def _ways_as_routed(ways: int) -> int:
    """Linux routes a 3/6/12-way root decoder's address bits as 1/2/4 ways."""
    return ways if ways & (ways - 1) == 0 else ways // 3


def check_window_granularity(problems: Problems, window: Window) -> None:
    ways = _ways_as_routed(window.ways)
    if window.granularity * ways > LINUX_MAX_GRANULARITY:
        shown = f"{window.ways} ways (counted as {ways})" if ways != window.ways else f"{ways} ways"
        problems.add(f"window '{window.id}'.granularity", _granularity_rule(window.granularity, ways,
                                                                          f"window '{window.id}'", shown))


def _granularity_rule(granularity: int, ways: int, parent: str, shown: str = "") -> str:
    shown = shown or f"{ways} ways"
    return (f"{human(granularity)} x {shown} = {human(granularity * ways)} is more than Linux 6.12 "
            f"accepts below {parent}: each decoder's granularity is its parent's granularity x ways "
            f"(3/6/12-way windows count as 1/2/4), at most {human(LINUX_MAX_GRANULARITY)}")


def check_region_decoders(problems: Problems, where: str, topo: Topology, window: Window,
                          devices: tuple[str, ...], granularity: int) -> None:
    """The decoders Linux 6.12 programs for a region below the root (cxl_port_setup_targets):
    a host bridge interleaves the root ports the region uses, a switch its downstream ports;
    each at most 8 ways, at the parent's granularity x ways."""
    switch_of_dsp = {p.id: s for s in topo.switches for p in s.downstream}
    host_bridge_of_rp = {rp.id: rp.host_bridge for rp in topo.root_ports}
    used: dict[str, set[str]] = {}     # host bridge or switch id -> ports the region uses below it
    switch_root_port: dict[str, str] = {}
    for d in devices:
        port = topo.device(d).port
        if port in switch_of_dsp:
            sw = switch_of_dsp[port]
            used.setdefault(f"switch '{sw.id}'", set()).add(port)
            switch_root_port[f"switch '{sw.id}'"] = sw.root_port
            port = sw.root_port
        used.setdefault(f"host bridge '{host_bridge_of_rp[port]}'", set()).add(port)
    bridge_granularity = granularity * _ways_as_routed(window.ways)
    too_fine: set[str] = set()
    for name, ports in used.items():
        if len(ports) > LINUX_MAX_PORT_WAYS:
            problems.add(f"{where}.devices", f"{name} would interleave {len(ports)} ways; Linux 6.12 "
                         f"programs at most {LINUX_MAX_PORT_WAYS} targets in a host bridge or switch decoder")
        bridge = f"host bridge '{host_bridge_of_rp.get(switch_root_port.get(name, ''), '')}'"
        ways = len(used.get(bridge, ()))
        too_much = bridge_granularity * ways > LINUX_MAX_GRANULARITY
        if name in switch_root_port and too_much and bridge not in too_fine:
            too_fine.add(bridge)    # one line per host bridge, however many switches hang below it
            problems.add(f"{where}.granularity", f"{name}: " + _granularity_rule(bridge_granularity, ways, bridge))


def check_address_space(problems: Problems, topo: Topology) -> None:
    ends = [p.base + p.size for p in address_map.window_placements(topo)]
    end = max(ends) if ends else address_map.cxl_base(topo) + MiB
    highest = -(-end // GiB) * GiB + PCI_HOLE64 - 1
    if highest >= AMD_HT_START:
        problems.add("guest and windows", f"QEMU would use addresses up to {highest:#x} (guest maxmem and "
                     f"slots, then the windows, then a {human(PCI_HOLE64)} PCI hole): that must stay below "
                     f"{AMD_HT_START:#x}, or QEMU moves RAM above 1 TiB, past TCG's 40 phys-bits, and "
                     "refuses to start")


def check_interrupt_vectors(problems: Problems, topo: Topology) -> None:
    ports = len(topo.root_ports) + sum(1 + len(s.downstream) for s in topo.switches)
    need = ports * VECTORS_PER_PORT + len(topo.devices) * VECTORS_PER_DEVICE
    have = topo.guest.cpus * MSI_VECTORS_PER_CPU
    if need > have:
        cpus = -(-need // MSI_VECTORS_PER_CPU)
        problems.add("guest.cpus", f"{ports} PCIe ports and {len(topo.devices)} devices need {need} interrupt "
                     f"vectors ({VECTORS_PER_PORT} per port, {VECTORS_PER_DEVICE} per device: mailbox and "
                     f"event logs), but {topo.guest.cpus} vCPU(s) have {have} ({MSI_VECTORS_PER_CPU} each): Linux "
                     f"fails the other devices' probe; give cpus = {cpus} or fewer devices")
