"""The [appliance] section of a topology: reading it and the rules it must follow.

    [appliance]
    modules = 16                 # memory modules interleaved into one pool
    module_capacity = "256M"     # each (the paper's modules hold up to 2 TB of DDR5; scaled here)
    hbm_cache = "16M"            # each module's HBM3E write-through cache
    ports = 16                   # hosts that can attach at once
    granularity = "4K"           # pool offsets rotate over the modules at this granularity
    shared = "1G"                # the region every host maps
    private = "256M"             # a region per host, mapped into that host only (0: none)
    backing = "shm"              # shm: tmpfs files that survive a crash, dropped by a clean stop;
                                 # directory: files under the run dir that survive any stop;
                                 # memfd: memory that dies with the service

Devices say which region backs them with `appliance = "shared"` or `"private"`.
"""

from __future__ import annotations

from pfcxl.device.facts.cxl_spec import CFMWS_GRANULE


from pfcxl.device.topology.model import ApplianceSpec, Device
from pfcxl.device.topology.reader import Problems, TomlTable
from pfcxl.device.topology.units import GiB, MiB, human

APPLIANCE_BACKINGS = ("shm", "directory", "memfd")
APPLIANCE_REGIONS = ("shared", "private")
MAX_PORTS = 64
MAX_MODULES = 64
PARTITION_ALIGN = CFMWS_GRANULE   # each region backs a CXL Type 3 device: whole decoder units


def read_appliance(problems: Problems, doc: dict) -> ApplianceSpec | None:
    if "appliance" not in doc:
        return None
    t = TomlTable(problems, "appliance", doc["appliance"], {
        "modules": (int, 16), "module_capacity": ("size", 256 * MiB), "hbm_cache": ("size", 16 * MiB),
        "ports": (int, 16), "granularity": ("size", 4096), "shared": ("size", 1 * GiB),
        "private": ("size", 0), "backing": (str, "shm")})
    if not t.ok:
        return None
    a = ApplianceSpec(t["modules"], t["module_capacity"], t["hbm_cache"], t["ports"], t["granularity"],
                      t["shared"], t["private"], t["backing"])
    if not 1 <= a.modules <= MAX_MODULES:
        problems.add("appliance.modules", f"{a.modules} must be between 1 and {MAX_MODULES}")
    if not 1 <= a.ports <= MAX_PORTS:
        problems.add("appliance.ports", f"{a.ports} must be between 1 and {MAX_PORTS}")
    g = a.granularity
    if not (g > 0 and g & (g - 1) == 0 and 64 <= g <= GiB):
        problems.add("appliance.granularity", f"{g} must be a power of two from 64 bytes to 1 GiB")
    elif a.module_capacity <= 0 or a.module_capacity % g:
        problems.add("appliance.module_capacity", f"{a.module_capacity} must be a positive multiple of the "
                     f"granularity {g}")
    if not 0 <= a.hbm_cache <= a.module_capacity:
        problems.add("appliance.hbm_cache", f"{human(a.hbm_cache)} must be between 0 and the module capacity")
    if a.shared <= 0 or a.shared % PARTITION_ALIGN:
        problems.add("appliance.shared", f"{a.shared} must be a positive multiple of 256 MiB")
    if a.private < 0 or a.private % PARTITION_ALIGN:
        problems.add("appliance.private", f"{a.private} must be 0 or a multiple of 256 MiB")
    if a.backing not in APPLIANCE_BACKINGS:
        problems.add("appliance.backing", f"'{a.backing}' must be one of {', '.join(APPLIANCE_BACKINGS)}")
    need = a.shared + a.ports * a.private
    if a.modules > 0 and need > a.capacity:
        problems.add("appliance", f"shared {human(a.shared)} + {a.ports} ports x private {human(a.private)} "
                     f"= {human(need)} is more than the pool's {a.modules} x {human(a.module_capacity)} "
                     f"= {human(a.capacity)}")
    return a


def check_appliance_devices(problems: Problems, appliance: ApplianceSpec | None, devices: list[Device]) -> None:
    seen: dict[str, str] = {}
    for d in devices:
        if d.appliance is None:
            continue
        where = f"device '{d.id}'.appliance"
        if d.appliance not in APPLIANCE_REGIONS:
            problems.add(where, f"'{d.appliance}' must be one of {', '.join(APPLIANCE_REGIONS)}")
            continue
        if appliance is None:
            problems.add(where, "needs an [appliance] section to serve its memory")
            continue
        if d.appliance in seen:
            problems.add(where, f"the {d.appliance} region already backs device '{seen[d.appliance]}'")
        seen.setdefault(d.appliance, d.id)
        size = appliance.shared if d.appliance == "shared" else appliance.private
        if size == 0:
            problems.add(where, "the appliance has no private regions (appliance.private = 0)")
        elif d.volatile != size:
            problems.add(f"device '{d.id}'.volatile", f"{human(d.volatile)} must equal the appliance's "
                         f"{d.appliance} region ({human(size)})")
