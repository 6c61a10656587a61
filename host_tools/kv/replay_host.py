"""One host of a KV replay (`pfcxl kv replay`, host_tools/kv/replay.py): a process that opens the
store as its host and serves the requests it is sent. For each request it looks the blocks up as a
prefix (stopping at the first miss), loads every hit and checks its bytes against the ones the
block's id defines, then stores every block from the first miss on.

A block's bytes are a pure function of its id (`payload`), so every reader can check every load.
In `local` mode a host looks in its own segment only (the store's `alone`): its arena is a private
cache, and it never reads another's block.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal

from pfcxl.guest.python import pfcxl_kvstore as kv


COUNTS = ("blocks", "hits", "own", "other", "stored", "present", "lost", "checked", "bad", "read", "written")
WIDTH = len(COUNTS) + 1             # a request's row in the results table: its counts, then "done"
PR_SET_PDEATHSIG = 1                # linux/prctl.h


def payload(block: int, size: int) -> bytes:
    """The bytes of block `block`: its 64-byte hash repeated to `size` bytes."""
    seed = hashlib.blake2b(b"pfcxl-replay/%d" % block, digest_size=64).digest()
    return (seed * (size // 64 + 1))[:size]


def block_key(block: int) -> bytes:
    """The store key of trace block `block`."""
    return b"replay/%d" % block


def serve(store, blocks: list[int], local: bool, size: int) -> dict:
    """One request on `store` (opened as its host): the counts of COUNTS. `lost`: a rendezvous
    another host won while we computed the block; `present`: a later block someone already stored;
    `checked`: loads compared with their id's bytes; `bad`: copies that failed the store's check or
    that comparison (never served: the lookup stops there, as at a miss)."""
    me = store.host
    c = dict.fromkeys(COUNTS, 0)
    c["blocks"] = len(blocks)
    for block in blocks:
        data, where, failed = store.load(block_key(block), local)
        c["bad"] += failed
        if data is not None:
            c["checked"] += 1
            if data != payload(block, size):
                c["bad"] += 1
                data = None
        if data is None:
            break
        c["hits"] += 1
        c["own" if where == me else "other"] += 1
        c["read"] += len(data)
    for block in blocks[c["hits"]:]:
        key = block_key(block)
        if store.exists(key, local):
            c["present"] += 1
        elif store.put(key, payload(block, size), local):
            c["stored"] += 1
            c["written"] += size
        else:
            c["lost"] += 1
    return c


def leave_with_parent(parent_pid: int, inherited) -> None:
    """This host process ends when the replay that forked it does, however that one ends: the
    kernel sends it SIGKILL when its parent dies (PR_SET_PDEATHSIG, Linux), and the other ends of
    the replay's pipes that the fork copied here are closed, so that a dead replay reads as EOF."""
    for conn in inherited:
        conn.close()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):        # not Linux: the EOF on the pipe ends it
        pass
    if os.getppid() != parent_pid:           # the parent died before the prctl took effect
        os._exit(1)


def main(conn, table, path: str, base: int, host: int, local: bool, size: int, stale_s: float,
         parent_pid: int, inherited=()) -> None:
    """The host process: lists of (request index, blocks) in, ("done", [their indices]) out once a
    list is served, in order. Each request's counts go to its row of `table` (shared memory, WIDTH
    numbers a row), its last number set to 1 after them: what a killed host finished is still
    there. `inherited`: the replay's ends of the pipes, copied here by the fork (leave_with_parent)."""
    leave_with_parent(parent_pid, inherited)
    try:
        store = kv.Store.open(path, host=host, base=base, stale_s=stale_s)
    except kv.KVError as exc:                   # e.g. another process holds this host's lease
        conn.send(("error", str(exc)))
        return
    with store:
        conn.send(("ready",))
        while True:
            try:
                batch = conn.recv()
            except EOFError:                    # the replay is gone
                return
            if batch is None:
                return
            for index, blocks in batch:
                c = serve(store, blocks, local, size)
                row = index * WIDTH
                table[row:row + len(COUNTS)] = [c[k] for k in COUNTS]
                table[row + WIDTH - 1] = 1
            conn.send(("done", [index for index, _ in batch]))
