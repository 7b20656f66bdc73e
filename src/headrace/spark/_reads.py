"""Range reads: the events of one segment range as Arrow arrays, on an executor."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from headrace.client import PravegaClient
from headrace.client.errors import NoSuchSegmentError, SegmentIsTruncatedError
from headrace.client.records import records_from_events
from headrace.errors import RemoteProtocolError
from headrace.protocols.records import EventBuffer, Record, SkipCount

from ._connect import Target, make_client
from ._frames import split_frames
from ._positions import DataLossError

if TYPE_CHECKING:
    import pyarrow as pa

    from ._planning import Range

__all__ = ["Columns", "read_range"]

log = logging.getLogger(__name__)

Columns = tuple["pa.Array", "pa.Array", "pa.Array", "pa.Array"]
"""Records of one read reply as Arrow arrays: keys (binary), values (binary),
offsets (int64), timestamps (``timestamp[us, UTC]``)."""


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
                    yield pa.nulls(n, pa.binary()), values, offsets, pa.nulls(n, stamp_type)
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
        records = records_from_events(name, seg.name, iter(events), tank=tank, skipped=skipped)
        columns = _columns(records)
        if before == 0 and skipped.events:  # once per range (a range is in one segment)
            log.warning("%s: skipping events of %s that are not TANK bundles", name, seg.name)
        if columns is not None:
            yield columns
        if got.end_of_segment:
            return


def _columns(records: Iterator[Record]) -> Columns | None:
    """Records as :data:`Columns`; None if there are none."""
    import pyarrow as pa

    keys: list[bytes | None] = []
    values: list[bytes] = []
    offsets: list[int] = []
    stamps: list[int | None] = []
    for rec in records:
        keys.append(rec.key)
        values.append(rec.value)
        offsets.append(rec.offset)
        stamps.append(None if rec.timestamp_ms is None else rec.timestamp_ms * 1000)
    if not values:
        return None
    return (
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array(offsets, pa.int64()),
        pa.array(stamps, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
    )
