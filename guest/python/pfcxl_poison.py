"""The poison list of a CXL memdev, as the guest's `cxl list -M -L` reports it (ndctl 81; tracefs
must be mounted at /sys/kernel/tracing). QEMU's poison leaves the bytes as they were, so a reader
must ask the device: pfcxl_kvstore.Store(poisoned=...) treats blocks on these ranges as misses."""

from __future__ import annotations

import json
import subprocess


def media_errors(serial: int, timeout_s: float = 60.0) -> list[tuple[int, int]]:
    """(device offset, length) of every media error of the memdev with this serial. The listing
    goes through the device's mailbox and the kernel's trace buffer: a device that does not answer
    within timeout_s is an OSError, not a wait for ever."""
    try:
        done = subprocess.run(["cxl", "list", "-M", "-L"], capture_output=True, text=True, check=False,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise OSError(f"cxl list -M -L did not answer within {timeout_s:g} s (the device's poison list is "
                      "unknown)") from None
    if done.returncode != 0:
        raise OSError(f"cxl list -M -L failed ({done.stderr.strip()}); is tracefs mounted?")
    listing = json.loads(done.stdout or "[]")
    for memdev in listing if isinstance(listing, list) else [listing]:
        if memdev.get("serial") == serial:
            return [(e["offset"], e["length"]) for e in memdev.get("media_errors", [])]
    raise OSError(f"no memdev with serial {serial} in cxl list")
