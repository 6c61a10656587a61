"""Timed runs: the TCG plugin and its configuration, the emulator's own cost, and the fabric
models' reports on the accesses a guest made."""
