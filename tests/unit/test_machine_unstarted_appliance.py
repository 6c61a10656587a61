"""A Machine handed a pfcxl.Appliance that was never started, with no service in its directory,
says so in one line before it makes anything of the guest (it once reached `None /
"appliance.sock"`, a TypeError; mypy found it)."""

from __future__ import annotations

import pytest

import pfcxl
from pfcxl.errors import PfcxlError

pytestmark = pytest.mark.unit


def test_a_machine_on_an_appliance_that_is_not_started_is_one_clear_error(tmp_path):
    appliance = pfcxl.Appliance("pf-appliance", run_dir=tmp_path / "appliance")
    machine = pfcxl.Machine("pf-appliance", appliance=appliance, host=1, run_dir=tmp_path / "run")
    with pytest.raises(PfcxlError) as refused:
        machine.start()
    message = str(refused.value)
    assert "\n" not in message and "no appliance is serving" in message and str(tmp_path / "appliance") in message
    assert machine.vm is None and not (tmp_path / "appliance").exists()
