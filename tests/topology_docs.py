"""Topology documents (TOML as dicts) built from the shipped ones, for the unit and integration
tests of topology limits: plain functions, no fixtures."""

from __future__ import annotations

import tomllib

from pfcxl.device import topology


def shipped(name: str) -> dict:
    return tomllib.loads(topology.resolve(name).read_text())


def bridges_doc(n_bridges: int, rps_per_bridge: int = 1, granularity: str = "4K", ways: int | None = None) -> dict:
    """n host bridges with rps_per_bridge root ports and one 256 MiB device each; one window over
    all bridges and one region over every device in the window's routing order."""
    doc = shipped("pf-nic")
    doc.update(host_bridge=[], root_port=[], device=[])
    for h in range(n_bridges):
        doc["host_bridge"].append({"id": f"hb{h}", "bus_nr": 1 + h * (rps_per_bridge + 1)})
        for r in range(rps_per_bridge):
            i = h * rps_per_bridge + r
            doc["root_port"].append({"id": f"rp{i}", "host_bridge": f"hb{h}", "port": r, "chassis": 0,
                                     "slot": i + 1})
            doc["device"].append({"id": f"m{i}", "port": f"rp{i}", "volatile": "256M", "serial": i + 1})
    # position p goes to bridge p mod n: list devices round-robin over the bridges
    order = [f"m{h * rps_per_bridge + r}" for r in range(rps_per_bridge) for h in range(n_bridges)]
    doc["window"] = [{"id": "fmw0", "size": f"{n_bridges * rps_per_bridge}G",
                      "targets": [f"hb{h}" for h in range(n_bridges)],
                      "granularity": granularity}]
    doc["region"] = [{"window": "fmw0", "devices": order[:ways or len(order)]}]
    return doc


def pf_nic_doc(**changes) -> dict:
    doc = shipped("pf-nic")
    for section, values in changes.items():
        target = doc[section] if isinstance(doc[section], dict) else doc[section][0]
        target.update(values)
    return doc


def one_bridge(devices: int, cpus: int = 1) -> dict:
    doc = bridges_doc(1, rps_per_bridge=devices, granularity="256", ways=1)
    doc["window"] = [{"id": "fmw0", "size": "1G", "targets": ["hb0"]}]
    doc["guest"]["cpus"] = cpus
    return doc


def two_bridges(devices: int) -> dict:
    """`devices` devices on their own root ports, spread over two host bridges; one vCPU."""
    doc = bridges_doc(2, rps_per_bridge=(devices + 1) // 2, granularity="256", ways=1)
    del doc["root_port"][devices:], doc["device"][devices:]
    doc["window"] = [{"id": "fmw0", "size": "1G", "targets": ["hb0"]}]
    return doc


# pf-nic: cxl_base 0x2_4000_0000, windows from 0x2_5000_0000; QEMU's highest address is the windows'
# end rounded up to 1 GiB plus its 32 GiB 64-bit PCI hole, and must stay below 0xFD_0000_0000.
LARGEST_WINDOW = 0xF5_0000_0000 - 0x2_5000_0000
