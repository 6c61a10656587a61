"""pfcxl.Appliance takes every option of the service (device/appliance/service.py), and each one
reaches the service: what the running service reports (status, hello), how it treats an idle
connection, which process it is (foreground). Bad options are one line and start nothing.
Real services, no VMs; each one started here is stopped and checked gone."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap

import pytest

from pfcxl import Appliance
from pfcxl.device.appliance import rundir
from pfcxl.device.fabric.modes import ISSUES, APPLIANCE_FABRICS
from pfcxl.errors import PfcxlError
from pfcxl.host_tools import appliance_client as appliance

from .appliance_helpers import Raw, wait_until, write_topology

pytestmark = pytest.mark.component


@pytest.fixture
def small(tmp_path):
    return write_topology(tmp_path / "small.toml")[1]


def _gone(pid: int) -> bool:
    return not appliance._alive(pid)


@pytest.mark.parametrize("timing,issue,capture", [(None, "dependent", False)] + [
    (system, issue, capture) for system, issue, capture in itertools.product(APPLIANCE_FABRICS, ISSUES, (False, True))])
def test_every_option_reaches_the_service(small, tmp_path, timing, issue, capture):
    run_dir, folder = tmp_path / "run", tmp_path / "capture"
    with Appliance(small, run_dir=run_dir, scan_interval=2.5, idle_timeout=1, fabric=timing, issue=issue,
                   capture=folder if capture else None) as a:
        pid = a.pid
        assert a.started_here and appliance.running_pid(run_dir) == pid
        status = a.status()
        assert status["pid"] == pid and status["scan"]["interval"] == 2.5
        assert status["appliance"]["timing"] == (None if timing is None else {
            "system": timing, "issue": issue, "capture": str(folder.absolute()) if capture else None})
        # the idle timeout: a connection that says nothing is closed after 1 s, not the default 60
        raw = Raw(run_dir)
        assert raw.until_closed() == [{"ok": False, "error": "closed: idle for 1s without an attachment",
                                       "closed": "idle"}]
        raw.close()
    wait_until(lambda: _gone(pid), f"the service (pid {pid}) started by the Appliance gone at close")
    assert appliance.running_pid(run_dir) is None


def test_serve_status_where_and_stop_on_a_service_that_outlives_the_object(small, tmp_path):
    run_dir = tmp_path / "run"
    pid = Appliance(small, run_dir=run_dir, fabric="pf", issue="independent").serve()
    try:
        # another object, with no options, talks to the same service (`pfcxl appliance status`)
        other = Appliance(small, run_dir=run_dir)
        assert other.running_pid() == pid and other.status()["pid"] == pid
        assert other.call("hello")["appliance"]["timing"]["issue"] == "independent"
        w = other.where(0)
        assert (w["offset"], w["module"], w["module_offset"]) == (0, 0, 0)
        with pytest.raises(PfcxlError, match="^an appliance is already running for "):
            Appliance(small, run_dir=run_dir).serve()
    finally:
        said = Appliance(small, run_dir=run_dir).stop()
    assert said == f"stopped pid {pid}" and _gone(pid)
    assert Appliance(small, run_dir=run_dir).stop() == "no appliance was running"


def test_a_running_service_is_used_only_if_it_times_and_captures_as_asked(small, tmp_path):
    run_dir = tmp_path / "run"
    pid = Appliance(small, run_dir=run_dir).serve()
    try:
        with pytest.raises(PfcxlError, match=f"^the appliance running in {run_dir} models no traffic"):
            Appliance(small, run_dir=run_dir, fabric="pf").start()
        with Appliance(small, run_dir=run_dir) as a:      # used as it is, and left running
            assert a.pid == pid and not a.started_here
        assert appliance.running_pid(run_dir) == pid
        with Appliance(small, run_dir=run_dir, temporary=True) as a:   # temporary is for one it starts
            assert a.pid == pid and not a.started_here
        assert appliance.running_pid(run_dir) == pid and (run_dir / appliance.SOCKET).exists()
    finally:
        Appliance(small, run_dir=run_dir).stop()
    pid = Appliance(small, run_dir=run_dir, fabric="pf", capture=tmp_path / "a").serve()
    try:
        with pytest.raises(PfcxlError, match=f"captures into {tmp_path / 'a'}, not {tmp_path / 'b'}"):
            Appliance(small, run_dir=run_dir, fabric="pf", capture=tmp_path / "b").start()
    finally:
        Appliance(small, run_dir=run_dir).stop()
    assert _gone(pid)


FOREGROUND = textwrap.dedent("""
    import sys
    from pfcxl import Appliance
    Appliance(sys.argv[1], run_dir=sys.argv[2], foreground=True, idle_timeout=1).serve()
    print("serve() returned", flush=True)
""")


def test_foreground_makes_this_process_the_service(small, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", FOREGROUND, str(small), str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: appliance.running_pid(run_dir) is not None and (run_dir / appliance.SOCKET).exists(),
                   "the foreground service up")                  # the lock is taken before the socket is made
        assert appliance.running_pid(run_dir) == proc.pid          # the very process that called serve()
        raw = Raw(run_dir)                                         # with its options
        assert raw.until_closed()[0]["error"] == "closed: idle for 1s without an attachment"
        raw.close()
    finally:
        Appliance(small, run_dir=run_dir).stop()
        out, err = proc.communicate(timeout=60)
    assert "serve() returned" not in out and "stopped" in err       # it logged to its stderr


# Every bad option, alone: (keywords, what the one line must say).
BAD = [({"fabric": fabric}, f"appliance timing '{fabric}' is not one of") for fabric in ("", "PF", "trace", "dram")]
BAD += [({"issue": issue}, f"issue '{issue}' is not one of") for issue in ("", "Dependent", "random")]
BAD += [({"capture": "somewhere"}, "--capture keeps what the appliance's timing drains")]
BAD += [({"idle_timeout": t}, f"idle timeout {t:g}s: it must be more than 0 seconds") for t in (0, -1, float("nan"))]
BAD += [({"scan_interval": t}, f"scan interval {t:g}s: it must be more than 0 seconds")
        for t in (0, -0.5, float("nan"), float("inf"))]


@pytest.mark.parametrize("options,said", BAD, ids=[repr(o) for o, _ in BAD])
def test_a_bad_option_is_one_line_and_starts_nothing(small, tmp_path, options, said):
    run_dir = tmp_path / "run"
    with pytest.raises(PfcxlError) as caught:
        Appliance(small, run_dir=run_dir, **options).start()
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)
    assert not run_dir.exists() and not rundir.shm_dir(run_dir).exists()


def test_bad_uses_are_one_line_too(small, tmp_path):
    with pytest.raises(PfcxlError, match="^topology 'pf-nic' has no \\[appliance\\] section$"):
        Appliance("pf-nic")
    with pytest.raises(PfcxlError, match="^foreground: the service runs in this process, so use serve"):
        Appliance(small, run_dir=tmp_path / "run", foreground=True).start()
    assert not (tmp_path / "run").exists()
    # the CLI's options go through the same checks: one line, no traceback, nothing started
    done = subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli", "appliance", "start", "-t", str(small),
                           "--run-dir", str(tmp_path / "run"), "--scan-interval", "0"],
                          capture_output=True, text=True, timeout=120, env={**os.environ})
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.strip() == "pfcxl: error: scan interval 0s: it must be more than 0 seconds, and finite"
    assert not (tmp_path / "run").exists()
