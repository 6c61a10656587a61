"""Fixtures of the component tests (helpers that are plain functions live in
appliance_helpers.py, hostile_helpers.py, bounded_cli.py), and the compile helpers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pfcxl import cache
from pfcxl.errors import BuildError
from pfcxl.guest.python import pfcxl_kvstore
from pfcxl.host_tools.image import initramfs as image
from pfcxl.host_tools import appliance_client as appliance
from pfcxl.serving.chunks import KV_CHUNK_TOKENS

from .appliance_helpers import Running, _stop_and_check, write_topology
from .hostile_helpers import RealHost


def compile_guest_tool(name: str) -> Path:
    """guest/src/<name>.c built by the image builder's own function into the image builder's own
    directory, where build_tool names each binary by the hash of its inputs: one compile per
    change of source, headers or flags for every test module, worker and guest image, not one per
    module and worker; fail (never skip) if it cannot."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc not found on PATH: run 'make setup', which installs gcc and libc6-dev "
                    "(static libc) for building guest tools")
    try:
        return image.build_tool(name, cache.images_dir() / "tools")
    except BuildError as exc:
        pytest.fail(f"{exc}\n(if it cannot find -lc, libc6-dev (libc.a) is missing: run 'make setup')")


def sparse_file(path: Path, size: int) -> Path:
    """A sparse file of `size` bytes (a stand-in for /dev/daxN.M, or a pool)."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def kv_pool(tmp_path: Path, size: int = 64 << 20, hosts: int = 4, slots: int = 256) -> str:
    """A pool file of `size` bytes holding an empty KV store (guest/python/pfcxl_kvstore.py)."""
    path = sparse_file(tmp_path / "pool", size)
    pfcxl_kvstore.format(str(path), hosts=hosts, slots=slots, chunk_tokens=KV_CHUNK_TOKENS)
    return str(path)


@pytest.fixture
def services(tmp_path):
    """start(**appliance values, run_dir=...) -> Running; every service started is stopped and
    its process checked gone at teardown."""
    started: list[tuple[Path, int]] = []

    def start(run_dir: Path | None = None, **values: object) -> Running:
        topo, path = write_topology(tmp_path / f"topology-{len(started)}.toml", **values)
        run_dir = run_dir or tmp_path / "run"
        pid = appliance.start(topo, path, run_dir, scan_interval=3600)
        started.append((run_dir, pid))
        return Running(run_dir, pid, topo, path)

    yield start
    errors = []
    for run_dir, pid in started:
        try:
            _stop_and_check(run_dir, pid)
        except AssertionError as exc:
            errors.append(str(exc))
    assert not errors, errors


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    topo, path = write_topology(base / "small.toml")
    run_dir = base / "run"
    pid = appliance.start(topo, path, run_dir, scan_interval=3600)
    host = None
    try:
        host = RealHost(Running(run_dir, pid, topo, path))
        host.check()
        yield host
    finally:
        if host is not None:
            host.client.close()
        _stop_and_check(run_dir, pid)
