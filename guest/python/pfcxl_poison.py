"""The poison list of a CXL memdev, as the guest's `cxl list -M -L` reports it (ndctl 81; tracefs
must be mounted at /sys/kernel/tracing). QEMU's poison leaves the bytes as they were, so a reader
must ask the device: pfcxl_kvstore.Store(poisoned=...) treats blocks on these ranges as misses."""

from __future__ import annotations

import json
import subprocess


def media_errors(serial: int) -> list[tuple[int, int]]:
    """(device offset, length) of every media error of the memdev with this serial."""
    done = subprocess.run(["cxl", "list", "-M", "-L"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"cxl list -M -L failed ({done.stderr.strip()}); is tracefs mounted?")
    listing = json.loads(done.stdout or "[]")
    for memdev in listing if isinstance(listing, list) else [listing]:
        if memdev.get("serial") == serial:
            return [(e["offset"], e["length"]) for e in memdev.get("media_errors", [])]
    raise OSError(f"no memdev with serial {serial} in cxl list")
