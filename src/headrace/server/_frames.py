"""LargeFrames: a handler's large frames received where they are decoded.

A frame of a few hundred KiB (a Pravega append block, a TANK produce with
large bundles) arrives over several receives. Fed through the listener's
shared buffer, each piece is copied into the codec's ``ReceiveBuffer``, which
grows (and moves) as it fills; profiles of 10 KiB events put those copies at
a fifth to a third of the server's CPU. So once a large frame's header has
arrived, its bytes so far move to a buffer of the frame's size and the loop
receives the rest straight into it (``ConnectionHandler.frame_buffer``). The
whole frame is then given to the codec, which adopts it and decodes in place:
its large fields leave as views of what the kernel wrote.

Buffers come from a ``FramePool``: one is reused once nothing refers to it
(the store releases its view when the append is written), so neither the
copy nor a fresh buffer's page faults remain.

A header is not a promise: a peer can announce a 16 MiB frame and send
nothing more. So nothing is allocated until more of the frame arrives (the
buffer is made when the loop asks where to receive, ``view``), and a new
buffer grows with what arrives: it holds at most ``FRAME_AHEAD_BYTES`` (or
as much again as has arrived, whichever is more) beyond the bytes received,
and doubles as it fills, so a frame costs a few reallocations the first time
and none once a pooled buffer of its size is reused.
"""

from __future__ import annotations

from typing import Final, Protocol

from headrace.protocols._buffer import FramePool

__all__ = ["FRAME_AHEAD_BYTES", "MAX_POOLED_FRAMES", "MAX_POOLED_FRAME_BYTES", "LargeFrames"]

FRAME_AHEAD_BYTES: Final = 256 * 1024
"""The most a new frame buffer is allocated beyond the bytes received, when
fewer than this have arrived: what one receive of the listener's buffer
(``READ_CHUNK_BYTES``) takes in anyway, so a frame announced by a header
alone costs nothing and a peer that sends a few bytes of it costs this much,
not the frame's size."""

_ZEROS: Final = bytes(16 * 1024 * 1024)
"""What a growing buffer is extended with (allocated zeroed by the C library,
so its pages cost nothing until read). Larger than any frame a codec accepts."""

MAX_POOLED_FRAMES: Final = 2
"""Large-frame buffers a connection keeps for reuse: a frame's buffer stays
referenced while its data is in the store's hands, so a client streaming
large frames alternates between two."""

MAX_POOLED_FRAME_BYTES: Final = 2 * 1024 * 1024
"""The most those buffers may hold together. They live as long as the
connection, so this is what an idle connection keeps after streaming large
frames; larger frames (the Rust client's batches reach 8 MiB) get a buffer
each, freed once their data is done with."""


class FrameCodec(Protocol):
    """What a sans-I/O connection offers for frames received in place."""

    @property
    def buffered_bytes(self) -> int:
        """Bytes received that do not make a whole frame yet."""

    def partial_frame_size(self) -> int:
        """The size of the frame the buffered bytes begin if it is not whole, else 0."""

    def take_partial_frame(self, target: bytearray) -> int:
        """Move the buffered bytes to the front of ``target``; how many."""

    def receive_owned(self, data: bytearray) -> None:
        """Take ``data`` (a whole frame, or EOF's partial one) as received, without a copy."""


class LargeFrames:
    """The large frame a connection is receiving in place, if any.

    Args:
        codec: the connection's sans-I/O object.
        min_bytes: frames at least this large are received in place (the
            codec must hand frames this large over without copying them).
    """

    __slots__ = ("_codec", "_frame", "_got", "_min_bytes", "_pool", "_size")

    def __init__(self, codec: FrameCodec, min_bytes: int) -> None:
        self._codec = codec
        self._min_bytes = min_bytes
        self._pool = FramePool(MAX_POOLED_FRAMES, MAX_POOLED_FRAME_BYTES)
        self._size = 0  # of the large frame the codec's bytes begin (0: none)
        self._frame: bytearray | None = None  # its buffer, once made; grows to _size
        self._got = 0

    @property
    def pending(self) -> bool:
        """A frame is being received in place."""
        return self._frame is not None

    @property
    def received_bytes(self) -> int:
        """Bytes of that frame received so far (0: none pending)."""
        return self._got if self._frame is not None else 0

    @property
    def held_bytes(self) -> int:
        """Bytes of the buffer the pending frame is received into (0: none pending)."""
        return len(self._frame) if self._frame is not None else 0

    def view(self) -> memoryview | None:
        """The rest of the pending frame's buffer, for the kernel to write into.

        Makes the buffer, the first time, for a large frame the codec has
        begun (moving its bytes there), and grows it when it is full.
        """
        frame = self._frame
        if frame is None:
            if not self._size:
                return None
            frame = self._pool.take(self._size)
            if frame is None:
                frame = bytearray(self._ahead(self._codec.buffered_bytes))
            self._got = self._codec.take_partial_frame(frame)
            self._frame = frame
        elif self._got == len(frame):
            frame = self._grow(frame, self._ahead(self._got))
        return memoryview(frame)[self._got :]

    def _ahead(self, got: int) -> int:
        """The size a new buffer holding ``got`` bytes of the frame is given."""
        return min(self._size, got + max(FRAME_AHEAD_BYTES, got))

    def _grow(self, frame: bytearray, size: int) -> bytearray:
        """``frame`` grown to ``size`` bytes (the same buffer unless a view of it is held)."""
        zeros = memoryview(_ZEROS)
        try:
            while len(frame) < size:
                frame += zeros[: size - len(frame)]
        except BufferError:  # the receiving transport still holds a view: grow a copy
            grown = bytearray(size)
            grown[: len(frame)] = frame
            frame = self._frame = grown
        return frame

    def start(self) -> None:
        """After the codec has parsed what it could: note a large partial frame."""
        size = self._codec.partial_frame_size()
        self._size = size if size >= self._min_bytes else 0

    def received(self, nbytes: int) -> bool:
        """``nbytes`` more landed in ``view``; True once the frame is whole and
        given to the codec (parse it next)."""
        frame = self._frame
        assert frame is not None
        self._got += nbytes
        if self._got < self._size:
            return False
        self._frame = None
        self._size = 0
        self._pool.keep(frame)
        self._codec.receive_owned(frame)
        return True

    def fill(self, data: bytes | memoryview) -> int:
        """Copy the start of ``data`` into the pending frame (bytes that did not
        come through ``view``); how many were taken."""
        frame = self._frame
        assert frame is not None
        taken = min(len(data), self._size - self._got)
        end = self._got + taken
        if end > len(frame):
            frame = self._grow(frame, max(end, self._ahead(self._got)))
        frame[self._got : end] = data[:taken]
        return taken

    def give_back(self) -> None:
        """EOF inside the pending frame: its bytes go back to the codec, which
        reports the truncated frame."""
        frame = self._frame
        assert frame is not None
        self._frame = None
        self._size = 0
        self._codec.receive_owned(frame[: self._got])
