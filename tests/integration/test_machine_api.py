"""The public API is the one boot path: what `pfcxl qemu-args` prints is exactly what a boot
execs (every shipped topology, every timing mode), a dry run starts nothing, the API's Machine
and Appliance work together, and a user's own test file outside this repository runs with the
pytest plugin the package ships."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pfcxl import Appliance, Machine
from pfcxl.device import topology
from pfcxl.errors import VMError

from .conftest import pfcxl_cli, pid_alive, qemu_pids_using

pytestmark = pytest.mark.integration

SHIPPED = [p.stem for p in topology.shipped_topologies()]
TIMING_MODES = [None, "count", "trace", "inject"]
# every timing mode on the CXL path, and the direct path with and without the CXL region
CASES = [(mode, None) for mode in TIMING_MODES] + [("count", "both"), (None, "direct")]
BASELINE_NS = "370"   # inject: given, so that the plan need not measure it


def launched_argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")


# `pfcxl qemu-args` for many cases in one child; each case's stdout and stderr go to files of
# their own, as when the CLI runs alone
PRINTER = r"""
import json, os, sys, tempfile
from pfcxl.host_tools.cli import main as cli
saved, done = (os.dup(1), os.dup(2)), []
for argv in json.load(sys.stdin):
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)
        try:
            rc = cli.main(argv)
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        out.seek(0), err.seek(0)
        done.append({"rc": rc, "stdout": out.read().decode(), "stderr": err.read().decode()})
json.dump(done, sys.stdout)
"""


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> dict[tuple, tuple[Path, dict]]:
    """`pfcxl qemu-args --lines` for every shipped topology in every case, all printed by one child
    (the CLI's imports paid once, not once per case): (name, mode, path) -> (run dir, rc/stdout/stderr)."""
    base = tmp_path_factory.mktemp("printed")
    cases = {}
    for name in SHIPPED:
        for mode, path in CASES:
            run_dir = base / name / f"run-{mode}-{path}"
            options = ["--run-dir", str(run_dir)] + (["--timing", mode] if mode else [])
            options += ["--baseline-ns", BASELINE_NS] if mode == "inject" else []
            options += ["--data-path", path] if path else []
            cases[(name, mode, path)] = (run_dir, ["qemu-args", name, "--lines", *options])
    done = subprocess.run([sys.executable, "-c", PRINTER], input=json.dumps([argv for _, argv in cases.values()]),
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return {key: (run_dir, shown) for (key, (run_dir, _)), shown in zip(cases.items(), json.loads(done.stdout))}


@pytest.mark.parametrize("name", SHIPPED)
def test_printed_argv_is_the_launched_argv(name, printed, tmp_path):
    served = any(d.appliance for d in topology.load(topology.resolve(name)).devices)
    with Appliance(name, run_dir=tmp_path / "appliance") if served else _nothing() as app:
        for mode, path in CASES:
            run_dir, shown = printed[(name, mode, path)]
            assert shown["rc"] == 0, f"{name}, timing {mode}, data path {path}: {shown['stderr']}"
            assert not run_dir.exists()                   # printing writes nothing
            machine = Machine(name, run_dir=run_dir, timing=mode, baseline_ns=float(BASELINE_NS),
                              appliance=app, data_path=path)
            try:
                machine.launch()                          # QEMU started; no need to wait for the guest
                argv = launched_argv(machine.pid)
                assert machine.argv == argv
            finally:
                machine.close()
            assert shown["stdout"].splitlines() == argv, f"{name}, timing {mode}, data path {path}"
            # every file the command line names exists where it said
            for word in argv:
                for part in word.split(","):
                    path = part.split("=", 1)[-1]
                    if path.startswith(str(run_dir)) and not path.endswith(".plugin.log"):
                        assert Path(path).exists(), f"{name}: argv names {path}, which the boot did not write"


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path):
    run_dir = tmp_path / "never"
    done = pfcxl_cli("run", "-t", "electrical-switch", "--timing", "trace", "--dry-run", "--run-dir", str(run_dir),
                     "--", "cxl", "list")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for expected in ("topology   electrical-switch", "image ", "CEDT ", "CDAT ", "command    cxl list",
                     "qemu-system-x86_64", "-plugin", f"{run_dir}/guest.tables/"):
        assert expected in text, f"{expected!r} missing from the plan:\n{text}"
    assert not run_dir.exists() and not qemu_pids_using(run_dir)
    # the kernel it names is the file the argv boots (a lean boot's PVH vmlinux, not the vmlinuz)
    named = next(line.split()[1] for line in text.splitlines() if line.startswith("boots "))
    argv = pfcxl_cli("qemu-args", "electrical-switch", "--lines").stdout.splitlines()
    assert argv[argv.index("-kernel") + 1] == named


def test_machine_api_on_an_appliance(tmp_path):
    with Appliance("pf-appliance", run_dir=tmp_path / "appliance") as app:
        with app.machine(3, run_dir=tmp_path / "host3") as m:
            assert m.attachment.host == 3
            assert [r["dax"] for r in m.ready["regions"]] == ["dax0.0", "dax1.0"]
            result = m.run("sh -c 'echo out; exit 4'")
            assert (result.status, result.output) == (4, "out\n")
            assert m.qmp("query-status")["status"] == "running"
            pid = m.pid
            hosts = [h["host"] for h in app.status()["hosts"]]
            assert hosts == [3]
        assert not pid_alive(pid)
        with pytest.raises(VMError, match="state stopped"):
            m.run("true")


USER_TESTS = '''
import pytest


def test_region(pfcxl_machine):
    assert "region0" in pfcxl_machine.run("cxl list -R").output


@pytest.mark.pfcxl(host=2)
def test_on_the_appliance(pfcxl_appliance, pfcxl_machine):
    assert pfcxl_machine.attachment.host == 2
    assert pfcxl_machine.run("ls /dev/dax1.0").status == 0
'''


def test_a_users_own_test_file_runs_with_the_plugin(tmp_path):
    outside = tmp_path / "someone-elses-tests"
    outside.mkdir()
    (outside / "test_mine.py").write_text(textwrap.dedent(USER_TESTS))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_mine.py"],
                          cwd=outside, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


WRAPPER = """#!/bin/sh
# logs the argv it was started with (NUL-separated), then becomes the real QEMU
printf '%s\\0' "$0" "$@" > "{log}"
exec {qemu} "$@"
"""


def test_own_qemu_and_its_arguments_are_what_boots(tmp_path):
    """--qemu: the wrapper pfcxl was given is what runs (its log holds the printed argv), with the
    --qemu-arg options last; QEMU took them (QMP reports the -name given); the guest boots."""
    from pfcxl.host_tools.provision.host import QEMU_BINARY
    log = tmp_path / "wrapper.argv"
    wrapper = tmp_path / "my-qemu"
    wrapper.write_text(WRAPPER.format(log=log, qemu=QEMU_BINARY))
    wrapper.chmod(0o755)
    run_dir = tmp_path / "run"
    own = ["-name", "pfcxl-own-qemu", "-msg", "timestamp=on"]
    printed = pfcxl_cli("qemu-args", "pf-nic", "--lines", "--run-dir", str(run_dir), "--qemu", str(wrapper),
                        *(f"--qemu-arg={a}" for a in own))
    assert printed.returncode == 0, printed.stderr
    dry = pfcxl_cli("run", "--dry-run", "--run-dir", str(run_dir), "--qemu", str(wrapper),
                    *(f"--qemu-arg={a}" for a in own), "--", "true")
    assert f"qemu       {wrapper} (QEMU 10." in dry.stdout and "extra arguments: -name pfcxl-own-qemu" in dry.stdout
    with Machine("pf-nic", run_dir=run_dir, qemu=wrapper, qemu_args=own) as m:
        logged = log.read_bytes().rstrip(b"\0").decode().split("\0")
        assert logged == m.argv == printed.stdout.splitlines()
        assert logged[0] == str(wrapper) and logged[-len(own):] == own
        assert launched_argv(m.pid) == [str(QEMU_BINARY)] + logged[1:]    # the wrapper exec'd QEMU
        assert m.qmp("query-name") == {"name": "pfcxl-own-qemu"}
        assert m.run("cxl list -M").ok
