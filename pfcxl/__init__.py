"""pfcxl: emulate a photonic-fabric CXL memory appliance (see README.md and docs/ARCHITECTURE.md).

The public API is `pfcxl.Machine` (one booted appliance host) and `pfcxl.Appliance` (the service
that owns the pooled memory); see pfcxl/machine.py and pfcxl/appliance.py;
what a command gives back, `Result` and `TracedRun`, is in host_tools/vm/host.py and
host_tools/timing/traced_run.py. They are imported on first use, so that the
appliance service and the table tools do not load the QMP and console modules; a type checker
sees them through the TYPE_CHECKING import below.

The top-level folders (device/, firmware_tables/, guest/, host_tools/, serving/) are this
package's subpackages through links committed in this folder (pfcxl/device -> ../device, ...):
a checkout always runs its own code, and tools that only read files resolve every import.
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Machine", "Appliance", "BootOptions", "Result", "TracedRun", "Plan"]
_HOME = {"Machine": "pfcxl.machine", "BootOptions": "pfcxl.machine", "Plan": "pfcxl.machine",
         "Appliance": "pfcxl.appliance", "Result": "pfcxl.host_tools.vm.host",
         "TracedRun": "pfcxl.host_tools.timing.traced_run"}

if TYPE_CHECKING:
    from pfcxl.appliance import Appliance
    from pfcxl.machine import BootOptions, Machine, Plan
    from pfcxl.host_tools.timing.traced_run import TracedRun
    from pfcxl.host_tools.vm.host import Result


def __getattr__(name: str) -> Any:
    if name in _HOME:
        import importlib
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'pfcxl' has no attribute {name!r}")
