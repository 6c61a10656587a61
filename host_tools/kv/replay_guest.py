"""`pfcxl kv replay --on guests`: the replay's hosts are `kvreplay` processes (guest/src/kvreplay.c,
the store's C core), one per guest of a pf-appliance booted by host_tools/fleet/multihost.py, each fed
its requests through its mailbox in the pool (host_tools/kv/replay_mailbox.py). The routing, the
batches and the report are kv_replay's, as with --on host: only the hosts differ.

The same kvreplay processes can run on this machine against a pool file (`c_on_host`): the C
store's replay, checked against the Python hosts' without booting anything.

With --fabric the appliance models every host's traffic; after each mode its telemetry is read
(host_tools/kv/replay_timing.py turns it into per-host figures and TTFTs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from pathlib import Path
from typing import Callable

from pfcxl import process
from pfcxl.device.appliance import rundir as appliance_rundir
from pfcxl.device.topology import data_path as paths
from pfcxl.errors import PfcxlError
from pfcxl.serving.traces import Request

from pfcxl.host_tools.kv import replay as kv_replay
from pfcxl.host_tools.kv.replay_host import kv
from pfcxl.host_tools.kv.replay_mailbox import MB_BYTES, Mailboxes, check_requests, offset
from pfcxl.host_tools.kv.replay_timing import figures, snapshot

TOOL = "kvreplay"
HELLO_S = 900               # the guests' boots come first
RUN_S = 24 * 3600           # a guest's kvreplay lasts the whole replay; the host side ends it (Q)


def room(hosts: int) -> int:
    """Pool bytes the mailboxes take after the store (at most a page of alignment first)."""
    return hosts * MB_BYTES + kv.PAGE


def command(dev: str, host: int | str, size: int, at: int) -> str:
    return f"{TOOL} {dev} --host {host} --size {size} --mailbox {at}"


def replay(setup: kv_replay.ReplaySetup, requests: list[Request], modes, launch, after_mode=lambda mode: None,
           hello_s: float = HELLO_S) -> list[dict]:
    """Each mode on a fresh store, served by the kvreplay processes `launch(mailbox offset)`
    starts (a context manager yielding a `gone()` that says why they ended, None while they run).
    `after_mode(mode)` is called as each mode ends; what it returns goes in the mode's result."""
    requests = kv_replay.served(setup, requests)
    check_requests(requests)
    need = kv_replay.check(setup, requests, room(setup.hosts))
    at = (kv.HOME if setup.base is None else setup.base) + offset(need)
    boxes = Mailboxes(setup.path, at, setup.hosts, len(requests), lambda: None)
    out = []
    try:
        with launch(offset(need)) as gone:
            boxes.gone = gone
            try:
                boxes.hello(hello_s)
                for mode in modes:
                    kv_replay.fresh_store(setup, requests, room(setup.hosts))
                    boxes.reset()
                    boxes.open(mode == "local", setup.stale_s)
                    with kv.Store.open(setup.path, base=setup.base) as reader:
                        result = kv_replay.drive(setup, requests, mode, reader, boxes)
                    boxes.close_store()
                    result["lookups"] = [boxes.stats[h] for h in range(setup.hosts)]
                    result["timing"] = after_mode(mode)
                    out.append(result)
                boxes.quit()
            except BaseException:
                boxes.abandon()
                raise
    finally:
        boxes.close()
    return out


@contextlib.contextmanager
def c_on_host(setup: kv_replay.ReplaySetup, tool: Path, mailbox: int):
    """kvreplay processes on this machine, on the pool file."""
    base = kv.HOME if setup.base is None else setup.base
    procs = [process.start([str(tool), setup.path, "--host", str(h), "--size", str(setup.block_bytes),
                            "--mailbox", str(mailbox), "--base", str(base)],
                           stdout=process.PIPE, stderr=process.PIPE) for h in range(setup.hosts)]

    def gone() -> str | None:
        ended = [(h, p) for h, p in enumerate(procs) if p.poll() is not None]
        return "; ".join(f"host {h} exit {p.returncode}: {p.stderr.read().decode().strip() if p.stderr else ''}"
                         for h, p in ended) or None
    try:
        yield gone
    finally:
        for p in procs:
            try:
                p.wait(timeout=30)
            except process.TimeoutExpired:
                p.kill()
                p.wait()
            for pipe in (p.stdout, p.stderr):
                if pipe is not None:
                    pipe.close()


def device(path: str) -> str:
    """The guest's device of the pool on data path `path`: the CXL region's /dev/dax0.0, or the
    first direct (NVDIMM, under ACPI0012) DAX device, which is the pool's (the topology's first device)."""
    if path != "direct":
        return "/dev/dax0.0"
    return "$(for d in /sys/bus/dax/devices/*; do case $(readlink -f $d) in */ACPI0012:*) echo /dev/${d##*/}; break;; esac; done)"


@contextlib.contextmanager
def on_guests(topo, topo_path, where: Path, setup: kv_replay.ReplaySetup, mailbox: int, data_path: str, *,
              fabric: str | None, say: Callable[[str], None], options):
    """One guest per host on the appliance running in `where`, each running kvreplay on the pool."""
    from pfcxl.host_tools.fleet import multihost      # QEMU and the Machine: for this command alone
    done: dict = {}
    ended: list = []                    # hosts whose boot failed, or whose kvreplay ended
    cmd = command(device(data_path), "{host}", setup.block_bytes, mailbox)

    def body() -> None:
        try:
            done["hosts"] = multihost.run(topo, topo_path, setup.hosts, cmd, appliance_dir=where, say=say,
                                          fabric=fabric, options=options, command_timeout=RUN_S,
                                          host_done=ended.append)
        except BaseException as exc:            # noqa: BLE001 (reported by gone())
            done["error"] = exc

    thread = threading.Thread(target=body, name="kv-replay-guests", daemon=True)
    thread.start()

    def gone() -> str | None:
        """Why the guests' side ended, or a host of it did (a failed boot leaves the others waiting)."""
        if "error" in done:
            return str(done["error"])
        if ended or not thread.is_alive():
            rs = done.get("hosts") or list(ended)
            return "; ".join(f"host {r.host}: {r.error or f'exit {r.status}'} {r.output.strip()[-300:]}".strip()
                             for r in rs).replace("\n", " ") or "no host ran"
        return None
    try:
        yield gone
    finally:
        thread.join()
    if "error" in done:
        raise done["error"]
    failed = [r for r in done["hosts"] if r.error or r.status]
    if failed:
        raise PfcxlError(f"replay guest(s) failed: {gone()}")


def ensure_store(path: str, hosts: int, base: int | None) -> None:
    """A pool without a store gets one for `hosts` hosts (the replay formats it anew per mode)."""
    try:
        kv.Store.open(path, base=base).close()
    except kv.KVError:
        kv.format(path, hosts=hosts, slots=1, chunk_tokens=512, base=base)


def run_on_guests(topo, topo_path, setup: kv_replay.ReplaySetup, requests: list[Request], modes, *, data_path: str | None,
                  fabric: str | None, say: Callable[[str], None], appliance_dir: Path | None = None,
                  options=None) -> list[dict]:
    """The replay in `setup.hosts` guests of the topology's appliance (the running one, else a
    temporary one; with `fabric` it models their traffic on that fabric system): setup.path is ignored, the pool is the
    appliance's shared pool. `options`: the guests' BootOptions (e.g. clock="virtual": each guest
    reads its block loads in its own virtual clock)."""
    from pfcxl.host_tools.fleet import multihost      # QEMU and the Machine: for this command alone
    if setup.kill_host is not None:
        raise PfcxlError("--kill-host is for --on host: a guest's replay process is not killed from here")
    if setup.base not in (None, kv.HOME):
        raise PfcxlError(f"--base {setup.base}: in guests the store is where they find it (byte {kv.HOME} of the pool)")
    kv_replay.check_inputs(setup, requests)             # before anything boots
    check_requests(kv_replay.served(setup, requests))
    topo = paths.with_data_path(topo, data_path)
    data_path = topo.guest.data_path
    with multihost.appliance_for(topo, topo_path, appliance_dir, say, fabric) as (where, _):
        pool = appliance_rundir.pool_dir(where, topo.appliance.backing)
        if pool is None:
            raise PfcxlError(f"appliance '{topo.name}' keeps its pool in memfds: the replay cannot reach it")
        setup = dataclasses.replace(setup, path=str(pool / "shared.pool"), base=None)
        ensure_store(setup.path, setup.hosts, None)
        last = [snapshot(where)] if fabric else None

        def after_mode(mode: str):
            if not fabric or last is None:       # last: kept when the appliance models traffic
                return None
            now = snapshot(where)
            out = figures(last[0], now, fabric, setup.hosts)
            last[0] = now
            return out
        return replay(setup, requests, modes,
                      lambda at: on_guests(topo, topo_path, where, setup, at, data_path, fabric=fabric, say=say,
                                           options=options), after_mode)
