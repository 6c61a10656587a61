"""The Python-capable guest: a Debian trixie rootfs (built once with mmdebstrap) under pfcxl's
init, with python3, cxl/daxctl and the pfcxl_guest probes on /dev/dax0.0."""

import pytest

from pfcxl.guest.tool_output import json_lines

from .conftest import pfcxl_cli

pytestmark = pytest.mark.integration


def test_debian_guest_runs_the_python_probes_on_dax(tmp_path):
    done = pfcxl_cli("run", "--image", "debian", "--", "python3 -m pfcxl_guest latency --span 256K && "
                     "python3 -m pfcxl_guest bandwidth --size 256K --op write && cxl version && "
                     "python3 -c 'import sys; print(sys.version_info[:2])'", timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    latency, bandwidth = json_lines(done.stdout, '{"probe": ')
    assert latency["dax"] == "/dev/dax0.0" and latency["lines"] == 4096 and latency["loads"] == 4096
    assert bandwidth["bytes"] == 256 * 1024
    assert "81" in lines                                          # ndctl 81's cxl, from trixie
    assert any(l.startswith("(3, ") for l in lines)               # a python3 of the guest's own
