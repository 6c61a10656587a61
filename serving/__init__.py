"""The serving-level model: an event-driven simulator of multi-turn LLM serving with tiered KV
caches (GPU HBM, host DRAM, the photonic-fabric appliance). See docs/serving.md."""
