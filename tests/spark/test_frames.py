"""The reader's frame splitting (Arrow, no Spark): every event, in order, whatever its size."""

from __future__ import annotations

import random
import struct

import pytest

from headrace.errors import RemoteProtocolError
from headrace.spark import _frames

HEADER = struct.Struct(">ii")


def _framed(events: list[bytes]) -> tuple[bytes, list[int]]:
    starts, parts, pos = [], [], 0
    for e in events:
        starts.append(pos)
        parts.append(HEADER.pack(0, len(e)) + e)
        pos += HEADER.size + len(e)
    return b"".join(parts), starts


@pytest.mark.parametrize(
    "sizes",
    [
        [100] * 5000,  # one stride throughout: the checked-at-once path
        [random.Random(3).randrange(0, 300) for _ in range(3000)],  # header by header
        [5] * 20 + [7] * 40 + [0] * 30 + [100] * 30 + [3],  # runs that change size
        [12] * 9 + [13] + [12] * 50,  # a run broken right after the check starts
    ],
)
def test_split_frames_gives_every_whole_event_and_leaves_the_cut_one(sizes: list[int]) -> None:
    events = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    buf, starts = _framed(events)
    for cut in (len(buf), len(buf) - 1, len(buf) - len(events[-1]) - HEADER.size - 3):
        values, got_starts, used = _frames.split_frames(buf[:cut])
        whole = sum(1 for s, e in zip(starts, events, strict=True) if s + 8 + len(e) <= cut)
        assert values.to_pylist() == events[:whole]
        assert got_starts.to_pylist() == starts[:whole]
        assert used == (starts[whole] if whole < len(events) else len(buf))


@pytest.mark.parametrize("index", [5, 15])  # before and inside a run checked at once
def test_a_frame_that_is_not_an_event_is_refused(index: int) -> None:
    """The reader then reads the bytes as the record layer does (raw chunks)."""
    buf, _ = _framed([b"a" * 10] * 40)
    bad = buf[: 18 * index] + struct.pack(">ii", 7, 10) + buf[18 * index + 8 :]
    with pytest.raises(RemoteProtocolError, match="not an event"):
        _frames.split_frames(bad)
