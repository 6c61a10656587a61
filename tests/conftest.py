"""What each test needs, as exactly one marker (pyproject.toml registers them), and the folder its
module lives in, which says the same:

    unit         tests/unit         pure Python: starts no process     (make test-unit runs these alone)
    component    tests/component    compiles C, starts daemons or other processes, but boots no guest
    integration  tests/integration  boots QEMU guests under TCG

Every test module says which with a module-level `pytestmark`. A `unit` test that starts a
process (subprocess, fork, multiprocessing) fails at its teardown, naming how many it started:
the marker is checked, not trusted. tests/unit/test_markers.py checks that every collected test
has exactly one of the three, the one of its folder.

`--kernels LIST` runs the kernel matrix (tests/integration/test_kernel_matrix.py) on each kernel of
the list; without it that module is not collected (it boots every check once per kernel: `make
test-kernels`, not `make test`).
"""

from __future__ import annotations

import multiprocessing.util
import os
import pty
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import suite_cpu

MARKERS = ("unit", "component", "integration")
_started = [0]          # processes started in this pytest process so far


def _counting(function):
    def wrapper(*args, **kwargs):
        _started[0] += 1
        return function(*args, **kwargs)
    wrapper.__wrapped__ = function
    return wrapper


# every way a test starts a process goes through one of these (os.popen is subprocess; os.system
# forks in C, so it is counted itself). pty.fork is counted rather than os.forkpty, which it calls
_STARTERS = [(subprocess.Popen, "_execute_child"), (multiprocessing.util, "spawnv_passfds"), (pty, "fork"),
             *((os, name) for name in ("fork", "posix_spawn", "posix_spawnp", "system"))]
_originals: list = []


_TIMES_KEY = pytest.StashKey[os.times_result]()


def pytest_configure(config) -> None:
    config.stash[_TIMES_KEY] = os.times()
    # the fabric engine's C kernel, compiled before processes are counted: otherwise whichever unit
    # test loads it first in a fresh cache compiles it, and is reported as starting a process
    from pfcxl.device.fabric import native
    native.library()
    for owner, name in _STARTERS:
        _originals.append((owner, name, getattr(owner, name)))
        setattr(owner, name, _counting(getattr(owner, name)))


def pytest_unconfigure(config) -> None:
    while _originals:
        owner, name, original = _originals.pop()
        setattr(owner, name, original)
    # the last line of the run, in the controller only: by now xdist's workers have been reaped,
    # so their CPU time (and that of what they waited for) is in os.times()' children fields
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not hasattr(config, "workerinput") and _TIMES_KEY in config.stash:
        reporter.write_line(suite_cpu.line(config.stash[_TIMES_KEY], os.times()))


# Unit modules that take long all the same (mypy over the whole package, cold in a fresh clone).
LONG_UNIT_MODULES = ("tests/unit/test_types.py",)


def _cost_rank(item) -> int:
    """Integration modules first, then component, then unit: `make test` hands out whole modules
    (--dist loadfile) in this order to whichever worker is free, so the long ones start early and
    the many short unit modules fill the end instead of one long module running on alone."""
    if item.nodeid.split("::")[0] in LONG_UNIT_MODULES:
        return -1
    names = {m.name for m in item.iter_markers()}
    return 0 if "integration" in names else 1 if "component" in names else 2


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Each collected test's markers among the three, before -m deselects any (test_markers.py);
    and the order above (a stable sort: each module's tests keep theirs)."""
    config.stash[MARKS_KEY] = {item.nodeid: sorted({m.name for m in item.iter_markers()} & set(MARKERS))
                               for item in items}
    items.sort(key=_cost_rank)


MARKS_KEY = pytest.StashKey[dict]()
_COUNT_KEY = pytest.StashKey[int]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    item.stash[_COUNT_KEY] = _started[0]
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    started = _started[0] - item.stash.get(_COUNT_KEY, _started[0])
    if started and item.get_closest_marker("unit") is not None:
        raise pytest.fail.Exception(f"{item.nodeid} is marked unit but started {started} process(es) "
                                    "(fixtures included): move its module to tests/component and mark it component",
                                    pytrace=False)
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if started and isinstance(tmp, Path) and (left := _shm_pools_under(tmp)):
        for pool, _ in left:                 # removed, so that one test's leak is not the next one's
            shutil.rmtree(pool, ignore_errors=True)
        raise pytest.fail.Exception(f"{item.nodeid} left the shm pool of its run directory {left[0][1]} in "
                                    f"{left[0][0]}: stop what it started", pytrace=False)
    return result


def _shm_pools_under(tmp: Path, depth: int = 3) -> list[tuple[Path, Path]]:
    """(shm pool, run directory) for every directory under tmp (to `depth` levels) whose
    shm-backed pool still exists in /dev/shm (device/appliance/rundir.shm_dir)."""
    from pfcxl.device.appliance.rundir import shm_dir
    found, level = [], [tmp]
    for _ in range(depth + 1):
        found += [(shm_dir(d), d) for d in level if shm_dir(d).exists()]
        level = [c for d in level for c in (d.iterdir() if d.is_dir() else ()) if c.is_dir() and not c.is_symlink()]
    return found


MATRIX = Path(__file__).parent / "integration" / "test_kernel_matrix.py"


def pytest_addoption(parser) -> None:
    parser.addoption("--kernels", metavar="LIST", default=None,
                     help="run the kernel matrix on these kernels, comma-separated: default (setup's 6.12), a "
                     "Debian version or latest (--kernel-package), or a path: a build tree, or FILE:MODULES_DIR")


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    if collection_path == MATRIX and config.getoption("kernels") is None:
        return True
    return None


def pytest_generate_tests(metafunc) -> None:
    if "matrix_kernel" in metafunc.fixturenames:
        specs = [s.strip() for s in metafunc.config.getoption("kernels").split(",") if s.strip()]
        metafunc.parametrize("matrix_kernel", specs, ids=specs)
