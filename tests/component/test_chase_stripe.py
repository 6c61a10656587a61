"""chase --stream --stripe G,N,K (guest/src/chase.c): a sequential stream laid on the K-th of every
N granules of G bytes, one module's share of an appliance's interleave, so that timed guests can
load one module's port (host_tools/experiments/paper_bw_guests.py). Run on a sparse file standing
in for /dev/dax0.0: where the walk ends says which lines it read; bad stripes are one line."""

from __future__ import annotations

import json
import subprocess

import pytest

from .conftest import compile_guest_tool, sparse_file

pytestmark = pytest.mark.component

MiB = 1 << 20
G, N, K, SPAN = 4096, 16, 3, 2 * MiB


@pytest.fixture(scope="module")
def chase():
    return compile_guest_tool("chase")


def striped_offset(line: int) -> int:
    """The byte offset of the walk's line `line` (wrapping over the span's lines)."""
    o = line * 64 % SPAN
    return (o // G * N + K) * G + o % G


@pytest.mark.parametrize("loads", [8, 64, 1000, SPAN // 64, SPAN // 64 + 520])
def test_a_striped_stream_reads_only_its_granules_in_order(chase, tmp_path, loads):
    dev = sparse_file(tmp_path / "dax", N * SPAN + 2 * MiB)
    done = subprocess.run([str(chase), "--dax", str(dev), "--stream", "--no-mark", "--span", str(SPAN),
                           "--loads", str(loads), "--stripe", f"{G},{N},{K}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert row["op"] == "stream" and row["loads"] == loads
    end = row["end"]
    assert end // G % N == K                              # every line it reads is on granule K
    assert end == striped_offset(loads)                   # the next line after `loads` of them


@pytest.mark.parametrize("extra,says", [
    (["--stream", "--stripe", f"{G},{N},{N}"], "K < N"),
    (["--stream", "--stripe", f"100,{N},1"], "a multiple of 512"),
    (["--stream", "--stripe", f"{G},{N}"], "want G,N,K"),
    (["--stripe", f"{G},{N},1"], "give --stream"),
    (["--stream", "--local", "--stripe", f"{G},{N},1"], "not --local"),
    (["--stream", "--stripe", f"{G},64,1"], "exceeds the device size"),
])
def test_a_bad_stripe_is_one_line(chase, tmp_path, extra, says):
    dev = sparse_file(tmp_path / "dax", N * SPAN + 2 * MiB)
    done = subprocess.run([str(chase), "--dax", str(dev), "--no-mark", "--span", str(SPAN), "--loads", "64",
                           *extra], capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr, done.stderr


@pytest.mark.parametrize("stripe", [[], ["--stripe", f"{G},{N},{K}"]], ids=["plain", "striped"])
def test_a_paced_stream_waits_at_least_its_gap_a_line(chase, tmp_path, stripe):
    """--gap-ticks T: each 8 lines take at least 8 T TSC ticks (spun on the TSC: a floor, whatever
    the host's load), so a traffic host offers at most 64 B per T ticks."""
    dev = sparse_file(tmp_path / "dax", N * SPAN + 2 * MiB)
    done = subprocess.run([str(chase), "--dax", str(dev), "--stream", "--no-mark", "--span", str(SPAN),
                           "--loads", "4096", "--gap-ticks", "200", *stripe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert row["p50_ticks_per_load"] >= 200 and row["loads"] == 4096


@pytest.mark.parametrize("extra,says", [
    (["--gap-ticks", "100"], "give --stream"),
    (["--stream", "--gap-ticks", str(1 << 40)], "at most 2^32"),
])
def test_a_bad_gap_is_one_line(chase, tmp_path, extra, says):
    dev = sparse_file(tmp_path / "dax", N * SPAN + 2 * MiB)
    done = subprocess.run([str(chase), "--dax", str(dev), "--no-mark", "--span", str(SPAN), "--loads", "64",
                           *extra], capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr, done.stderr
