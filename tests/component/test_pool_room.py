"""A pool larger than the file system under it: refused at start in one line naming the file
system (device/appliance/fs_room.py), and a SIGBUS while a host tool touches a pool file turned into one
line naming it (host_tools/bus_error.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pfcxl.device.appliance import fs_room
from pfcxl.device import topology
from pfcxl.device.appliance.pool import Pool
from pfcxl.device.topology import Topology
from pfcxl.device.topology.units import GiB, MiB
from pfcxl.errors import ApplianceError
from pfcxl.host_tools import appliance_client as appliance

from .appliance_helpers import write_topology

pytestmark = pytest.mark.component

def too_large_for(folder: Path, name: str, more: int) -> tuple[Topology, Path]:
    """An appliance topology whose pool (its shared region, in files under `folder`) is `more`
    bytes (rounded up) beyond the free room there; its window grown to map it."""
    free, _ = fs_room.free_bytes(folder)
    shared = (free + more) // GiB * GiB + GiB
    _, path = write_topology(folder / name, private="0", backing="directory")
    text = path.read_text()
    for key, value in (("shared", shared), ("module_capacity", -(-shared // 4 // GiB) * GiB),
                       ("volatile", shared), ("size", 2 * shared)):    # the first device is the pool's
        text, n = re.subn(rf'^{key} = "[^"]*"', f'{key} = "{value // MiB}M"', text, count=1, flags=re.M)
        assert n == 1, key
    path.write_text(text)
    return topology.load(path), path


def test_a_pool_beyond_its_file_systems_room_is_refused_in_one_line(tmp_path):
    for more in (0, GiB, 7 * GiB):
        topo, _ = too_large_for(tmp_path, f"t{more}.toml", more)
        where = tmp_path / f"pool{more}"
        with pytest.raises(ApplianceError) as exc:
            Pool(topo.appliance, where)
        message = str(exc.value)
        assert "\n" not in message and f"on {fs_room.filesystem(tmp_path)}, which has" in message
        assert not list(where.glob("*")), "nothing is left half-made"


def test_appliance_start_refuses_such_a_pool_naming_the_file_system(tmp_path):
    topo, path = too_large_for(tmp_path, "t.toml", 0)
    try:
        appliance.start(topo, path, tmp_path / "run", scan_interval=3600)
    except ApplianceError as exc:
        assert f"more under {tmp_path / 'run' / 'pool'}, on {fs_room.filesystem(tmp_path)}, which has" in str(exc)
    else:
        appliance.stop(tmp_path / "run")
        pytest.fail("an appliance started on a pool its file system has no room for")
    assert appliance.running_pid(tmp_path / "run") is None


def test_a_pool_that_fits_its_room_still_starts(tmp_path):
    topo, _ = write_topology(tmp_path / "t.toml", backing="directory")
    with Pool(topo.appliance, tmp_path / "pool") as pool:
        assert len(pool.partitions) == 3


# The pool file cut short under the mapping stands for a full file system (a tmpfs past its
# size): either way the next page the store touches cannot be had and the kernel sends SIGBUS.
BENCH_ON_A_VANISHING_FILE = textwrap.dedent("""
    import os, sys
    from pfcxl.host_tools.cli import main as cli
    from pfcxl.host_tools.cli import kv as cli_kv
    pool = sys.argv[1]
    assert cli.main(["kv", "format", "--pool", pool]) == 0
    put = cli_kv.kv.Store.put
    def put_after_the_file_lost_its_pages(self, key, value):
        os.truncate(pool, 0)
        return put(self, key, value)
    cli_kv.kv.Store.put = put_after_the_file_lost_its_pages
    sys.exit(cli.main(["kv", "bench", "--pool", pool, "--blocks", "2", "--size", "64K"]))
""")


def test_a_sigbus_in_kv_bench_is_one_line_naming_the_file_system(tmp_path):
    pool = tmp_path / "shared.pool"
    with open(pool, "wb") as f:
        f.truncate(64 * MiB)
    run = subprocess.run([sys.executable, "-c", BENCH_ON_A_VANISHING_FILE, str(pool)], capture_output=True,
                         text=True, timeout=300)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == ApplianceError.exit_code, run.stderr
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"pfcxl: error: {pool}: ") and f"({fs_room.filesystem(pool)}; SIGBUS)" in lines[0]


def test_an_shm_pool_too_large_for_dev_shm_is_offered_the_run_directory_with_its_room(tmp_path, monkeypatch):
    """A small /dev/shm refused an shm pool with no other place named: the
    line now names where backing "directory" would put it, and its room there."""
    from pfcxl.device.appliance import rundir
    from pfcxl.device.appliance.service import Service
    topo, _ = write_topology(tmp_path / "t.toml", backing="shm")
    run_dir = tmp_path / "run"
    small = rundir.shm_dir(run_dir)

    def free(path):                          # /dev/shm has 1 MiB left; the run directory's disk 100 GiB
        return (MiB, 64 * MiB) if str(Path(path)).startswith(str(small)) else (100 * GiB, 200 * GiB)
    monkeypatch.setattr(fs_room, "free_bytes", free)
    try:
        with pytest.raises(ApplianceError) as exc:
            Service(topo, run_dir, tmp_path / "sock", scan_interval=3600)
        message = str(exc.value)
        assert "\n" not in message and f"more under {small}, on " in message
        assert (f'or give the appliance backing "directory" ({run_dir / "pool"}, on '
                f"{fs_room.filesystem(run_dir)}, has 100.00 GiB free), a smaller pool or backing \"memfd\"") in message
        assert not small.exists()                     # refused before its directory was made
        monkeypatch.setattr(fs_room, "free_bytes", lambda path: (MiB, 64 * MiB))
        with pytest.raises(ApplianceError, match=r'backing "directory" \(.*, has only 1.0 MiB free too\)'):
            Service(topo, run_dir, tmp_path / "sock", scan_interval=3600)
    finally:
        shutil.rmtree(small, ignore_errors=True)
