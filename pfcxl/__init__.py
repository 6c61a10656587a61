"""pfcxl: emulate a photonic-fabric CXL memory appliance (see README.md and docs/).

The public API is `pfcxl.Machine` (one booted host) and `pfcxl.Appliance` (the service that
owns the pooled memory); see pfcxl/machine.py. They are imported on first use, so that the
appliance service and the table tools do not load the QMP and console modules.

In a checkout, the top-level folders (device/, firmware_tables/, guest/, host_tools/) are this
package's subpackages: the checkout that holds this file is where they come from, so a second
checkout (its tests, its `python3 -m pfcxl.host_tools.provision`) uses its own code, never the
one a virtualenv was installed from. Installed as a wheel, they sit inside this folder instead.
"""

from pathlib import Path as _Path

__version__ = "0.1.0"
__all__ = ["Machine", "Appliance", "Result", "Plan"]

_CHECKOUT = _Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "host_tools" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))   # noqa: F821  (the package's own search path)


def __getattr__(name: str):
    if name in __all__:
        from pfcxl import machine
        return getattr(machine, name)
    raise AttributeError(f"module 'pfcxl' has no attribute {name!r}")
