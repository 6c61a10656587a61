"""The KV block store across real guests on one appliance: every host of three loads every other
host's blocks bit-exact (both chunk sizes), one winner for a contended key, a producer's QEMU killed
mid-store exposes nothing, a full arena evicts, and the host reads the same store (pfcxl kv)."""

import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

import pfcxl
from pfcxl.host_tools.vm.boot_options import BootOptions
from pfcxl.device.appliance import rundir
from pfcxl.device import topology
from pfcxl.host_tools.cli import main as cli
from pfcxl.guest.python import pfcxl_kvstore as kv
from pfcxl.host_tools.fleet import multihost
from pfcxl.serving.chunks import chunk_bytes
from pfcxl.serving.inputs import load_model
from pfcxl.guest.tool_output import json_lines, tool_json


pytestmark = pytest.mark.integration
MiB = 1 << 20


def scaled_chunks(scale: int) -> str:
    """LLaMA-8B and 405B chunk sizes (12 and 48 GB per 100K tokens) divided by `scale`."""
    return ",".join(str(chunk_bytes(load_model(m).kv_bytes_per_token) // scale // 8 * 8)
                    for m in ("llama-8b", "llama-405b"))


def kv_cli(capsys, *argv):
    status = cli.main(["kv", *argv])
    return status, capsys.readouterr().out


def run_everywhere(run_dir: Path, hosts: int, blocks: int, sizes: str, tmp_path: Path) -> list[dict]:
    path = topology.resolve("pf-appliance")
    results = multihost.run(topology.load(path), path, hosts,
                            f"kvstore run /dev/dax0.0 --host {{host}} --hosts {{hosts}} --blocks {blocks} "
                            f"--sizes {sizes} --timeout 900", options=BootOptions(run_dir=str(tmp_path / f"hosts{hosts}")),
                            appliance_dir=run_dir)
    out = []
    for r in results:
        assert r.error is None and r.status == 0, (r.host, r.error, r.output[-2000:])
        out.append(tool_json(r.output, "kvstore"))
    return out


def test_every_host_loads_every_other_hosts_blocks(running_appliance, tmp_path, capsys):
    # three guests at once: each loads the blocks of two others (so no pair of hosts is all a load
    # can see) and three contend for one key; the blocks alternate the two chunk sizes. (A store
    # formatted for 16 hosts is the tests below; many writers at once, killed and evicting, is
    # tests/component/test_kvstore_stress.py.)
    hosts, blocks, scale = 3, 3, 2048
    run_dir = running_appliance()
    pool = rundir.shm_dir(run_dir) / "shared.pool"
    assert kv_cli(capsys, "format", "--pool", str(pool), "--hosts", str(hosts), "--slots", "64")[0] == 0
    sizes = scaled_chunks(scale)
    results = run_everywhere(run_dir, hosts, blocks, sizes, tmp_path)
    size_list = [int(s) for s in sizes.split(",")]
    for r in results:
        assert r["stored"] == blocks and r["loaded"] == hosts * blocks and r["missing"] == 0
        assert r["mismatched"] == 0                                     # every byte of every block
    assert sum(r["shared_won"] for r in results) == 1                   # one winner for the shared key
    winner = next(r["host"] for r in results if r["shared_won"])
    assert {r["shared_owner"] for r in results} == {winner}             # and everyone loaded its block whole
    # the host sees the same store in the pool file
    status, text = kv_cli(capsys, "verify", "--pool", str(pool), "--json")
    assert status == 0 and json.loads(text) == {"good": hosts * blocks + 1, "bad": [], "claims": 0}
    with kv.Store.open(str(pool)) as s:
        for h in range(hosts):
            for i in range(blocks):
                assert len(s.get(f"h{h}/b{i}")) == size_list[i % len(size_list)]


def test_a_producer_killed_mid_store_exposes_nothing_and_a_full_arena_evicts(tmp_path, capsys):
    with pfcxl.Appliance("pf-appliance", run_dir=tmp_path / "appliance") as app:
        pool = rundir.shm_dir(app.run_dir) / "shared.pool"
        assert kv_cli(capsys, "format", "--pool", str(pool), "--hosts", "16", "--slots", "64")[0] == 0
        with app.machine(host=0, ready_timeout=900) as h0, app.machine(host=1, ready_timeout=900) as h1:
            started = h1.start_command("kvstore put /dev/dax0.0 --host 1 --key big --size 48M")
            with kv.Store.open(str(pool)) as s:
                deadline = time.monotonic() + 600
                while not any(st & 1 for h, _, _, st in s.scan() if h == 1) and time.monotonic() < deadline:
                    time.sleep(0.01)
                os.kill(h1.pid, signal.SIGKILL)                           # in the middle of copying 48 MiB
                assert any(st & 1 for h, _, _, st in s.scan() if h == 1)
                assert s.get("big") is None and s.verify() == {"good": 0, "bad": [], "claims": 1}
            del started
            # the next writer of the key, on another host: host 1 stopped beating, so it goes on
            put = json.loads(h0.check("kvstore put /dev/dax0.0 --host 0 --key big --size 1M"))
            assert put["stored"] == 1
            got = h0.run("kvstore get /dev/dax0.0 --key big --size 1M")
            assert got.status == 0 and json.loads(got.output)["match"] == 1
            # a full arena: host 0's is 1/16 of the pool; 16 MiB blocks overflow it
            with kv.Store.open(str(pool)) as s:
                fits = s.sb["arena_bytes"] // (16 * MiB)
            for i in range(fits + 2):
                h0.check(f"kvstore put /dev/dax0.0 --host 0 --key e{i} --size 16M")
            status, text = kv_cli(capsys, "stats", "--pool", str(pool), "--json")
            assert json.loads(text)["hosts"][0]["evictions"] >= 2
            status, text = kv_cli(capsys, "verify", "--pool", str(pool), "--json")
            report = json.loads(text)
            assert status == 0 and report["bad"] == [] and report["claims"] == 1     # host 1's dead claim
            assert json.loads(h0.check("kvstore verify /dev/dax0.0"))["bad"] == 0


def test_poison_on_a_stored_block_is_a_miss_that_names_the_block(tmp_path, capsys):
    serial = topology.load(topology.resolve("pf-appliance")).device("pool").serial
    with pfcxl.Appliance("pf-appliance", run_dir=tmp_path / "appliance") as app:
        pool = rundir.shm_dir(app.run_dir) / "shared.pool"
        assert kv_cli(capsys, "format", "--pool", str(pool), "--hosts", "16", "--slots", "64")[0] == 0
        with app.machine(host=0, ready_timeout=900) as h0:
            for key in ("p0", "p1"):
                h0.check(f"kvstore put /dev/dax0.0 --host 0 --key {key} --size 64K")
            with kv.Store.open(str(pool)) as s:
                (_, slot, rec), = s.find("p1")
            # the region is the one device "pool": a DAX offset is its device address, and the store
            # starts at its byte HOME
            h0.qmp("cxl-inject-poison", path="/machine/peripheral/pool", start=kv.HOME + rec["offset"] + 4096,
                   length=128)
            h0.check("mount -t tracefs nodev /sys/kernel/tracing")
            poisoned = h0.run(f"kvstore get /dev/dax0.0 --key p1 --size 64K --poison-serial {serial}")
            got = tool_json(poisoned.output, "kvstore")
            assert poisoned.status == 1 and got["hit"] == 0 and got["match"] == 0
            assert got["poisoned"] == {"host": 0, "slot": slot, "offset": rec["offset"], "length": 65536}
            clean = h0.run(f"kvstore get /dev/dax0.0 --key p0 --size 64K --poison-serial {serial}")
            assert clean.status == 0 and '"match":1' in clean.output
            verify = h0.run(f"kvstore verify /dev/dax0.0 --poison-serial {serial}")
            assert verify.status == 1
            assert (f"kvstore: bad block: host 0 slot {slot} key {kv.key_digest('p1').hex()} offset {rec['offset']} "
                    "length 65536: poisoned (the device's poison list)") in verify.output


GUEST_PY = r'''
import hashlib, json, time, pfcxl_kvstore as kv
with kv.Store.open("/dev/dax0.0", host=1) as s:
    got = s.get("from-host")
    ok = all([s.put("g0", b"G" * 4096), s.put("g1", b"H" * 4096)])
    blocks, size, payload = 8, 64 << 10, bytes(range(256)) * 256
    t0 = time.perf_counter(); stored = sum(s.put(f"bench{i}", payload) for i in range(blocks))
    t1 = time.perf_counter(); loaded = sum(s.get(f"bench{i}") == payload for i in range(blocks))
    t2 = time.perf_counter()
    for i in range(blocks):
        s.remove(f"bench{i}")
    print("KV " + json.dumps({"sha": got and hashlib.sha256(got).hexdigest(), "set": ok,
          "exists": sum(s.exists(k) for k in ("g0", "g1", "none")), "stored": stored, "loaded": loaded,
          "store_s": t1 - t0, "load_s": t2 - t1, "bytes": blocks * size}))
'''


def test_the_python_binding_in_the_debian_guest_shares_the_store_with_the_host(tmp_path, capsys):
    with pfcxl.Appliance("pf-appliance", run_dir=tmp_path / "appliance") as app:
        pool = rundir.shm_dir(app.run_dir) / "shared.pool"
        assert kv_cli(capsys, "format", "--pool", str(pool), "--hosts", "16", "--slots", "64")[0] == 0
        block = os.urandom(100_000)
        with kv.Store.open(str(pool), host=0) as s:
            assert s.put("from-host", block)
        with app.machine(host=1, image="debian", ready_timeout=1200) as guest:
            done = guest.run(["python3", "-c", GUEST_PY], timeout=1200)
            assert done.status == 0, done.output[-3000:]
            got = json_lines(done.output, "KV ", tagged=True)[0]
            bench = json.loads(guest.check("kvstore bench /dev/dax0.0 --host 1 --blocks 8 --size 64K"))
        print(f"\nguest python, CXL path: store {got['bytes'] / got['store_s'] / 1e6:.2f} MB/s, "
              f"load {got['bytes'] / got['load_s'] / 1e6:.2f} MB/s; guest C: store "
              f"{8 * 65536 / bench['store_ns'] * 1e3:.2f} MB/s, load {8 * 65536 / bench['load_ns'] * 1e3:.2f} MB/s",
              file=sys.stderr)
        assert got["sha"] == hashlib.sha256(block).hexdigest()           # bit-exact, host to guest
        assert got["set"] and got["exists"] == 2 and got["stored"] == got["loaded"] == 8
        assert bench["stored"] == bench["loaded"] == 8
        with kv.Store.open(str(pool)) as s:                              # and guest to host
            assert s.get("g0") == b"G" * 4096 and s.get("g1") == b"H" * 4096
            assert s.verify() == {"good": 3, "bad": [], "claims": 0}
