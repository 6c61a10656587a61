"""The appliance's run directory: who owns it, where its pool lives, and what a crashed service
leaves there for the next one.

One service per directory: it holds an exclusive flock on `appliance.lock` for its whole life,
taken before it writes anything. A second service learns the holder's pid and leaves without
touching the first one's socket or pid file. The kernel drops the lock when its holder dies, so
whoever gets the lock may clear a crashed run's pid file and socket: nobody else can be using them.

With `backing = "shm"` the pool lives in files on tmpfs, under a name derived from the run
directory, so a service restarted after a crash finds the same memory. A clean stop discards it.
Attachment records (`attachments.json`) also survive a crash: the next incarnation reads them to
find hosts that still map memory an earlier incarnation handed out.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

from pfcxl.errors import ApplianceError

LOCK, SOCKET, PID, LOG = "appliance.lock", "appliance.sock", "appliance.pid", "appliance.log"
SLOTS, ATTACHMENTS = "slots.json", "attachments.json"
SHM_ROOT = Path("/dev/shm")


def take(run_dir: Path) -> int:
    """Lock `run_dir` for this process (the descriptor holds the lock until the process exits)."""
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise ApplianceError(f"{run_dir} is in use by the appliance pid {holder(run_dir)} (it holds "
                             f"{run_dir / LOCK}): one appliance per run directory") from exc
    return fd


def holder(run_dir: Path) -> int | None:
    """The pid holding `run_dir`'s lock, None if nobody does. Read from /proc/locks: probing with
    flock would itself hold the lock for a moment and could turn away a service starting then."""
    try:
        st = os.stat(run_dir / LOCK)
    except FileNotFoundError:
        return None
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            # "1: FLOCK  ADVISORY  WRITE <pid> <maj:min:inode> 0 EOF"; "1: -> FLOCK ..." is a waiter
            if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key:
                return int(fields[4])
    return None


def shm_dir(run_dir: Path) -> Path:
    """Where an shm-backed pool of `run_dir` lives: one name per run directory."""
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
    return SHM_ROOT / f"pfcxl-pool-{digest}"


def pool_dir(run_dir: Path, backing: str) -> Path | None:
    return {"directory": run_dir / "pool", "shm": shm_dir(run_dir)}.get(backing)


def process_start(pid: int) -> int | None:
    """The start time of `pid` (clock ticks since boot), None if it is gone: a pid plus its start
    time names one process, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def still_running(record: dict) -> bool:
    start = process_start(record["pid"])
    return start is not None and start == record["start"]


def read_attachments(run_dir: Path) -> dict:
    path = run_dir / ATTACHMENTS
    try:
        data = json.loads(path.read_text())
        return {"incarnation": str(data["incarnation"]), "pool_id": str(data["pool_id"]),
                "hosts": {int(h): dict(r) for h, r in data["hosts"].items()}}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ApplianceError(f"{path} is unreadable ({exc}): move it away") from exc


def write_json(path: Path, data: object) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data) + "\n")
    os.replace(tmp, path)


def discard_pool(run_dir: Path) -> bool:
    """Forget a volatile (shm) pool and what describes it; True if there was one."""
    pool = shm_dir(run_dir)
    if not pool.exists():
        return False
    shutil.rmtree(pool, ignore_errors=True)
    for name in (SLOTS, ATTACHMENTS):
        (run_dir / name).unlink(missing_ok=True)
    return True


def clear_leftovers(run_dir: Path) -> list[str]:
    """Remove a dead run's pid file and socket (call with the lock held); what was removed."""
    removed = []
    for name in (PID, SOCKET):
        try:
            (run_dir / name).unlink()
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed
