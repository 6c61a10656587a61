"""The fabric models: every timing and bandwidth figure with its source (constants), the
trace-driven engine and its compiled kernel, the workloads, replay and telemetry."""
