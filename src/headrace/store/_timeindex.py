"""A segment's append-time index: sparse, bounded, shared by both stores.

Each entry ``(offset, time_ms)`` says that the append starting at ``offset``
was made at ``time_ms`` (ms since the epoch). Times never go back: an append
whose clock reads earlier than the last entry gets the last entry's time, so
entries are ordered by offset and by time alike and one bisection answers
"the first append at or after T".

An entry is added only when an append's time is at least ``step_ms`` past the
last entry's (``step_ms`` starts at 1: one entry per millisecond in which the
segment was appended to). At ``MAX_TIME_INDEX_ENTRIES`` every other entry is
dropped (the first is kept) and ``step_ms`` doubles, so the index stays
bounded and evenly spread over the segment's life whatever its size. An
event's append time is the time of the last entry at or below its offset:
exact to the millisecond while the segment has had fewer than
``MAX_TIME_INDEX_ENTRIES`` distinct milliseconds of appends, and exact to
``step_ms`` after that. Lookups by time agree with those times exactly.

Only stream segments keep one (table segments are read by key, never by time).
The disk store keeps the index in its snapshot and rebuilds the entries
since the snapshot from the WAL's APPEND records (which carry the append's
time), through the same ``note`` calls, so a restarted store has the same
index (``docs/storage-format.md#time-index``).
"""

from __future__ import annotations

import bisect
from array import array
from typing import Final

__all__ = ["MAX_TIME_INDEX_ENTRIES", "TimeIndex"]

MAX_TIME_INDEX_ENTRIES: Final = 1024
"""Entries one segment's index keeps (16 bytes each: 16 KiB of snapshot and of
memory at most per segment). Past it every other entry is dropped and the
spacing doubles; 1024 keeps a day of appends to the ~100 ms, a year to the hour."""


class TimeIndex:
    """The append-time index of one segment (see the module docstring)."""

    __slots__ = ("offsets", "step_ms", "times")

    def __init__(self, entries: list[tuple[int, int]] | None = None, step_ms: int = 1) -> None:
        self.offsets: array[int] = array("q")
        self.times: array[int] = array("q")
        self.step_ms = max(1, step_ms)
        for offset, time_ms in entries or ():
            self.offsets.append(offset)
            self.times.append(time_ms)

    def __len__(self) -> int:
        return len(self.offsets)

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self.offsets, self.times, strict=True))

    def note(self, offset: int, time_ms: int) -> None:
        """Record an append of at least one byte starting at ``offset`` at ``time_ms``."""
        times = self.times
        if times:
            last = times[-1]
            if time_ms < last + self.step_ms:
                return
        self.offsets.append(offset)
        times.append(time_ms)
        if len(times) > MAX_TIME_INDEX_ENTRIES:
            del self.offsets[1::2]
            del self.times[1::2]
            self.step_ms *= 2

    def truncate(self, start_offset: int) -> None:
        """Forget entries no longer needed below ``start_offset`` (the one at or
        below it stays: it gives the time of the first remaining events)."""
        keep = bisect.bisect_right(self.offsets, start_offset) - 1
        if keep > 0:
            del self.offsets[:keep]
            del self.times[:keep]

    def time_at(self, offset: int) -> int | None:
        """Append time of the event at ``offset``; None if it came before the index."""
        i = bisect.bisect_right(self.offsets, offset) - 1
        return self.times[i] if i >= 0 else None

    def offset_at(self, time_ms: int) -> int | None:
        """Offset of the first append made at or after ``time_ms``; None if none was."""
        i = bisect.bisect_left(self.times, time_ms)
        return self.offsets[i] if i < len(self.offsets) else None

    def covering(self, offset: int, end: int) -> list[tuple[int, int]]:
        """The entries that give the times of the events in ``[offset, end)``:
        the last at or below ``offset`` and every one inside."""
        lo = max(0, bisect.bisect_right(self.offsets, offset) - 1)
        hi = bisect.bisect_left(self.offsets, end)
        return list(zip(self.offsets[lo:hi], self.times[lo:hi], strict=True))
