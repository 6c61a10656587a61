"""The guest-side Python probes (pfcxl_guest), run on the host against a regular file."""

import pytest
import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path

GUEST_MODULE = Path(__file__).resolve().parents[2] / "guest" / "python" / "pfcxl_guest.py"

pytestmark = pytest.mark.component


def load_module():
    spec = importlib.util.spec_from_file_location("pfcxl_guest", GUEST_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_latency_chase_is_one_cycle_over_every_line(tmp_path):
    g = load_module()
    target = tmp_path / "dax"
    target.write_bytes(bytes(4 << 20))
    with g.Dax(str(target)) as dax:
        result = g.latency(dax, span=1 << 20, laps=2, seed=7)
    lines = (1 << 20) // 64
    assert result["lines"] == lines and result["loads"] == 2 * lines
    # the pointers written form one cycle through every line: follow them from the file
    data = target.read_bytes()
    seen, index = set(), 0
    for _ in range(lines):
        seen.add(index)
        index = struct.unpack_from("<Q", data, index * 8)[0]
    assert len(seen) == lines and index == 0


def test_bandwidth_moves_what_was_asked(tmp_path):
    g = load_module()
    target = tmp_path / "dax"
    target.write_bytes(bytes(4 << 20))
    with g.Dax(str(target)) as dax:
        wrote = g.bandwidth(dax, size=1 << 20, op="write")
        read = g.bandwidth(dax, size=1 << 20, op="read")
    assert wrote["bytes"] == read["bytes"] == 1 << 20
    words = struct.unpack_from(f"<{(1 << 20) // 8}Q", target.read_bytes())
    assert list(words[:4]) == [0, 1, 2, 3] and words[-1] == (1 << 20) // 8 - 1


def test_command_line_prints_json_and_errors_cleanly(tmp_path):
    target = tmp_path / "dax"
    target.write_bytes(bytes(4 << 20))
    done = subprocess.run([sys.executable, str(GUEST_MODULE), "latency", "--dax", str(target), "--span", "256K"],
                          capture_output=True, text=True)
    assert done.returncode == 0 and json.loads(done.stdout)["lines"] == 4096
    missing = subprocess.run([sys.executable, str(GUEST_MODULE), "latency", "--dax", str(tmp_path / "none")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.startswith("pfcxl_guest:") and "Traceback" not in missing.stderr
