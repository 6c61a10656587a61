"""The README's first-hour step 4 ("Serving"), every `pfcxl` command of it run as written, on a
fresh cache (PFCXL_CACHE an empty directory: no appliance running, nothing formatted).

Scaled: the bundled conversation trace is replaced, for these commands, by its first 300
requests (the commands name it, `conversation`, as the README does), so the step takes seconds,
not the minutes of the whole trace. `pfcxl kv replay` then starts a temporary appliance, formats
its pool and replays into it, and stops the appliance afterwards."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tempfile
from pathlib import Path

import pytest

from pfcxl.host_tools.cli.main import main as cli_main
from pfcxl.serving import traces

pytestmark = pytest.mark.component

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
SLICE = 300


def step_commands(number: int) -> list[str]:
    """The backquoted `pfcxl ...` commands of the first hour's step `number`, one line each."""
    step = re.search(rf"^{number}\. \*\*.*?(?=^{number + 1}\. )", README, re.S | re.M)
    assert step, f"no step {number} in the README"
    return [" ".join(c.split()) for c in re.findall(r"`(pfcxl [^`]*)`", step[0])]


def test_step_4_names_the_replay_as_the_issue_ran_it():
    assert "pfcxl kv replay conversation --hosts 10 --compare" in step_commands(4)


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    # short paths: a temporary appliance's control socket lives under them, and a unix socket's path
    # is at most 107 bytes (pytest's own tmp_path under xdist is already about 70)
    short = Path(tempfile.mkdtemp(prefix="pfcxl-r4-", dir="/tmp"))
    monkeypatch.setenv("PFCXL_CACHE", str(short / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(short))          # where a temporary appliance's directory goes
    full = traces.load(traces.bundled("conversation"))
    part = tmp_path / "conversation_trace.jsonl"
    part.write_text("".join(json.dumps(dict(timestamp=r.timestamp_ms, input_length=r.input_length,
                                            output_length=r.output_length, hash_ids=list(r.hash_ids))) + "\n"
                            for r in full.requests[:SLICE]))
    real = traces.bundled
    monkeypatch.setattr(traces, "bundled", lambda name: part if name == "conversation" else real(name))
    yield tmp_path
    shutil.rmtree(short, ignore_errors=True)


@pytest.mark.parametrize("command", step_commands(4))
def test_every_command_of_step_4_runs_as_written_on_a_fresh_cache(fresh, capsys, command):
    status = cli_main(shlex.split(command)[1:])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "Traceback" not in captured.err
    if command.startswith("pfcxl kv replay"):
        assert "local against shared" in captured.out
        assert f"local: round-robin routing, {SLICE} requests" in captured.out
        assert f"shared: round-robin routing, {SLICE} requests" in captured.out
        assert "starting a temporary appliance" in captured.err
        assert captured.out.count(" 0 wrong") == 2
        assert not list(fresh.glob("pfcxl-appliance-*"))         # the temporary appliance is gone
