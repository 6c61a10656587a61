"""The results folder's naming: one definition (host_tools/results_dir.py) that every command uses."""

import datetime
from pathlib import Path

import pytest

import pfcxl
from pfcxl.host_tools.results_dir import STAMP, results_dir

pytestmark = pytest.mark.unit

REPO = Path(pfcxl.__file__).resolve().parent.parent
NOW = datetime.datetime(2026, 12, 6, 4, 5, 6)


def test_the_name_is_kind_time_name_tag():
    assert results_dir(None, "pf-nic", now=NOW) == Path("results/20261206-040506-pf-nic")
    assert results_dir(None, "pf-nic", tag="virtual", now=NOW) == Path("results/20261206-040506-pf-nic-virtual")
    assert results_dir("", "s", kind="serving-trace", now=NOW) == Path("results/serving-trace-20261206-040506-s")


def test_out_wins_and_nothing_is_created(tmp_path):
    assert results_dir(str(tmp_path / "mine"), "pf-nic") == tmp_path / "mine"
    assert not (tmp_path / "mine").exists()


def _spelled_out(path: Path) -> list[int]:
    """Lines that write a results/ folder or the stamp's format themselves."""
    return [n for n, line in enumerate(path.read_text().splitlines(), 1)
            if 'Path("results")' in line or "%Y%m%d" in line]


def test_the_scan_sees_each_spelling(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('import datetime\nfrom pathlib import Path\n'
                   'a = Path("results") / "x"\nb = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")\n'
                   'c = f"{datetime.datetime.now():%Y%m%d-%H%M%S}"\nd = {"results": []}\n')
    assert _spelled_out(bad) == [3, 4, 5]


def test_no_command_spells_the_naming_out_again():
    found = {}
    for folder in ("host_tools", "serving", "device", "pfcxl"):
        for path in (REPO / folder).rglob("*.py"):
            if path.name == "results_dir.py" or (folder == "pfcxl" and len(path.relative_to(REPO).parts) > 2):
                continue                # pfcxl/<folder> links: the folders themselves
            if hits := _spelled_out(path):
                found[str(path.relative_to(REPO))] = hits
    assert not found, found
