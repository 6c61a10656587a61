"""Machines that stay up: pfcxl up / exec / ps / down / run --reuse, booted for real.

Each test names its machines after its own pid, so parallel sessions do not meet."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from pfcxl.device import topology
from pfcxl.host_tools.fleet import detached
from pfcxl.host_tools.vm.boot_options import BootOptions

from .conftest import pfcxl_cli, pid_alive

pytestmark = pytest.mark.integration

COMMAND = ["sh", "-c", "echo 'out a  b'; echo err >&2; exit 3"]


def up(name: str, *options: str) -> dict:
    done = pfcxl_cli("up", "--name", name, *options, timeout=900)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == name
    return detached.describe(name)


def ps() -> str:
    return pfcxl_cli("ps", env={**os.environ, "COLUMNS": "300"}).stdout


def assert_gone(name: str, info: dict) -> None:
    """down left no process and no file."""
    assert not detached.machine_dir(name).exists()
    for pid in filter(None, (info["daemon_pid"], info["qemu_pid"])):
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(pid), f"pid {pid} still running after down"
    assert name not in ps()


def test_exec_is_run_two_execs_at_once_reuse_and_down(machine_name):
    a = machine_name("a")
    info = up(a)
    assert info["state"] == "ready" and pid_alive(info["qemu_pid"]) and pid_alive(info["daemon_pid"])
    listing = ps()
    assert a in listing and "pf-nic" in listing, listing

    ran = pfcxl_cli("run", "--", *COMMAND, timeout=900)
    execd = pfcxl_cli("exec", a, "--", *COMMAND, timeout=300)
    assert (execd.returncode, execd.stdout) == (ran.returncode, ran.stdout) == (3, "out a  b\nerr\n")

    # two execs at once: both complete, each with its own output and status
    results = {}

    def one(tag: str, status: int) -> None:
        results[tag] = pfcxl_cli("exec", a, "--", f"sleep 1; echo {tag}; exit {status}", timeout=300)

    threads = [threading.Thread(target=one, args=(t, s)) for t, s in (("first", 5), ("second", 6))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # (in tag order: the two finish in either order)
    assert [(results[t].returncode, results[t].stdout) for t in ("first", "second")] == [(5, "first\n"), (6, "second\n")]

    # --reuse takes the up machine (it sees a file an exec left there) ...
    assert pfcxl_cli("exec", a, "--", "touch /tmp/left-by-exec").returncode == 0
    reused = pfcxl_cli("run", "--reuse", "--", "ls /tmp/left-by-exec", timeout=300)
    assert reused.returncode == 0 and f"reusing machine '{a}'" in reused.stderr
    # ... and never one of another topology or other boot options
    path = topology.resolve("pf-nic")
    same = BootOptions()
    assert detached.find_reusable(path, same) == a
    for other in ({"append": "loglevel=7"}, {"cedt": "ours"}, {"image": "debian"}, {"lean": False}):
        assert detached.find_reusable(path, dataclasses.replace(same, **other)) is None, other
    assert detached.find_reusable(topology.resolve("two-hb-interleave"), same) is None
    # run --reuse with another --data-path, --issue or --run-dir boots its own guest
    from pfcxl.host_tools.cli import main as cli
    from pfcxl.host_tools.cli import machines as cli_machines

    def reused(*options: str) -> str | None:
        return cli_machines.reusable(cli.parser().parse_args(["run", "--reuse", *options, "--", "true"]))
    assert reused() == a
    assert reused("--data-path", "direct") is None and reused("--data-path", "both") is None
    assert reused("--issue", "independent") is None and reused("--run-dir", "elsewhere") is None

    # item 15: exec's output byte for byte
    execd = subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", "exec", a, "--", r"printf '\200\377A'"],
                           capture_output=True, timeout=300)
    assert (execd.returncode, execd.stdout) == (0, b"\x80\xffA")
    # item 14: a command timeout ends the command, not the machine, with its option given after
    # the name as well as before it; the next exec runs as usual
    late = pfcxl_cli("exec", a, "--command-timeout", "3", "--", "sleep 20", timeout=300)
    assert late.returncode == 5 and "did not finish within 3s: the guest killed it" in late.stderr, late.stderr
    assert len(late.stderr.strip().splitlines()) == 1
    assert detached.describe(a)["state"] == "ready"
    assert pfcxl_cli("exec", "--command-timeout", "30", a, "--", "echo after; exit 4", timeout=300) \
        .stdout == "after\n"

    assert pfcxl_cli("down", a).returncode == 0
    assert_gone(a, info)


def test_sigterm_to_up_brings_the_booting_machine_down(machine_name):
    # SIGTERM to `pfcxl up`'s process group said "guests were shut down" and
    # exited 130 while the daemon (a session of its own) booted on and answered exec later
    d = machine_name("d")
    up_cli = subprocess.Popen([sys.executable, "-m", "pfcxl.host_tools.cli.main", "up", "--name", d],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    where = detached.machine_dir(d)
    deadline = time.monotonic() + 300
    while not (where / detached.DAEMON).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    daemon_pid = detached.describe(d)["daemon_pid"]
    assert daemon_pid and pid_alive(daemon_pid)
    os.killpg(up_cli.pid, signal.SIGTERM)
    rc, stderr = up_cli.wait(timeout=120), up_cli.stderr.read()
    assert rc == 130 and stderr.strip().splitlines()[-1] == "pfcxl: interrupted; guests were shut down"
    assert_gone(d, {"daemon_pid": daemon_pid, "qemu_pid": None})


def test_a_killed_guest_is_reported_by_ps_and_exec(machine_name):
    b = machine_name("b")
    info = up(b)
    os.kill(info["qemu_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while detached.describe(b)["state"] == "ready" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert detached.describe(b)["state"].startswith("crashed")
    assert "crashed" in ps()
    execd = pfcxl_cli("exec", b, "--", "true", timeout=60)
    assert execd.returncode == 5 and "crashed" in execd.stderr and len(execd.stderr.splitlines()) == 1

    # its daemon killed too: dead, said by both, and down still cleans everything
    os.kill(info["daemon_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(info["daemon_pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert detached.describe(b)["state"].startswith("dead")
    execd = pfcxl_cli("exec", b, "--", "true", timeout=60)
    assert execd.returncode == 5 and "is dead" in execd.stderr
    assert pfcxl_cli("down", b).returncode == 0
    assert_gone(b, info)


def test_a_guest_that_cannot_boot_is_reported_and_down_removes_it(machine_name, tmp_path):
    c = machine_name("c")
    bad = tmp_path / "bad.toml"
    bad.write_text(topology.resolve("pf-nic").read_text())
    done = pfcxl_cli("up", "--name", c, "--append", "init=/nonexistent rdinit=/nonexistent", "-t", str(bad),
                     "--timeout", "120", timeout=900)
    assert done.returncode == 5 and f"machine '{c}' did not come up" in done.stderr
    info = detached.describe(c)
    assert info["state"].startswith("failed")
    assert pfcxl_cli("down", c).returncode == 0
    assert_gone(c, info)
