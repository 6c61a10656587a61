"""pfcxl: emulate a photonic-fabric CXL memory appliance (see README.md and DESIGN.md)."""

__version__ = "0.1.0"
