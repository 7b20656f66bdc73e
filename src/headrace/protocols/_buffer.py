"""ReceiveBuffer: the byte accumulator every sans-I/O connection parses from.

Bytes arrive in arbitrary chunks; a parser needs whole frames. The buffer
keeps what has been received and not yet consumed, and lets a parser try to
take a frame and give the bytes back if the frame is incomplete
(``commit``/``rollback``, after wsproto's ``Buffer``). It also enforces the
connection's buffered-bytes limit, so a peer cannot make us hold unbounded
memory by never finishing a frame.

Copies. A large append reaches the store through this buffer, so it copies
as little as it can: ``consume_exactly`` copies once (a slice of a
``memoryview``, not a ``bytearray`` slice copied again), and ``consume_frame``,
the last take of a frame, hands a large frame's bytes over without copying
them at all (the buffer gives its whole ``bytearray`` away and keeps only the
bytes that follow the frame). ``adopt`` takes a caller's ``bytearray`` as the
buffer itself, so a frame received straight into one is not copied either.
"""

from __future__ import annotations

import sys
from typing import Final

from headrace.errors import FrameTooLarge

__all__ = ["HANDOVER_MIN_BYTES", "FramePool", "ReceiveBuffer"]

HANDOVER_MIN_BYTES = 64 * 1024
"""Frames at least this large are handed over by ``consume_frame`` without a copy
(the bytes after the frame are copied instead, so only when they are fewer);
smaller ones are copied, which costs less than a fresh buffer per frame."""


_POOL_ONLY_REFS: Final = 2
"""``sys.getrefcount`` of a pooled buffer that nothing but the pool refers to:
the pool's list and the call's own argument. Every view of the buffer (its
managed buffer holds the ``bytearray``) and every other holder adds one."""


class FramePool:
    """Buffers for large frames received whole into a buffer of their own.

    A frame received straight into a ``bytearray`` of its size is decoded in
    place, and its large fields leave as views of that buffer (to a reader's
    caller, or to the store). Once nothing refers to a buffer any more, the
    next frame of the same size reuses it: a fresh one would cost an
    allocation and a page fault per 4 KiB on the first write. A buffer still
    referred to is never handed out again, so no view ever sees its bytes
    change.

    Args:
        max_buffers: buffers kept for reuse; a new buffer beyond them replaces
            a free one of another size, or is not kept.
        max_bytes: the most bytes the kept buffers may add up to (they live
            as long as their connection); a buffer that would go over it is
            handed out but not kept.
    """

    __slots__ = ("_buffers", "_max_buffers", "_max_bytes", "allocated", "reused")

    def __init__(self, max_buffers: int, max_bytes: int) -> None:
        self._buffers: list[bytearray] = []
        self._max_buffers = max_buffers
        self._max_bytes = max_bytes
        self.allocated = 0
        """Buffers allocated (the others were reused)."""
        self.reused = 0

    def get(self, size: int) -> bytearray:
        """A buffer of exactly ``size`` bytes that nothing else refers to."""
        buffer = self.take(size)
        if buffer is None:
            buffer = bytearray(size)
            self.keep(buffer)
        return buffer

    def take(self, size: int) -> bytearray | None:
        """A kept buffer of exactly ``size`` bytes that nothing else refers to, or None.

        Counted as reused when found; a caller that then builds a buffer of
        its own offers it with ``keep`` once it has its final size.
        """
        buffers = self._buffers
        for i in range(len(buffers)):
            if len(buffers[i]) == size and sys.getrefcount(buffers[i]) <= _POOL_ONLY_REFS:
                self.reused += 1
                return buffers[i]
        return None

    def keep(self, buffer: bytearray) -> None:
        """Offer ``buffer`` (new, at its final size) for reuse; counted as allocated.

        It is kept if there is room under ``max_buffers`` and ``max_bytes``,
        or in place of a free one of another size; else it is not kept.
        """
        self.allocated += 1
        buffers = self._buffers
        size = len(buffer)
        spare = -1
        for i in range(len(buffers)):
            if buffers[i] is buffer:
                return
            if sys.getrefcount(buffers[i]) <= _POOL_ONLY_REFS:
                spare = i
        kept = sum(len(b) for b in buffers)
        if len(buffers) < self._max_buffers and kept + size <= self._max_bytes:
            buffers.append(buffer)
        elif spare >= 0 and kept - len(buffers[spare]) + size <= self._max_bytes:
            buffers[spare] = buffer


class ReceiveBuffer:
    """Received bytes with a read cursor that can be rolled back.

    Args:
        max_buffered_bytes: the most unconsumed bytes the buffer may hold;
            ``feed`` raises ``FrameTooLarge`` beyond it.
    """

    __slots__ = ("_data", "_max_buffered_bytes", "_position")

    def __init__(self, max_buffered_bytes: int) -> None:
        self._data = bytearray()
        self._position = 0  # read cursor into _data, not yet committed
        self._max_buffered_bytes = max_buffered_bytes

    def __len__(self) -> int:
        """Bytes available after the read cursor."""
        return len(self._data) - self._position

    def __bool__(self) -> bool:
        return len(self) > 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes.

        Raises:
            FrameTooLarge: the unconsumed bytes would exceed the limit.
        """
        size = len(self._data) + len(data)
        if size > self._max_buffered_bytes:
            raise FrameTooLarge(self._max_buffered_bytes, size)
        self._data += data

    def adopt(self, data: bytearray) -> None:
        """Append received bytes that the caller gives away and never touches again.

        With nothing buffered, ``data`` becomes the buffer itself (no copy):
        a client that received a large frame straight into a ``bytearray`` of
        its own hands it over whole, and ``consume_frame`` then hands it on as a
        view, so the frame's bytes are never copied after the socket. Otherwise
        it is appended like ``feed``.

        Raises:
            FrameTooLarge: the unconsumed bytes would exceed the limit.
        """
        if self._data:
            self.feed(data)
            return
        if len(data) > self._max_buffered_bytes:
            raise FrameTooLarge(self._max_buffered_bytes, len(data))
        self._data = data
        self._position = 0

    def peek(self, count: int) -> bytes | None:
        """The next ``count`` bytes without consuming them, or None if fewer are here."""
        if len(self) < count:
            return None
        return bytes(memoryview(self._data)[self._position : self._position + count])

    def consume_exactly(self, count: int) -> bytes | None:
        """Take exactly ``count`` bytes, or None (taking nothing) if fewer are here."""
        if len(self) < count:
            return None
        start = self._position
        self._position += count
        return bytes(memoryview(self._data)[start : self._position])

    def consume_frame(self, count: int) -> bytes | memoryview | None:
        """Take exactly ``count`` bytes as the end of a frame, and commit.

        Returns None (taking nothing, committing nothing) if fewer are here.
        A frame of ``HANDOVER_MIN_BYTES`` or more comes back as a read-only
        ``memoryview`` of bytes this buffer never touches again, without a
        copy; a smaller one as ``bytes``.
        """
        if len(self) < count:
            return None
        start = self._position
        end = start + count
        after = len(self._data) - end
        if count >= HANDOVER_MIN_BYTES and after <= count:
            data = self._data
            self._data = bytearray(memoryview(data)[end:])  # the next frame's first bytes
            self._position = 0
            return memoryview(data).toreadonly()[start:end]
        frame = bytes(memoryview(self._data)[start:end])
        self._position = end
        self.commit()
        return frame

    def consume_at_most(self, count: int) -> bytes:
        """Take up to ``count`` bytes (possibly none)."""
        start = self._position
        self._position = min(len(self._data), start + count)
        return bytes(memoryview(self._data)[start : self._position])

    def move_to(self, target: bytearray) -> int:
        """Copy the unconsumed bytes to the front of ``target`` and forget them; how many.

        A partial large frame moves to a buffer of the frame's size this way,
        and its remaining bytes are received straight into that buffer.
        """
        count = len(self)
        target[:count] = memoryview(self._data)[self._position :]
        self._data = bytearray()
        self._position = 0
        return count

    def commit(self) -> None:
        """Forget the consumed bytes: the parser has turned them into an event.

        When everything was consumed the buffer is replaced, not resized: an
        adopted buffer (a frame received straight into it) may still be
        exported to the receiving transport, and resizing one raises.
        """
        if self._position:
            if self._position == len(self._data):
                self._data = bytearray()
            else:
                del self._data[: self._position]
            self._position = 0

    def rollback(self) -> None:
        """Give back everything consumed since the last commit (the frame was incomplete)."""
        self._position = 0
