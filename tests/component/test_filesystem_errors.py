"""Filesystem problems are one line naming the path and the reason, never a traceback, and leave
nothing half-written; an interrupted image build leaves nothing either."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from pfcxl.device import topology
from pfcxl import cache
from pfcxl.host_tools.image import initramfs as image
from pfcxl.host_tools.vm import qemu

REAL_MANIFEST = cache.manifest_path()     # before any test moves PFCXL_CACHE
REAL_IMAGES = cache.images_dir()

pytestmark = pytest.mark.component


def pfcxl(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def one_error_line(done: subprocess.CompletedProcess, code: int, text: str) -> None:
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and text in errors[0], done.stderr


def mount_readonly_tmpfs(where: pathlib.Path, files: dict[str, str] | None = None) -> None:
    # As root, permissions do not stop writes: only a read-only mount does.
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], check=True)
    for name, text in (files or {}).items():
        (where / name).write_text(text)
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)


@pytest.fixture
def readonly(tmp_path):
    mounted = []

    def _make(files: dict[str, str] | None = None) -> pathlib.Path:
        where = tmp_path / f"ro{len(mounted)}"
        mount_readonly_tmpfs(where, files)
        mounted.append(where)
        return where

    yield _make
    for where in mounted:
        subprocess.run(["umount", str(where)], check=True)


def test_run_dir_on_a_read_only_directory(readonly):
    ro = readonly()
    one_error_line(pfcxl("run", "--run-dir", str(ro), "--", "true"), 1,
                   f"--run-dir {ro}: cannot write there: Read-only file system")
    one_error_line(pfcxl("run", "--run-dir", str(ro / "sub"), "--", "true"), 1,
                   f"--run-dir {ro / 'sub'}: cannot write there: Read-only file system")


def test_run_dir_on_an_existing_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("mine\n")
    one_error_line(pfcxl("run", "--run-dir", str(f), "--", "true"), 1,
                   f"--run-dir {f}: exists and is not a directory")
    assert f.read_text() == "mine\n"


def test_tables_out_on_a_read_only_path_or_a_file(readonly, tmp_path):
    ro = readonly()
    one_error_line(pfcxl("tables", "pf-nic", "--out", str(ro / "t")), 1,
                   f"--out {ro / 't'}: cannot write there: Read-only file system")
    f = tmp_path / "file"
    f.write_text("mine\n")
    one_error_line(pfcxl("tables", "pf-nic", "--out", str(f)), 1, f"--out {f}: exists and is not a directory")
    assert f.read_text() == "mine\n"


def test_read_only_cache(readonly):
    ro = readonly({"setup.json": cache.manifest_path().read_text()})
    done = pfcxl("image", env={"PFCXL_CACHE": str(ro)})
    one_error_line(done, 4, "building the guest image: ")
    assert "Read-only file system" in done.stderr and f"the image cache is {ro}/images" in done.stderr


def test_backing_file_made_by_a_concurrent_boot_is_shared_not_an_error(tmp_path, monkeypatch):
    topo = topology.load(topology.resolve("pf-nic"))
    first = qemu.prepare_backing(topo, tmp_path)
    # The other boot created the file after this one looked: replay that interleaving.
    monkeypatch.setattr(pathlib.Path, "exists", lambda self: False)
    second = qemu.prepare_backing(topo, tmp_path)
    assert first == second
    assert [p.stat().st_size for p in second.values()] == [d.volatile for d in topo.devices]


def test_interrupted_image_build_leaves_nothing_in_the_cache(tmp_path, monkeypatch):
    # A cache of our own (the real one's setup record, and its compiled tools to save time).
    monkeypatch.setenv("PFCXL_CACHE", str(tmp_path))
    (tmp_path / "setup.json").write_text(REAL_MANIFEST.read_text())
    shutil.copytree(REAL_IMAGES / "tools", tmp_path / "images" / "tools")
    before = set((tmp_path / "images").iterdir())

    def interrupted(src, dst):
        raise KeyboardInterrupt   # Ctrl-C as the written image is put in place
    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        image.build(topology.load(topology.resolve("pf-nic")))
    assert set((tmp_path / "images").iterdir()) == before
