"""The CXL access trace: its record format, the shared ring a TCG plugin writes into, which
records are plausible, and what a timed appliance keeps on disk."""
