"""Pravega event framing in read buffers, as Arrow arrays (no I/O)."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from headrace.errors import RemoteProtocolError
from headrace.protocols.records import MAX_EVENT_BYTES

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["EVENT_HEADER", "frame_starts", "split_frames"]

EVENT_HEADER = struct.Struct(">ii")
"""Pravega event framing: int32 type (0), int32 payload length."""


SLICE_STOP = 2**31 - 1
"""``binary_slice`` stop meaning "to the end of each element"."""

UNIFORM_RUN = 8
"""Consecutive events of one size after which the frame walk checks the rest
of the buffer for that stride at once (Arrow compute) instead of one header
at a time in Python."""


def frame_starts(buf: bytes) -> tuple[list[pa.Array], int]:
    """Where each whole event frame of ``buf`` starts, and where the last one ends.

    Walks the headers in Python, except along runs of equal-sized events
    (fixed-size records): after ``UNIFORM_RUN`` of them it predicts the rest
    of the buffer at that stride and checks every predicted header at once
    with Arrow compute, keeping the run up to the first mismatch.

    Raises:
        RemoteProtocolError: something else than an event frame (the record
            layer reads such bytes as raw chunks).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    unpack = EVENT_HEADER.unpack_from
    header_size = EVENT_HEADER.size
    pieces: list[pa.Array] = []
    walked: list[int] = []
    pos = 0
    end = len(buf)
    same = 0
    last = -1
    data = pa.py_buffer(buf)
    while end - pos >= header_size:
        kind, length = unpack(buf, pos)
        if kind != 0 or not 0 <= length <= MAX_EVENT_BYTES:
            raise RemoteProtocolError(f"not an event at buffer position {pos}: type {kind}")
        stride = header_size + length
        if pos + stride > end:
            break
        same = same + 1 if length == last else 0
        last = length
        if same < UNIFORM_RUN or (end - pos) // stride < 2 * UNIFORM_RUN:
            walked.append(pos)
            pos += stride
            continue
        # A run of equal sizes: predict the rest, check the predicted headers at once.
        count = (end - pos) // stride
        starts = pa.array(range(pos, pos + (count + 1) * stride, stride), pa.int32())
        frames = pa.BinaryArray.from_buffers(pa.binary(), count, [None, starts.buffers()[1], data])
        header = pa.scalar(EVENT_HEADER.pack(0, length), pa.binary())
        good = pc.equal(pc.binary_slice(frames, 0, header_size), header)
        bad = pc.index(good, False).as_py()
        run = count if bad < 0 else bad
        if walked:
            pieces.append(pa.array(walked, pa.int32()))
            walked = []
        pieces.append(starts.slice(0, run))
        pos += run * stride
        same = 0
    if walked:
        pieces.append(pa.array(walked, pa.int32()))
    return pieces, pos


def split_frames(buf: bytes) -> tuple[pa.Array, pa.Array, int]:
    """The payloads (binary) and start positions (int32) of the whole event
    frames of ``buf``, and the bytes they take.

    The frames are one binary array over ``buf`` as is (offsets = frame
    starts); the payloads are that array without each element's 8-byte
    header, cut in one Arrow kernel, so no per-event Python object is made.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    pieces, used = frame_starts(buf)
    starts = pa.concat_arrays(pieces) if pieces else pa.array([], pa.int32())
    n = len(starts)
    bounds = pa.concat_arrays([starts, pa.array([used], pa.int32())])
    frames = pa.BinaryArray.from_buffers(
        pa.binary(), n, [None, bounds.buffers()[1], pa.py_buffer(buf)]
    )
    # An explicit stop: pyarrow 26 miscomputes the output size without one.
    values = pc.binary_slice(frames, EVENT_HEADER.size, SLICE_STOP)
    return values, starts, used
