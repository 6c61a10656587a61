"""The systems a timing report shows beside what ran: the photonic appliance (its DDR5 path, and
with its HBM3E cache), the electrical switch pool of the same size and local DRAM; their fabric
models for a topology, and the labels every report, table and plot gives them.
"""

from __future__ import annotations

from pfcxl.device.fabric import model as fabric_model
from pfcxl.device import topology
from pfcxl.device.topology import Topology
from pfcxl.device.topology.model import ApplianceSpec

SYSTEMS = ("pf", "pf_hbm", "electrical", "local")
LABELS = {"pf": "modelled PF appliance (DDR5 path)", "pf_hbm": "modelled PF + HBM3E cache",
          "electrical": "modelled electrical switch pool", "local": "local DRAM (model, context)",
          "emulator": "measured in emulator (TCG overhead)"}


def appliance_for(topo: Topology) -> ApplianceSpec:
    """The appliance whose modules serve the trace: the topology's, else the shipped pf-appliance's."""
    if topo.appliance is not None:
        return topo.appliance
    shipped = topology.load(topology.resolve("pf-appliance")).appliance
    assert shipped is not None
    return shipped


def modelled_system(topo: Topology) -> str:
    """Which system the models stand for, and why, when it is not the topology that ran."""
    app = appliance_for(topo)
    shape = (f"{app.ports} host ports x {app.modules} memory modules, interleaved every "
             f"{app.granularity} B")
    if topo.appliance is not None:
        return f"the appliance of topology '{topo.name}' ({shape})"
    return (f"the shipped pf-appliance ({shape}): topology '{topo.name}' describes no appliance, so "
            "its CXL requests are replayed as one host of that appliance and of an electrical pool "
            "of the same size")


def models(topo: Topology, params: fabric_model.Params = fabric_model.DEFAULT_PARAMS) -> dict[str, fabric_model.FabricModel]:
    app = appliance_for(topo)
    # The paper's 224/283 ns are the DDR5 path; the write-through HBM3E cache is shown on its own.
    return {"pf": fabric_model.pf_appliance(app, cache=False, params=params),
            "pf_hbm": fabric_model.pf_appliance(app, params=params),
            "electrical": fabric_model.electrical_pool(app.ports, app.modules, params=params),
            "local": fabric_model.local_dram(app.ports)}
