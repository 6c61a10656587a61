"""pfcxl/process.py, the one place pfcxl starts programs: each start logs its argv as a shell reads
it (shlex.join, logger "pfcxl.process"), and an exit status or a signal is worded in one line."""

from __future__ import annotations

import logging
import signal
import sys

import pytest

from pfcxl import process
from pfcxl.errors import SetupError

pytestmark = pytest.mark.component


def test_every_way_of_starting_logs_the_argv_as_a_shell_reads_it(caplog, tmp_path):
    odd = "it's a \"name\" with spaces"
    with caplog.at_level(logging.DEBUG, logger="pfcxl.process"):
        process.run(["echo", odd], what="echo")
        process.capture(["echo", odd], text=True)
        child = process.start(["echo", odd], stdout=process.DEVNULL)
        child.wait()
        process.probe(["echo", odd], timeout=30)
    logged = [r.getMessage() for r in caplog.records if r.name == "pfcxl.process"]
    assert logged == ["starting: echo 'it'\"'\"'s a \"name\" with spaces'"] * 4


def test_a_failed_run_is_one_error_naming_the_step_the_status_and_the_command():
    with pytest.raises(SetupError) as caught:
        process.run([sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"],
                    what="the probe step", error=SetupError)
    text = str(caught.value)
    assert text.startswith(f"the probe step: {sys.executable} exited with status 3:\nboom\ncommand: ")


def test_an_exit_by_signal_names_the_signal():
    done = process.capture([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    assert done.returncode == -signal.SIGTERM
    assert process.describe_exit(["py"], done.returncode) == "py was killed by SIGTERM"
    assert process.describe_exit(["py"], -77) == "py was killed by signal 77"
    assert process.describe_exit(["py"], 2) == "py exited with status 2"
