"""Range reads: the events of one segment range as Arrow arrays, on an executor."""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from headrace.client import PravegaClient
from headrace.client.errors import NoSuchSegmentError, SegmentIsTruncatedError
from headrace.client.records import records_from_events
from headrace.errors import RemoteProtocolError
from headrace.protocols.records import (
    EventBuffer,
    Record,
    SkipCount,
    event_time_ms,
    stamp_append_times,
)

from ._connect import Target, make_client
from ._frames import split_frames
from ._positions import DataLossError

if TYPE_CHECKING:
    import pyarrow as pa

    from ._planning import Range

__all__ = ["CREATE_TIME", "LOG_APPEND_TIME", "Columns", "read_range"]

log = logging.getLogger(__name__)

Columns = tuple["pa.Array", "pa.Array", "pa.Array", "pa.Array", "pa.Array"]
"""Records of one read reply as Arrow arrays: keys (binary), values (binary),
offsets (int64), timestamps (``timestamp[us, UTC]``), timestamp types (int32:
``CREATE_TIME`` for an event's own time, ``LOG_APPEND_TIME`` for the time the
store appended it, null without a timestamp)."""

CREATE_TIME = 0
"""``timestampType`` of a time the record carries (Kafka's CreateTime)."""

LOG_APPEND_TIME = 1
"""``timestampType`` of the store's append time (Kafka's LogAppendTime)."""


def _times_of(offsets: pa.Array, times: list[tuple[int, int]]) -> pa.Array:
    """The append time (ms, int64) of the events at ``offsets`` (ascending): the
    time of the last index entry at or below each; null before the first."""
    import pyarrow as pa

    n = len(offsets)
    if not times:
        return pa.nulls(n, pa.int64())
    rows = offsets.to_pylist()
    starts = [bisect.bisect_left(rows, off) for off, _ in times] + [n]
    runs = [pa.nulls(starts[0], pa.int64())]  # events before the first entry
    for i, (_, ms) in enumerate(times):
        count = starts[i + 1] - max(starts[i], 0)
        if count > 0:
            runs.append(pa.repeat(pa.scalar(ms, pa.int64()), count))
    return pa.concat_arrays(runs)


def _own_times(values: pa.Array) -> pa.Array | None:
    """The ``@timestamp`` of each JSON document that has one (ms, int64; null
    for the others), or None when no value has one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    candidates = pc.and_(pc.starts_with(values, "{"), pc.match_substring(values, '"@timestamp"'))
    if not pc.any(candidates).as_py():
        return None
    flags = candidates.to_pylist()
    return pa.array(
        [event_time_ms(v) if f else None for v, f in zip(values.to_pylist(), flags, strict=True)],
        pa.int64(),
    )


def read_range(
    uri: Target, r: Range, *, tank_scope: str, fail_on_data_loss: bool
) -> Iterator[Columns]:
    """The records of ``r`` as :data:`Columns`, one per read reply (up to 2 MiB).

    Runs its own event loop, driven one reply at a time, so a range of any
    size is read with bounded memory.

    Raises:
        DataLossError: part of the range was truncated away (and
            ``fail_on_data_loss``).
    """
    loop = asyncio.new_event_loop()
    client: PravegaClient | None = None
    try:
        client = loop.run_until_complete(_client_on_loop(uri))  # reads credentials here
        batches = _read_batches(client, r, tank_scope == r.scope, fail_on_data_loss)
        while True:
            try:
                yield loop.run_until_complete(anext(batches))
            except StopAsyncIteration:
                return
    finally:
        if client is not None:
            loop.run_until_complete(client.aclose())
        loop.close()


async def _client_on_loop(uri: Target) -> PravegaClient:
    return make_client(uri)  # built on the loop that uses it (grpc.aio binds to it)


async def _read_batches(
    client: PravegaClient, r: Range, tank: bool, fail_on_data_loss: bool
) -> AsyncIterator[Columns]:
    """Ordinary events are cut out of each reply with Arrow (``split_frames``);
    TANK bundles, and bytes that are not events (a byte stream's, read as raw
    chunks), go through the record layer's ``EventBuffer`` one by one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    seg = r.segment
    name = f"{r.scope}/{r.stream}"
    stamp_type = pa.timestamp("us", tz="UTC")
    offset = r.start  # next byte to read
    buf = b""  # bytes from buf_offset not yet decoded (an event cut by a reply)
    buf_offset = offset
    slow = EventBuffer(offset) if tank else None  # the record layer's path
    skipped = SkipCount()
    while offset < r.end:
        try:
            got = await client.segments.read(seg, offset)
        except (SegmentIsTruncatedError, NoSuchSegmentError) as exc:
            if fail_on_data_loss:
                raise DataLossError(
                    f"data loss: {seg.name} lost the events from offset {offset} ({exc}). "
                    "Set failOnDataLoss=false to skip them."
                ) from exc
            if isinstance(exc, NoSuchSegmentError):
                return
            offset = buf_offset = max(offset, exc.start_offset)
            buf = b""
            if slow is not None:
                slow = EventBuffer(offset)
            continue
        data = got.data
        if offset + len(data) > r.end:
            data = data[: r.end - offset]
        offset += len(data)
        ended = got.end_of_segment or offset >= r.end
        if not data and not ended:
            continue
        if slow is None:
            buf = buf + data if buf else data
            try:
                values, starts, used = split_frames(buf)
            except RemoteProtocolError:  # not events: from here on, the record layer's way
                slow, data, buf = EventBuffer(buf_offset), buf, b""
            else:
                n = len(values)
                base = buf_offset
                buf = buf[used:]
                buf_offset += used
                if n:
                    offsets = pc.add(starts.cast(pa.int64()), pa.scalar(base, pa.int64()))
                    last = offsets[n - 1].as_py()
                    times = await client.segments.append_times(seg, offsets[0].as_py(), last + 1)
                    ms = _times_of(offsets, times)
                    types = pc.if_else(pc.is_null(ms), None, LOG_APPEND_TIME).cast(pa.int32())
                    own = _own_times(values)
                    if own is not None:
                        has_own = pc.is_valid(own)
                        ms = pc.if_else(has_own, own, ms)
                        types = pc.if_else(has_own, pa.scalar(CREATE_TIME, pa.int32()), types)
                    micros = pc.multiply(ms, pa.scalar(1000, pa.int64())).cast(stamp_type)
                    yield pa.nulls(n, pa.binary()), values, offsets, micros, types
                if not (ended and buf):
                    if got.end_of_segment:
                        return
                    continue
                # an event that never completed: its bytes as they are
                slow, data, buf = EventBuffer(buf_offset), buf, b""
        events = list(slow.feed(data))
        if ended:
            events += slow.flush()
        before = skipped.events
        records = list(
            records_from_events(name, seg.name, iter(events), tank=tank, skipped=skipped)
        )
        if records and not tank and any(rec.timestamp_ms is None for rec in records):
            times = await client.segments.append_times(
                seg, records[0].offset, records[-1].offset + 1
            )
            records = stamp_append_times(records, times)
        columns = _columns(records)
        if before == 0 and skipped.events:  # once per range (a range is in one segment)
            log.warning("%s: skipping events of %s that are not TANK bundles", name, seg.name)
        if columns is not None:
            yield columns
        if got.end_of_segment:
            return


def _columns(records: list[Record]) -> Columns | None:
    """Records as :data:`Columns`; None if there are none."""
    import pyarrow as pa

    keys: list[bytes | None] = []
    values: list[bytes] = []
    offsets: list[int] = []
    stamps: list[int | None] = []
    types: list[int | None] = []
    for rec in records:
        keys.append(rec.key)
        values.append(rec.value)
        offsets.append(rec.offset)
        if rec.timestamp_ms is None:
            stamps.append(None)
            types.append(None)
        else:
            stamps.append(rec.timestamp_ms * 1000)
            types.append(LOG_APPEND_TIME if rec.append_time else CREATE_TIME)
    if not values:
        return None
    return (
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array(offsets, pa.int64()),
        pa.array(stamps, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array(types, pa.int32()),
    )
