"""Benchmark scripts, each answering one measured question in one run (ratios, never single
wall-clock figures): `python -m pfcxl.host_tools.experiments.NAME --help`. Nothing imports them
except their tests."""
