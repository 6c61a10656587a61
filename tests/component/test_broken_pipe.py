"""`pfcxl ... | head`: a reader that stops early ends pfcxl quietly (status 1, no traceback),
whether the output goes through rich (topology list) or plain writes (kv stats --json)."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.component


def pfcxl_into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    read_end, write_end = os.pipe()
    os.close(read_end)            # the reader is gone before pfcxl prints a byte
    try:
        return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", *args], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)


@pytest.fixture
def store(tmp_path):
    pool = tmp_path / "pool"
    with open(pool, "wb") as f:
        f.truncate(64 << 20)
    done = subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", "kv", "format", "--pool", str(pool),
                           "--hosts", "2", "--slots", "16"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return pool


@pytest.mark.parametrize("args", [("topology", "list"), ("kv", "stats", "--json")])
def test_a_closed_stdout_ends_pfcxl_quietly(store, args):
    args = args + (("--pool", str(store)) if args[0] == "kv" else ())
    done = pfcxl_into_a_closed_pipe(*args)
    assert done.returncode == 1, done.stderr
    assert done.stderr == ""      # no BrokenPipeError traceback, no "Exception ignored" line
