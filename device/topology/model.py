"""The immutable topology objects; `topology` builds them from TOML and re-exports them."""

from __future__ import annotations

from dataclasses import dataclass

from pfcxl.device.facts import qemu as qemu_facts


def region_name(index: int) -> str:
    """Linux's name for the index-th region pfcxl creates (topology order): regionN."""
    return f"region{index}"


def dax_name(index: int) -> str:
    """The device-DAX node of the index-th region: daxN.0."""
    return f"dax{index}.0"


@dataclass(frozen=True)
class Guest:
    memory: int
    maxmem: int
    slots: int
    cpus: int
    cmdline: str
    data_path: str = "cxl"          # cxl, direct or both (device/topology/data_path.py)

    @property
    def hotplug_room(self) -> bool:
        """maxmem above memory: QEMU then reserves DIMM space and gets `-m ...,maxmem=,slots=`."""
        return self.maxmem > self.memory


@dataclass(frozen=True)
class HostBridge:
    id: str
    bus_nr: int


@dataclass(frozen=True)
class RootPort:
    id: str
    host_bridge: str
    port: int
    chassis: int
    slot: int


@dataclass(frozen=True)
class DownstreamPort:
    id: str
    switch: str
    port: int
    chassis: int
    slot: int


@dataclass(frozen=True)
class Switch:
    id: str
    root_port: str
    downstream: tuple[DownstreamPort, ...]


@dataclass(frozen=True)
class Device:
    """A CXL Type 3 memory device (the PF-NIC, or a module behind an electrical switch).

    Its memory is either volatile (QEMU volatile-memdev) or persistent (persistent-memdev, with
    the label storage area QEMU requires for it); the other size is 0."""

    id: str
    port: str
    volatile: int
    serial: int
    appliance: str | None = None    # "shared" or "private": memory served by the appliance service
    persistent: int = 0
    lsa: int = 0                    # label storage area, bytes (persistent devices only)

    @property
    def kind(self) -> str:
        return "persistent" if self.persistent else "volatile"

    @property
    def capacity(self) -> int:
        return self.persistent or self.volatile


@dataclass(frozen=True)
class ApplianceSpec:
    """A topology's [appliance] section (docs/paper.md; pfcxl.Appliance is the running service):
    memory modules interleaved into one pool, ports for hosts, a shared region every host maps and
    an optional private region per host."""

    modules: int
    module_capacity: int
    hbm_cache: int                  # per module, HBM3E write-through cache (used by the timing model)
    ports: int
    granularity: int                # pool offsets interleave across modules at this granularity
    shared: int
    private: int                    # per host; 0 = no private regions
    backing: str                    # "shm", "directory" or "memfd" (device/topology/appliance_section.py)

    @property
    def capacity(self) -> int:
        return self.modules * self.module_capacity


@dataclass(frozen=True)
class Window:
    """A CXL fixed memory window (one CFMWS entry, one root decoder in Linux)."""

    id: str
    size: int
    targets: tuple[str, ...]
    granularity: int
    arithmetic: str = "modulo"      # CFMWS interleave arithmetic: modulo or xor
    restrictions: int = qemu_facts.RESTRICTIONS    # CFMWS window restriction bits, as QEMU writes them
    qtg_id: int = 0                 # CFMWS QoS throttling group

    @property
    def ways(self) -> int:
        return len(self.targets)

    @property
    def qemu_expressible(self) -> bool:
        """QEMU 10 writes modulo windows with its fixed restrictions and QTG ID, nothing else."""
        return (self.arithmetic == "modulo" and self.restrictions == qemu_facts.RESTRICTIONS
                and self.qtg_id == qemu_facts.QTG_ID)


@dataclass(frozen=True)
class Region:
    id: str
    window: str
    devices: tuple[str, ...]
    size: int
    granularity: int
    mode: str
    kind: str = "volatile"          # "persistent": a pmem region (cxl create-region -t pmem)

    @property
    def ways(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class Topology:
    name: str
    description: str
    source: str
    guest: Guest
    host_bridges: tuple[HostBridge, ...]
    root_ports: tuple[RootPort, ...]
    switches: tuple[Switch, ...]
    devices: tuple[Device, ...]
    windows: tuple[Window, ...]
    regions: tuple[Region, ...]
    profile: str | None = None      # fabric_constants profile for CDAT and HMAT, or QEMU's defaults
    appliance: ApplianceSpec | None = None

    @property
    def downstream_ports(self) -> tuple[DownstreamPort, ...]:
        return tuple(p for s in self.switches for p in s.downstream)

    def device(self, device_id: str) -> Device:
        return next(d for d in self.devices if d.id == device_id)

    def window(self, window_id: str) -> Window:
        return next(w for w in self.windows if w.id == window_id)

    def host_bridge_of(self, device_id: str) -> str:
        """The host bridge a device sits under, through any switch."""
        port = self.device(device_id).port
        for sw in self.switches:
            if any(p.id == port for p in sw.downstream):
                port = sw.root_port
        return next(rp.host_bridge for rp in self.root_ports if rp.id == port)

    @property
    def needs_pmem(self) -> bool:
        return any(r.kind == "persistent" for r in self.regions)

    @property
    def needs_kmem(self) -> bool:
        return any(r.mode == "system-ram" for r in self.regions)
