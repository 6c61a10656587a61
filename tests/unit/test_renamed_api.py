"""The API side of the renamed options (the CLI side: test_renamed_options.py). `timing=` meant the
fabric system in pfcxl.Appliance, multihost.run and the appliance client;
`fabric=` names it now and `timing` only the plugin's mode. The old spelling still works for
now, with a DeprecationWarning naming the new one; both at once is one clear error. Nothing
here starts a process: each call stops at its first check."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from pfcxl.appliance import Appliance
from pfcxl.device import topology
from pfcxl.errors import PfcxlError
from pfcxl.host_tools import appliance_client
from pfcxl.host_tools.fleet import multihost
from pfcxl.renamed import renamed

pytestmark = pytest.mark.unit

PF_NIC = topology.load(topology.resolve("pf-nic"))          # no devices served by the appliance
PATH = topology.resolve("pf-appliance")
APPLIANCE = topology.load(PATH)


def test_the_old_spelling_is_taken_with_a_warning_naming_the_new_one():
    with pytest.warns(DeprecationWarning, match=r"where\(old=\.\.\.\) is now new=\.\.\."):
        assert renamed("where", "old", "pf", "new", None) == "pf"
    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # the new spelling alone: no warning
        assert renamed("where", "old", None, "new", "pf") == "pf"
        assert renamed("where", "old", None, "new", None) is None
    with pytest.raises(PfcxlError, match=r"where: give new= alone \(old= is its old spelling\)"):
        renamed("where", "old", "pf", "new", "electrical")


def test_appliance_takes_timing_as_fabric_with_a_warning(tmp_path):
    with pytest.warns(DeprecationWarning, match=r"Appliance\(timing=\.\.\.\) is now fabric="):
        a = Appliance(PATH, run_dir=tmp_path, timing="electrical")
    assert a.fabric == "electrical"
    with pytest.warns(DeprecationWarning, match="Appliance.timing is now Appliance.fabric"):
        assert a.timing == "electrical"
    with pytest.raises(PfcxlError, match="give fabric= alone"):
        Appliance(PATH, run_dir=tmp_path, timing="pf", fabric="pf")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Appliance(PATH, run_dir=tmp_path, fabric="pf").fabric == "pf"


def test_the_client_takes_timing_as_fabric_with_a_warning():
    with pytest.warns(DeprecationWarning, match=r"check_options\(timing=\.\.\.\) is now fabric="):
        appliance_client.check_options(APPLIANCE, timing="pf")
    with pytest.raises(PfcxlError, match="appliance timing 'PF' is not one of"):   # still checked
        with pytest.warns(DeprecationWarning):
            appliance_client.check_options(APPLIANCE, timing="PF")


def test_multihost_takes_timing_as_fabric_with_a_warning():
    # the old spelling is translated before the topology check, which then stops the call
    with pytest.warns(DeprecationWarning, match=r"multihost.run\(timing=\.\.\.\) is now fabric="):
        with pytest.raises(PfcxlError, match="has no devices served by the appliance"):
            multihost.run(PF_NIC, Path(topology.resolve("pf-nic")), 1, "true", timing="pf")
    with pytest.raises(PfcxlError, match="give fabric= alone"):
        multihost.run(PF_NIC, Path(topology.resolve("pf-nic")), 1, "true", timing="pf", fabric="pf")
