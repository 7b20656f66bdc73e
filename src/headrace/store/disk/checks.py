"""Checking a segment's data blocks against their sidecar on their first read.

The bytes a segment held when the store opened were written by an earlier
process (or a disk may have changed them since): before any of them is
served, the checksum block it lies in is read back and checked against the
sidecar entry (``format.py``: one CRC-32 per block of at most
``SIDECAR_BLOCK_BYTES``), once per block and process. A block that fails is
never served: every read that touches it gets ``CorruptionError``, which the
front doors answer with their error reply; reads of other blocks go on.
Bytes appended since the open are not checked again (this process wrote
them and checksummed them as it did).

Cost: a segment that is never read costs one small object. The first read of
an old range runs in a worker thread (a cold disk does not stall the event
loop): one ``pread`` of its blocks, whole, and a CRC-32 of them (zlib-ng:
15-40 GB/s); the read is served from those bytes, so they are read once.
The sidecar's entries are loaded once (20 bytes per MiB). After that a read
below ``Segment.unchecked_end`` costs a bisection and a look at a byte per
block it spans; once every block is checked the segment drops its state and
reads compare one integer (``unchecked_end`` 0), as reads of data written
since the open always do. A zero-copy read (``read_region``) that needs a
check is answered with the bytes the check read (no second read of them for
``sendfile``); once its blocks are checked it gets its file region, so
``sendfile`` never sends an unchecked byte.
"""

from __future__ import annotations

import bisect
import os
from array import array
from dataclasses import dataclass

from headrace.store.disk.format import crc32, decode_sidecar
from headrace.store.disk.layout import ContainerPaths

__all__ = ["BAD", "GOOD", "UNCHECKED", "BlockChecks", "CheckResult", "check_blocks"]

UNCHECKED = 0
GOOD = 1
BAD = 2


@dataclass(slots=True)
class CheckResult:
    """What one worker-thread check found (applied on the event loop)."""

    loaded: tuple[array[int], array[int], array[int]] | None
    """The block offsets, sizes and CRCs, if this check loaded them."""
    checked: list[tuple[int, bool]]
    """(block index, good) of each block checked."""
    data: bytes | None = None
    """The bytes of the range asked for, read with the blocks."""
    missing: bool = False
    """The data file or the sidecar is gone (the segment was deleted meanwhile,
    or the file was removed behind the store's back)."""


_NONE: array[int] = array("I")
_NO_STATES = bytearray()
"""Placeholders of a ``BlockChecks`` not loaded yet; never changed (``apply``
replaces them when it loads the entries)."""


class BlockChecks:
    """Which of a segment's blocks from before the open were checked, and how they fared.

    Created at open for each segment with data (``end`` its length then,
    ``sidecar_bytes`` the sidecar size that covers it); the entries are
    loaded on the first read that needs them. Changed on the loop thread only.
    """

    __slots__ = ("crcs", "end", "offsets", "sidecar_bytes", "sizes", "states", "unchecked")

    def __init__(self, end: int, sidecar_bytes: int) -> None:
        self.end = end
        self.sidecar_bytes = sidecar_bytes
        self.offsets: array[int] | None = None
        # Shared empty ones until loaded (a segment never read costs nothing more).
        self.sizes: array[int] = _NONE
        self.crcs: array[int] = _NONE
        self.states = _NO_STATES
        self.unchecked = 0

    def span(self, offset: int, end: int) -> range:
        """Indices of the loaded blocks that overlap ``[offset, end)``."""
        assert self.offsets is not None
        first = max(bisect.bisect_right(self.offsets, offset) - 1, 0)
        return range(first, bisect.bisect_left(self.offsets, min(end, self.end)))

    def pending(self, offset: int, end: int) -> bool:
        """Whether a read of ``[offset, end)`` must wait for checks (or fail)."""
        if offset >= self.end:
            return False
        if self.offsets is None:
            return True
        states = self.states
        return any(states[i] != GOOD for i in self.span(offset, end))

    def bad(self, offset: int, end: int) -> int | None:
        """The first failed block overlapping ``[offset, end)``, if any."""
        if self.offsets is None or offset >= self.end:
            return None
        states = self.states
        return next((i for i in self.span(offset, end) if states[i] == BAD), None)

    def apply(self, result: CheckResult) -> None:
        if self.offsets is None and result.loaded is not None:
            self.offsets, self.sizes, self.crcs = result.loaded
            self.states = bytearray(len(self.offsets))
            self.unchecked = len(self.offsets)
        for index, good in result.checked:
            if self.states[index] == UNCHECKED:
                self.states[index] = GOOD if good else BAD
                self.unchecked -= 1

    def forget(self, index: int) -> None:
        """Take back a failed result (the block was freed by a truncation meanwhile)."""
        if self.states[index] == BAD:
            self.states[index] = UNCHECKED
            self.unchecked += 1

    def block(self, index: int) -> tuple[int, int]:
        """``(offset, end)`` of block ``index``."""
        assert self.offsets is not None
        return self.offsets[index], self.offsets[index] + self.sizes[index]


def check_blocks(
    paths: ContainerPaths, segment_id: int, checks: BlockChecks, offset: int, end: int
) -> CheckResult:
    """In a worker thread: load the entries if needed, then read back and check
    every unchecked block overlapping ``[offset, end)``. The read covers
    ``[offset, end)`` too, in the same ``pread``, and the result carries those
    bytes: a read that waited for the check is served from them, so its blocks
    are read once, not twice. Only reads; the result is applied on the loop
    (``BlockChecks.apply``).

    Raises:
        CorruptionError: the sidecar is damaged (open checked it; it changed since).
    """
    loaded = None
    if checks.offsets is None:
        sidecar = paths.sidecar(segment_id)
        try:
            with open(sidecar, "rb") as f:
                raw = f.read(checks.sidecar_bytes)
        except FileNotFoundError:
            return CheckResult(None, [], missing=True)
        entries = decode_sidecar(raw, segment_id, str(sidecar))
        entries = [e for e in entries if e.offset < checks.end]
        loaded = (
            array("Q", (e.offset for e in entries)),
            array("I", (e.size_bytes for e in entries)),
            array("I", (e.crc for e in entries)),
        )
        offsets, sizes, crcs = loaded
        states = bytearray(len(entries))
    else:
        offsets, sizes, crcs, states = checks.offsets, checks.sizes, checks.crcs, checks.states
    first = max(bisect.bisect_right(offsets, offset) - 1, 0)
    last = bisect.bisect_left(offsets, min(end, checks.end))
    todo = [i for i in range(first, last) if states[i] == UNCHECKED]
    if not todo:
        return CheckResult(loaded, [])
    low = min(offset, offsets[todo[0]])
    high = max(end, offsets[todo[-1]] + sizes[todo[-1]])
    try:
        fd = os.open(paths.data(segment_id), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return CheckResult(loaded, [], missing=True)
    try:
        raw = os.pread(fd, high - low, low)
    finally:
        os.close(fd)
    view = memoryview(raw)
    checked = []
    for i in todo:
        start = offsets[i] - low
        block = view[start : start + sizes[i]]
        checked.append((i, len(block) == sizes[i] and crc32(block) == crcs[i]))
    data = None
    if len(raw) >= end - low:
        data = raw if (low, high) == (offset, end) else bytes(view[offset - low : end - low])
    return CheckResult(loaded, checked, data=data)
