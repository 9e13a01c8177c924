"""A set of integers kept as sorted, disjoint, half-open ranges.

Used for received byte ranges of a message, acknowledged sequence numbers and
completed message ids. Adds are almost always at or near the end, so the common case
is a constant-time merge with the last range.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator


class RangeSet:
    __slots__ = ("_ends", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def add(self, start: int, end: int) -> int:
        """Add [start, end); return how many integers were new."""
        if end <= start:
            return 0
        starts, ends = self._starts, self._ends
        if not starts or start > ends[-1]:
            starts.append(start)
            ends.append(end)
            return end - start
        last_end = ends[-1]
        if start >= starts[-1]:  # at the last range: inside it, or growing it
            if end <= last_end:
                return 0
            ends[-1] = end
            return end - last_end
        # general case: find every range touching [start, end) and merge them
        lo = bisect.bisect_left(ends, start)
        hi = bisect.bisect_right(starts, end)
        if lo == hi:
            starts.insert(lo, start)
            ends.insert(lo, end)
            return end - start
        covered = sum(max(0, min(ends[i], end) - max(starts[i], start)) for i in range(lo, hi))
        new_start = min(start, starts[lo])
        new_end = max(end, ends[hi - 1])
        starts[lo:hi] = [new_start]
        ends[lo:hi] = [new_end]
        return (end - start) - covered

    def remove(self, start: int, end: int) -> None:
        """Take [start, end) out of the set (rare: a repair request)."""
        if end <= start:
            return
        kept = [
            part
            for s, e in zip(self._starts, self._ends, strict=True)
            for part in ((s, min(e, start)), (max(s, end), e))
            if part[0] < part[1]
        ]
        self._starts = [s for s, _ in kept]
        self._ends = [e for _, e in kept]

    def __contains__(self, value: int) -> bool:
        i = bisect.bisect_right(self._starts, value) - 1
        return i >= 0 and value < self._ends[i]

    def covers(self, start: int, end: int) -> bool:
        """True if every integer of [start, end) is in the set."""
        if end <= start:
            return True
        starts, ends = self._starts, self._ends
        if not starts or start < starts[0]:
            return False
        # the usual questions, with no search: about the last range (in-order data), or
        # the first (is the message whole: [0, n))
        if start >= starts[-1]:
            return ends[-1] >= end
        if start < ends[0]:
            return ends[0] >= end
        i = bisect.bisect_right(starts, start) - 1
        return ends[i] >= end

    def covered_bytes(self, start: int, end: int) -> int:
        """How many integers of [start, end) are in the set."""
        if end <= start:
            return 0
        starts, ends = self._starts, self._ends
        i = bisect.bisect_right(ends, start)  # first range ending after ``start``
        count = 0
        while i < len(starts) and starts[i] < end:
            count += min(ends[i], end) - max(starts[i], start)
            i += 1
        return count

    def first_gap(self, start: int, end: int) -> tuple[int, int] | None:
        """The first sub-range of [start, end) not in the set, if any."""
        pos = start
        i = max(0, bisect.bisect_right(self._starts, start) - 1)
        while pos < end:
            if i < len(self._starts) and self._starts[i] <= pos:
                pos = max(pos, self._ends[i])
                i += 1
                continue
            gap_end = end if i >= len(self._starts) else min(end, self._starts[i])
            return (pos, gap_end)
        return None

    def gaps(self, start: int, end: int, limit: int) -> list[tuple[int, int]]:
        """The first ``limit`` sub-ranges of [start, end) not in the set, ascending."""
        found: list[tuple[int, int]] = []
        pos = start
        while len(found) < limit:
            gap = self.first_gap(pos, end)
            if gap is None:
                break
            found.append(gap)
            pos = gap[1]
        return found

    def prefix_end(self) -> int:
        """End of the range starting at 0 (0 if 0 is not in the set). O(1)."""
        return self._ends[0] if self._starts and self._starts[0] == 0 else 0

    def trim_below(self, value: int) -> None:
        """Forget everything below ``value`` (keeps state bounded)."""
        starts, ends = self._starts, self._ends
        i = bisect.bisect_right(ends, value)
        del starts[:i]
        del ends[:i]
        if starts and starts[0] < value:
            starts[0] = value

    def ranges(self) -> Iterator[tuple[int, int]]:
        return zip(self._starts, self._ends, strict=True)

    def __len__(self) -> int:
        """Number of disjoint ranges (not of integers)."""
        return len(self._starts)

    def total(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends, strict=True))

    def clear(self) -> None:
        self._starts.clear()
        self._ends.clear()

    def __repr__(self) -> str:
        return f"RangeSet({list(self.ranges())})"
