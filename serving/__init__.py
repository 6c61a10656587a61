"""The serving-level model: an event-driven simulator of multi-turn LLM serving with tiered KV
caches (GPU HBM, host DRAM, the photonic-fabric appliance). See docs/serving.md."""

# This folder is the package pfcxl.serving (see pfcxl/__init__.py): one name per module.
if __name__ != "pfcxl.serving":
    raise ImportError(f"import this folder as pfcxl.serving, not {__name__}")
