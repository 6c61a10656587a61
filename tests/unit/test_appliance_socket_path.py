"""A run directory whose control socket path would be too long for a unix socket is refused in one
line before anything is created (it was a traceback from the service: 'AF_UNIX path too long')."""

from __future__ import annotations

import os

import pytest

from pfcxl.device import topology
from pfcxl.errors import ApplianceError
from pfcxl.host_tools import appliance_client as appliance

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("extra", [60, 100, 400])
def test_a_run_directory_too_deep_for_the_socket_is_one_line(tmp_path, extra):
    path = topology.resolve("pf-appliance")
    run_dir = tmp_path / ("d" * extra)
    with pytest.raises(ApplianceError) as refused:
        appliance.start(topology.load(path), path, run_dir)
    message = str(refused.value)
    assert "\n" not in message and "a unix socket's path is at most 107" in message
    assert not os.path.lexists(run_dir)       # (a name over 255 bytes cannot exist at all)
