"""The names a user picks a fabric model run by: which models an appliance's timing runs, and how a
vCPU's requests issue. Apart from device/fabric/telemetry.py (numpy), so that the CLI's parser and
the appliance client can offer them without loading the models."""

from __future__ import annotations

ISSUES = ("dependent", "independent")
# the appliance's --fabric choices and the models each runs (device/fabric/systems.py's SYSTEMS): the
# first is the one its figures are quoted for
APPLIANCE_FABRICS = {"pf": ("pf", "pf_hbm"), "electrical": ("electrical",)}
