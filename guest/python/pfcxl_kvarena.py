"""Free space of one host's arena, kept by its only writer (pfcxl_kvstore.Store): a list of free
gaps, first fit, adjacent gaps merged when nothing fits. Standard library only.

Extents are line aligned: a block of n bytes at offset o takes [o, up(o + n, LINE)). Puts cost
O(gaps), which stays small when blocks are of a few sizes (an evicted block's gap is what the next
one of its size takes); the old way (sort every live record per put) cost O(blocks log blocks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# pfcxl.guest.python on the host, top-level modules in the guest (see __init__.py)
if TYPE_CHECKING or __package__:
    from .pfcxl_kvlayout import LINE, up
else:
    from pfcxl_kvlayout import LINE, up


class Arena:
    def __init__(self, lo: int, hi: int, used) -> None:
        """`used`: the (offset, length) of every live block in [lo, hi)."""
        self.lo, self.hi = lo, hi
        self.gaps: list[tuple[int, int]] = []
        at = lo
        for off, length in sorted(used):
            if off > at:
                self.gaps.append((at, off))
            at = max(at, up(off + length, LINE))
        if at < hi:
            self.gaps.append((at, hi))
        self.merged = True

    def take(self, length: int) -> int | None:
        """A line-aligned offset with `length` free bytes from it, now used; None if no gap fits."""
        need = up(length, LINE)
        if need == 0:
            return self.lo                      # an empty block takes no room
        while True:
            for i, (a, b) in enumerate(self.gaps):
                if b - a >= need:
                    if b - a == need:
                        del self.gaps[i]
                    else:
                        self.gaps[i] = (a + need, b)
                    return a
            if self.merged:
                return None
            self._merge()

    def give(self, off: int, length: int) -> None:
        """The extent of a block that is gone (withdrawn or evicted) is free again."""
        end = up(off + length, LINE)
        if end > off:
            self.gaps.append((off, end))
            self.merged = False

    def _merge(self) -> None:
        out: list[tuple[int, int]] = []
        for a, b in sorted(self.gaps):
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
        self.gaps, self.merged = out, True
