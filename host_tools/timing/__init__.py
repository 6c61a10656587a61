"""Timed runs: the TCG plugin and its configuration, the emulator's own cost, and the fabric
models' reports on the accesses a guest made."""

# the TCG plugin's modes (config.py); here so that the CLI's parser reads it light
MODES = ("count", "trace", "inject")
