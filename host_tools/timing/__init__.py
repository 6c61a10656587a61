"""Timed runs: the TCG plugin and its configuration, the emulator's own cost, and the fabric
models' reports on the accesses a guest made."""

# the TCG plugin's modes (config.py); here so that the CLI's parser reads it light
MODES = ("count", "trace", "inject")
# whose clock a guest reads (vtime.py): emulator time, or virtual time carrying the fabric's charges
CLOCKS = ("emulator", "virtual")
# the fabrics a virtual clock is charged by (device/fabric/systems.py's names)
FABRICS = ("pf", "pf_hbm", "electrical")
