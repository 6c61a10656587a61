"""pfcxl's pytest plugin (registered through the `pytest11` entry point): booted guests as fixtures.

    import pytest

    @pytest.mark.pfcxl(topology="two-hb-interleave")
    def test_region(pfcxl_machine):
        assert "region0" in pfcxl_machine.run("cxl list -R").output

`pfcxl_machine` boots one guest per test (default pf-nic, busybox image, no timing) in the
test's temporary directory and shuts it down afterwards; the `pfcxl` marker, or an indirect
parameter, takes Machine's keyword arguments (topology, timing, image, cedt, append, ...). `pfcxl_appliance` starts an
appliance service (default pf-appliance) for the test; a test that uses both gets a Machine
attached to that appliance as host 0 (marker `host=N` to choose).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect

import pytest

from pfcxl.process import is_running

MARKER = "pfcxl"


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(**options): pfcxl.Machine options for the pfcxl_machine "
                            "fixture (topology=, timing=, image=, cedt=, append=, host=, ...); "
                            "appliance_topology= for pfcxl_appliance")


def _options(request) -> dict:
    """Machine options: the `pfcxl` markers (the closest wins), then an indirect parameter
    (`@pytest.mark.parametrize("pfcxl_machine", [{"topology": ...}], indirect=True)`)."""
    options: dict = {}
    for mark in reversed(list(request.node.iter_markers(MARKER))):
        options.update(mark.kwargs)
    options.update(getattr(request, "param", None) or {})
    valid = option_names()
    for key in options:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            pytest.fail(f"@pytest.mark.{MARKER}: no option '{key}'" + (f" (did you mean '{close[0]}'?)" if close else "")
                        + f"; the options are Machine's keywords and appliance_topology: {', '.join(valid)}",
                        pytrace=False)
    return options


def option_names() -> list[str]:
    """What the marker takes: pfcxl.Machine's own keyword arguments, the boot options' fields (its
    other keywords), and appliance_topology."""
    from pfcxl.machine import Machine
    from pfcxl.host_tools.vm.boot_options import BootOptions
    own = [name for name, p in inspect.signature(Machine).parameters.items() if p.kind is not p.VAR_KEYWORD]
    return [own[0], *(f.name for f in dataclasses.fields(BootOptions)), *own[1:], "appliance_topology"]


@pytest.fixture
def pfcxl_appliance(request, tmp_path):
    """A pfcxl.Appliance started for this test and stopped afterwards."""
    from pfcxl import Appliance
    options = _options(request)
    with Appliance(options.get("appliance_topology", "pf-appliance"), run_dir=tmp_path / "appliance") as app:
        yield app


@pytest.fixture
def pfcxl_machine(request, tmp_path):
    """A booted pfcxl.Machine, shut down after the test (QEMU is checked to be gone)."""
    from pfcxl import Machine
    options = {k: v for k, v in _options(request).items() if k != "appliance_topology"}
    if "pfcxl_appliance" in request.fixturenames:
        appliance = request.getfixturevalue("pfcxl_appliance")
        options.setdefault("appliance", appliance)
        options.setdefault("topology", appliance.topology_path)
    options.setdefault("run_dir", tmp_path / "machine")
    machine = Machine(**options)
    with machine:
        yield machine
    if machine.pid is not None:
        _assert_gone(machine.pid)


def _assert_gone(pid: int) -> None:
    assert not is_running(pid), f"QEMU (pid {pid}) is still running after the Machine was closed"
