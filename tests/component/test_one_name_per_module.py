"""Each module has one name, and a checkout uses its own code: a clone of this repository, with a
constant changed, sees the change in its own tests even when run with this checkout's virtualenv
(whose editable install points here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pfcxl
from pfcxl.device.fabric import constants as fabric_constants

REPO = Path(pfcxl.__file__).resolve().parent.parent

pytestmark = pytest.mark.component

PROBE = '''
from pathlib import Path

from pfcxl.device.fabric import constants as fabric_constants
from pfcxl import cache


def test_the_clone_sees_its_own_code():
    here = Path(__file__).resolve().parents[2]
    assert Path(fabric_constants.__file__).resolve().is_relative_to(here)
    assert Path(cache.__file__).resolve().is_relative_to(here)
    assert fabric_constants.PF_T_REQ_NS == {changed}
'''


def test_a_clone_runs_its_own_code(tmp_path):
    clone = tmp_path / "clone"
    done = subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(clone)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    constants = clone / "device" / "fabric" / "constants.py"
    text = constants.read_text()
    before = f"PF_T_REQ_NS = {fabric_constants.PF_T_REQ_NS} "
    assert before in text
    changed = fabric_constants.PF_T_REQ_NS + 1
    constants.write_text(text.replace(before, f"PF_T_REQ_NS = {changed} "))
    (clone / "tests" / "unit" / "test_probe_clone.py").write_text(PROBE.format(changed=changed))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/unit/test_probe_clone.py"], cwd=clone, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    # and this checkout still has its own value
    assert fabric_constants.PF_T_REQ_NS == changed - 1


@pytest.mark.parametrize("folder", ["device", "firmware_tables", "guest", "host_tools", "serving"])
def test_top_level_folders_import_only_under_pfcxl(folder):
    done = subprocess.run([sys.executable, "-c", f"import {folder}"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode != 0
    assert f"import this folder as pfcxl.{folder}" in done.stderr


def test_setup_runs_under_the_package_name():
    done = subprocess.run([sys.executable, "-m", "pfcxl.host_tools.provision", "--help"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "pfcxl.host_tools.provision" in done.stdout


@pytest.mark.parametrize("folder", ["device", "firmware_tables", "guest", "host_tools", "serving"])
def test_each_subpackage_is_a_committed_link_a_file_reader_can_follow(folder):
    # Type checkers and IDEs run no code: pfcxl/<folder> must exist on disk as the folder itself.
    link = REPO / "pfcxl" / folder
    assert link.is_symlink() and link.resolve() == (REPO / folder).resolve()
    assert (link / "__init__.py").is_file()


def test_there_is_no_second_copy_of_the_package_under_itself():
    done = subprocess.run([sys.executable, "-c", "import pfcxl.pfcxl.errors"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode != 0
    assert "No module named 'pfcxl.pfcxl'" in done.stderr
