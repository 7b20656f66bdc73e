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
"""

from __future__ import annotations

from typing import Final, Protocol

from headrace.protocols._buffer import FramePool

__all__ = ["MAX_POOLED_FRAMES", "MAX_POOLED_FRAME_BYTES", "LargeFrames"]

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

    __slots__ = ("_codec", "_frame", "_got", "_min_bytes", "_pool")

    def __init__(self, codec: FrameCodec, min_bytes: int) -> None:
        self._codec = codec
        self._min_bytes = min_bytes
        self._pool = FramePool(MAX_POOLED_FRAMES, MAX_POOLED_FRAME_BYTES)
        self._frame: bytearray | None = None
        self._got = 0

    @property
    def pending(self) -> bool:
        """A frame is being received in place."""
        return self._frame is not None

    @property
    def received_bytes(self) -> int:
        """Bytes of that frame received so far (0: none pending)."""
        return self._got if self._frame is not None else 0

    def view(self) -> memoryview | None:
        """The rest of the pending frame's buffer, for the kernel to write into."""
        frame = self._frame
        return None if frame is None else memoryview(frame)[self._got :]

    def start(self) -> None:
        """After the codec has parsed what it could: move a large partial frame out."""
        size = self._codec.partial_frame_size()
        if size >= self._min_bytes:
            frame = self._pool.get(size)
            self._got = self._codec.take_partial_frame(frame)
            self._frame = frame

    def received(self, nbytes: int) -> bool:
        """``nbytes`` more landed in ``view``; True once the frame is whole and
        given to the codec (parse it next)."""
        frame = self._frame
        assert frame is not None
        self._got += nbytes
        if self._got < len(frame):
            return False
        self._frame = None
        self._codec.receive_owned(frame)
        return True

    def fill(self, data: bytes | memoryview) -> int:
        """Copy the start of ``data`` into the pending frame (bytes that did not
        come through ``view``); how many were taken."""
        frame = self._frame
        assert frame is not None
        taken = min(len(data), len(frame) - self._got)
        frame[self._got : self._got + taken] = data[:taken]
        return taken

    def give_back(self) -> None:
        """EOF inside the pending frame: its bytes go back to the codec, which
        reports the truncated frame."""
        frame = self._frame
        assert frame is not None
        self._frame = None
        self._codec.receive_owned(frame[: self._got])
