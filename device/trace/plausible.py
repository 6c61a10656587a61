"""Which trace records a TCG plugin can have written (device/trace/records.py), so that one client
writing its own ring cannot move the model's time for every host (docs/appliance-timing.md).

A record's `insn` is its vCPU's instruction count (the plugin's per-vCPU scoreboard, zero when
QEMU loads the plugin, which is after the appliance handed the host its ring). Two rules follow:

* the plugin emits each vCPU's records in the order of their accesses, so a vCPU's counts never
  go back;
* a count is at most what the vCPU can have executed since the ring was handed out, at
  MAX_INSN_PER_SECOND.

MAX_INSN_PER_SECOND: TCG runs guest code as translated host code, and the plugin adds one inline
counter increment to every guest instruction (a host add to memory, each depending on the one
before), so a vCPU thread retires at most about one guest instruction per host cycle. 10^10 is
a 10 GHz host clock at that rate, which no host core reaches: a real count never exceeds it, while a
record 2^40 instructions ahead of what the elapsed time allows (110 s at this rate) is refused.
"""

from __future__ import annotations

import numpy as np

MAX_INSN_PER_SECOND = 10 ** 10
SLACK_SECONDS = 1.0            # the clock readings around a drain, and a generous margin
_U64_MAX = (1 << 64) - 1


class Plausible:
    """The records of one attachment's ring: keeps each vCPU's last accepted count."""

    def __init__(self, attached_at: float) -> None:
        self.attached_at = attached_at
        self.last = np.zeros(256, np.uint64)     # per vCPU (the record's u8 vcpu field)
        self.rejected = 0

    def limit(self, drained_at: float) -> int:
        """The largest count a vCPU can have reached by `drained_at` (time.monotonic())."""
        seconds = max(drained_at - self.attached_at, 0.0) + SLACK_SECONDS
        return min(int(seconds * MAX_INSN_PER_SECOND), _U64_MAX)

    def check(self, records: np.ndarray, drained_at: float) -> np.ndarray:
        """The records the plugin can have written, in order; the others are counted in `rejected`."""
        if not len(records):
            return records
        insn, vcpu = records["insn"], records["vcpu"]
        ok = insn <= np.uint64(self.limit(drained_at))
        for v in np.unique(vcpu[ok]):
            mine = np.flatnonzero(ok & (vcpu == v))
            counts = insn[mine]
            # a record goes back when it is below the largest count before it (the vCPU's last
            # accepted one included); a refused record never raises that bar
            before = np.maximum.accumulate(np.concatenate(([self.last[v]], counts)))[:-1]
            back = counts < before
            ok[mine[back]] = False
            self.last[v] = max(self.last[v], counts.max())
        self.rejected += int(np.count_nonzero(~ok))
        return records if ok.all() else records[ok]
