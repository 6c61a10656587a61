"""Which trace records a plugin can have written (device/trace/plausible.py): generated streams
of several vCPUs with implausible records mixed in, checked against a record-by-record reading
of the two rules, across drains."""

from __future__ import annotations

import pytest
import numpy as np

from pfcxl.device.trace import records as tf
from pfcxl.device.trace.plausible import MAX_INSN_PER_SECOND, SLACK_SECONDS, Plausible

pytestmark = pytest.mark.unit


def stream(rng: np.random.Generator, n: int) -> np.ndarray:
    """n records of up to 4 vCPUs, each vCPU's counts rising, with about a fifth replaced by
    counts no plugin writes: far ahead (up to 2^64-1) or back."""
    r = np.zeros(n, np.dtype(tf.RECORD_FIELDS))
    r["vcpu"] = rng.integers(0, 4, n)
    for v in range(4):
        mine = r["vcpu"] == v
        r["insn"][mine] = np.cumsum(rng.integers(0, 50_000, int(mine.sum())))
    bad = rng.random(n) < 0.2
    ahead = rng.integers(1 << 40, (1 << 63) - 1, n, dtype=np.int64).astype(np.uint64) * np.uint64(2)
    back = (r["insn"] * rng.random(n)).astype(np.uint64)
    r["insn"] = np.where(bad, np.where(rng.random(n) < 0.5, ahead, back), r["insn"])
    return r


def reference(records: np.ndarray, last: dict, limit: int) -> list[bool]:
    keep = []
    for insn, vcpu in zip(records["insn"].tolist(), records["vcpu"].tolist()):
        ok = insn <= limit and insn >= last.get(vcpu, 0)
        if ok:
            last[vcpu] = insn
        keep.append(ok)
    return keep


def test_the_records_kept_are_exactly_those_both_rules_allow():
    rng = np.random.default_rng(21)
    for trial in range(40):
        p, last, rejected = Plausible(attached_at=100.0), {}, 0
        records = stream(rng, int(rng.integers(1, 400)))
        cuts = sorted(rng.integers(0, len(records), 3).tolist())
        for i, part in enumerate(np.split(records, cuts)):      # the same stream over several drains
            at = 100.0 + 0.05 * (i + 1)
            want = reference(part, last, p.limit(at))
            kept = p.check(part, at)
            assert np.array_equal(kept, part[np.array(want, bool)]), trial
            rejected += want.count(False)
            assert p.rejected == rejected


def test_the_bound_grows_with_the_time_since_attach():
    p = Plausible(attached_at=10.0)
    assert p.limit(10.0) == SLACK_SECONDS * MAX_INSN_PER_SECOND
    assert p.limit(70.0) == (60 + SLACK_SECONDS) * MAX_INSN_PER_SECOND
    assert p.limit(5.0) == p.limit(10.0)                        # a clock read before the attach
    r = np.zeros(2, np.dtype(tf.RECORD_FIELDS))
    r["insn"] = [0, 1 << 40]                                    # 2^40 after the previous, 1 s after attach
    assert len(p.check(r, 11.0)) == 1 and p.rejected == 1
    r["insn"] = [1 << 40, (1 << 40) + 5]                        # legitimate 2 minutes later
    assert len(p.check(r, 130.0)) == 2 and p.rejected == 1
