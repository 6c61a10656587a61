"""Module names tell apart what they hold: one module per name that means one thing."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = ("device", "engines", "firmware_tables", "guest", "host_tools", "serving")


def _modules(name: str) -> list[str]:
    # pfcxl/ itself only at its top: its subfolders are links to the subpackages
    found = list((ROOT / "pfcxl").glob(name))
    for top in SUBPACKAGES:
        found += (ROOT / top).rglob(name)
    return sorted(str(p.relative_to(ROOT)) for p in found)


def test_one_module_named_appliance():
    # pfcxl/appliance.py is the public API; the host's client, the CLI's commands and the
    # topology's section reader have names of their own.
    assert _modules("appliance.py") == ["pfcxl/appliance.py"]
