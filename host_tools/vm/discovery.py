"""What the guest's CXL subsystem discovered, side by side with what the topology predicts.

The guest half is guest/init/pfcxl-discover (cxl list, daxctl list, sysfs as one JSON object);
this half compares it with device.address_map. `make demo` prints the comparison, the
integration tests assert every row of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pfcxl.device.topology import address_map
from pfcxl.device.topology import MIN_GRANULARITY, Topology
from pfcxl.device.topology.units import hexaddr, human
from pfcxl.errors import VMError
from pfcxl.guest import plan


@dataclass(frozen=True)
class Check:
    item: str          # decoder0.0, region0, dax0.0, memdev 0x50460001
    field: str
    predicted: object
    observed: object

    @property
    def ok(self) -> bool:
        return self.predicted == self.observed


def discover(vm) -> dict:
    """Run pfcxl-discover in a ready guest and parse its JSON."""
    out = vm.check("pfcxl-discover")
    start = out.find("{")
    try:
        return json.loads(out[start:])
    except (ValueError, json.JSONDecodeError) as exc:
        raise VMError(f"pfcxl-discover printed something that is not JSON ({exc}):\n{out[:2000]}") from exc


def _by(items: list[dict], key: str) -> dict[str, dict]:
    return {str(i.get(key)): i for i in items if isinstance(i, dict)}


def _int(value: object) -> object:
    """cxl list prints numbers; sysfs prints hex strings. Compare as integers."""
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            return value
    return value


def flatten_ports(ports: list) -> list[dict]:
    """cxl list -P nests child ports under "ports:<parent>" keys; list them all."""
    out = []
    for port in ports:
        if isinstance(port, dict):
            out.append(port)
            for key, children in port.items():
                if key.startswith("ports:") and isinstance(children, list):
                    out += flatten_ports(children)
    return out


def compare(topo: Topology, found: dict) -> list[Check]:
    checks: list[Check] = []
    # Linux makes a CXL port of each host bridge (depth 1) and each switch upstream port (depth 2).
    ports = flatten_ports(found.get("ports", []))
    checks += [
        Check("CXL ports", "host bridges (depth 1)", len(topo.host_bridges),
              sum(p.get("depth") == 1 for p in ports)),
        Check("CXL ports", "switches (depth 2)", len(topo.switches), sum(p.get("depth") == 2 for p in ports)),
    ]
    roots = _by(found.get("root_decoders", []), "decoder")
    sysfs_roots = _by(found.get("sysfs_root_decoders", []), "decoder")
    for p in address_map.window_placements(topo):
        got, sysfs = roots.get(p.name, {}), sysfs_roots.get(p.name, {})
        checks += [
            Check(p.name, "base", p.base, got.get("resource")),
            Check(p.name, "base (sysfs)", p.base, _int(sysfs.get("start"))),
            Check(p.name, "size", p.size, got.get("size")),
            Check(p.name, "interleave ways", p.ways, got.get("interleave_ways")),
            Check(p.name, "interleave ways (sysfs)", p.ways, _int(sysfs.get("interleave_ways"))),
            # cxl list leaves granularity out of 1-way decoders; sysfs always has it, and for a
            # 1-way window Linux lowers it to the minimum so that any region granularity fits.
            Check(p.name, "granularity (sysfs)", p.granularity if p.ways > 1 else MIN_GRANULARITY,
                  _int(sysfs.get("interleave_granularity"))),
        ]
    memdevs = {_int(m.get("serial")): m for m in found.get("memdevs", []) if isinstance(m, dict)}
    name_of_serial = {serial: m.get("memdev") for serial, m in memdevs.items()}
    for d in topo.devices:
        got = memdevs.get(d.serial, {})
        # cxl list names the partitions ram_size and pmem_size
        size_key = "pmem_size" if d.kind == "persistent" else "ram_size"
        checks.append(Check(f"memdev sn {d.serial:#x}", size_key.replace("_", " "), d.capacity, got.get(size_key)))
    regions = _by(found.get("regions", []), "region")
    for p, region in zip(address_map.region_placements(topo), topo.regions):
        got = regions.get(p.name, {})
        checks += [
            Check(p.name, "base", p.base, got.get("resource")),
            Check(p.name, "size", p.size, got.get("size")),
            Check(p.name, "interleave ways", p.ways, got.get("interleave_ways")),
            Check(p.name, "granularity", p.granularity, got.get("interleave_granularity")),
            Check(p.name, "type", plan.REGION_TYPES[region.kind], got.get("type")),
            Check(p.name, "decode state", "commit", got.get("decode_state")),
        ]
        mapped = {m.get("position"): m.get("memdev") for m in got.get("mappings", []) if isinstance(m, dict)}
        for pos, dev in enumerate(region.devices):
            expected = name_of_serial.get(topo.device(dev).serial, f"memdev of {dev}")
            checks.append(Check(p.name, f"position {pos}", expected, mapped.get(pos)))
    daxes = _by(found.get("dax", []), "chardev")
    for p, region in zip(address_map.dax_placements(topo), topo.regions):
        if region.kind == "persistent":
            continue    # a pmem region's DAX device is its namespace's: named and sized by libnvdimm
        got = daxes.get(p.name, {})
        checks += [
            Check(p.name, "size", p.size, got.get("size")),
            Check(p.name, "mode", region.mode, got.get("mode")),
        ]
    return checks


def format_value(field: str, value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        if field.startswith("base"):
            return hexaddr(value)
        if "size" in field:
            return human(value)
    return "-" if value is None else str(value)
