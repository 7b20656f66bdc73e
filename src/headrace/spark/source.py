"""The PySpark data source ``headrace``: batch and streaming reader, exactly-once writer.

Where each method runs (``docs/spark.md``, "Where the code runs"):

* ``HeadraceDataSource``, ``schema``, ``reader``/``streamReader``/``writer``/
  ``streamWriter`` constructors: the driver, when the query is planned (the
  options are checked here, so a bad one fails before any task);
* ``partitions``, ``initialOffset``, ``latestOffset``, ``commit`` of the stream
  reader: a long-lived Python process next to the driver;
* ``read`` and ``write``: Python workers on the executors (each opens its own
  client; nothing is shared between processes);
* ``commit``/``abort`` of the writers: the driver.

Reads go through the client's segment reads (Pravega events, Lumberjack
events and TANK bundles, unpacked, all as records) and come back as Arrow
record batches whose types match the schema exactly.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from . import _connect, _planning, _positions, _reads, _txns
from .options import ReadOptions, WriteOptions, read_options, write_options

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Row
    from pyspark.sql.types import StructType

__all__ = [
    "HEADERS_COLUMN",
    "SCHEMA",
    "HeadraceDataSource",
    "RangePartition",
    "TxnMessage",
]

SCHEMA = (
    "key BINARY, value BINARY, scope STRING, stream STRING, partition BIGINT, "
    "offset BIGINT, timestamp TIMESTAMP, timestampType INT"
)
"""Kafka's column names: ``partition`` is the segment id (segments split and
merge, so it is a 64-bit id), ``offset`` the event's byte offset in it;
``timestamp`` the event's own time (``timestampType`` 0, Kafka's CreateTime)
or the time the store appended it (1, LogAppendTime)."""

HEADERS_COLUMN = "headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
"""Added with ``includeHeaders=true`` (Kafka compatibility; always null: no
protocol headrace speaks carries record headers)."""


def _arrow_schema(headers: bool) -> pa.Schema:
    import pyarrow as pa

    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("scope", pa.string()),
        pa.field("stream", pa.string()),
        pa.field("partition", pa.int64()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if headers:
        item = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
        fields.append(pa.field("headers", pa.list_(item)))
    return pa.schema(fields)


TIMESTAMP_INDEX = 6
"""Position of ``timestamp`` in :data:`SCHEMA`."""


def _since(batch: pa.RecordBatch, ms: int) -> pa.RecordBatch:
    """The rows of ``batch`` whose timestamp is null or at least ``ms``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    stamps = batch.column(TIMESTAMP_INDEX)
    limit = pa.scalar(ms * 1000, pa.timestamp("us", tz="UTC"))
    keep = pc.or_kleene(pc.is_null(stamps), pc.greater_equal(stamps, limit))
    return batch.filter(pc.fill_null(keep, True))


@dataclass
class RangePartition(InputPartition):
    """One Spark partition: the events of one segment in ``[start, end)``."""

    scope: str
    stream: str
    segment_id: int
    start: int
    end: int

    def to_range(self) -> _planning.Range:
        return _planning.Range(self.scope, self.stream, self.segment_id, self.start, self.end)


def _partitions(ranges: Sequence[_planning.Range]) -> list[RangePartition]:
    return [RangePartition(r.scope, r.stream, r.segment_id, r.start, r.end) for r in ranges]


def _read(opts: ReadOptions, part: RangePartition) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa

    schema = _arrow_schema(opts.include_headers)
    r = part.to_range()
    since = opts.starting_times.get(f"{r.scope}/{r.stream}")
    for keys, values, offsets, stamps, types in _reads.read_range(
        opts.connection,
        r,
        tank_scope=opts.tank_scope,
        fail_on_data_loss=opts.fail_on_data_loss,
    ):
        n = len(values)
        columns = [
            keys,
            values,
            pa.repeat(pa.scalar(r.scope, pa.string()), n),
            pa.repeat(pa.scalar(r.stream, pa.string()), n),
            pa.repeat(pa.scalar(r.segment_id, pa.int64()), n),
            offsets,
            stamps,
            types,
        ]
        if opts.include_headers:
            columns.append(pa.nulls(n, schema.field("headers").type))
        batch = pa.RecordBatch.from_arrays(columns, schema=schema)
        if since is not None and batch.column(TIMESTAMP_INDEX).null_count < n:
            batch = _since(batch, since)
        yield batch


class HeadraceDataSource(DataSource):
    """``spark.read.format("headrace")``: any headrace stream as records.

    Registered automatically once the package is installed (the
    ``pyspark_headrace`` module); :func:`headrace.spark.register` does it by hand.
    """

    @classmethod
    def name(cls) -> str:
        return "headrace"

    def schema(self) -> str:
        if str(self.options.get("includeHeaders", "false")).lower() == "true":
            return f"{SCHEMA}, {HEADERS_COLUMN}"
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return HeadraceReader(_checked(read_options(self.options, streaming=False)))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return HeadraceStreamReader(_checked(read_options(self.options, streaming=True)))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        stream_column = _check_sink_schema(schema)
        opts = write_options(self.options, stream_column=stream_column)
        _connect.check_connection(opts.connection, opts.target)
        return HeadraceWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        stream_column = _check_sink_schema(schema)
        opts = write_options(self.options, stream_column=stream_column)
        _connect.check_connection(opts.connection, opts.target)
        return HeadraceStreamWriter(opts)


def _checked(opts: ReadOptions) -> ReadOptions:
    """``opts`` once the driver reaches the controller with its TLS settings and
    credentials (``_connect.check_connection``): a wrong CA or password fails the
    query at planning time, not after the clients' retries in every task.
    With ``streamPattern``, the streams that match it now."""
    if opts.stream_pattern is not None:
        _connect.check_connection(opts.connection)  # the TLS check, before listing
        opts = _matched(opts)
        if not opts.streams:
            return opts
    _connect.check_connection(opts.connection, opts.streams[0])
    return opts


def _matched(opts: ReadOptions) -> ReadOptions:
    """``opts`` with ``streams`` listed again from ``streamPattern`` (if given)."""
    if opts.stream_pattern is None:
        return opts
    found = _positions.matching_streams(opts.connection, opts.stream_pattern)
    return dataclasses.replace(opts, streams=tuple(found))


# --------------------------------------------------------------------------- readers


class HeadraceReader(DataSourceReader):
    """Batch read between ``startingOffsets`` (default earliest) and
    ``endingOffsets`` (default latest), every segment the stream ever had."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        ranges = _planning.batch_plan(self.opts)
        return _partitions(ranges) or [RangePartition("", "", 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        if partition.end <= partition.start:
            return iter(())
        return _read(self.opts, partition)


class HeadraceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over the streams' segments; offsets as :data:`_positions.Position`.

    State on ``self`` lives in the driver-side runner process for the query's
    lifetime (the ``availableNow`` target, the latest offsets last seen, the
    time of the last micro-batch for ``maxTriggerDelay``); everything else is
    in the offsets.
    """

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.target: _positions.Position | None = None
        self.latest: _positions.Position | None = None
        self.last_trigger_ms = 0.0  # as Kafka's: the first look may always trigger

    def initialOffset(self) -> dict[str, Any]:
        self.opts = _matched(self.opts)
        return _positions.starting_position(self.opts, "latest")

    def prepareForTriggerAvailableNow(self) -> None:
        self.opts = _matched(self.opts)
        self.target = _positions.latest(self.opts.connection, self.opts.streams)

    def getDefaultReadLimit(self) -> ReadLimit:
        """The limit options as Spark's read limit. Spark hands it back to
        :meth:`latestOffset`, or ``ReadAllAvailable`` for a trigger that reads
        everything (``Trigger.Once``); the options themselves say the limits."""
        o = self.opts
        if o.max_events is not None:
            return ReadMaxRows(o.max_events)
        if o.max_bytes is not None:
            return ReadMaxBytes(o.max_bytes)
        if o.min_events is not None:
            return ReadMinRows(o.min_events)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._follow_pattern(start)
        limited = not isinstance(limit, ReadAllAvailable)
        found = _positions.next_batch(start, self.opts, limited=limited)
        self.latest = found.latest
        end = found.end
        if self.target is not None:
            return _cap(start, end, self.target)  # availableNow: never wait for more
        if limited and self.opts.min_events is not None:
            now = time.time() * 1000
            if now - self.last_trigger_ms < self.opts.max_trigger_delay_ms and not found.enough:
                return start  # too few events yet: no micro-batch this time
            self.last_trigger_ms = now
        return end

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Every segment's length at the last :meth:`latestOffset` (Spark's
        ``latestOffset`` in the query progress; with ``endOffset`` it gives
        the lag, :func:`headrace.spark.progress.offsets_behind_latest`)."""
        return self.latest

    def _follow_pattern(self, start: _positions.Position) -> None:
        """With ``streamPattern``: read the streams that match now (new ones
        from their head); a stream of ``start`` that is gone is data loss."""
        if self.opts.stream_pattern is None:
            return
        self.opts = _matched(self.opts)
        for name in sorted(set(start) - set(self.opts.streams)):
            _positions.lost(self.opts, f"stream {name} no longer exists")

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        ranges = _planning.plan_ranges(
            self.opts.connection, start, end, self.opts.min_partitions, self.opts
        )
        return _partitions(ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return _read(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: positions live in Spark's checkpoint, not on the server."""


def _cap(
    start: _positions.Position, end: _positions.Position, target: _positions.Position
) -> _positions.Position:
    """``end`` no further than the ``availableNow`` target: segments the target
    knows stop at its offsets; segments born after it are left for later."""
    out: _positions.Position = {}
    for name, segs in end.items():
        tgt = target.get(name, {})
        begin = start.get(name, {})
        cur: dict[str, int] = {}
        for seg_id, off in segs.items():
            if seg_id in tgt:
                cur[seg_id] = max(min(off, tgt[seg_id]), begin.get(seg_id, 0))
            elif seg_id in begin or int(seg_id) < max((int(k) for k in tgt), default=0):
                cur[seg_id] = off  # an older segment: sealed, read it to its end
        out[name] = cur
    return out


# --------------------------------------------------------------------------- writers


@dataclass
class TxnMessage(WriterCommitMessage):
    """What a task hands the driver: its open transactions (one per target
    stream it wrote to) and who wrote them."""

    txns: list[tuple[str, str, int, int]]  # _txns.TxnRef fields
    rows: int
    query_id: str | None
    batch_id: int | None


SINK_TEXT_TYPES = ("string", "binary")
"""Types the sink takes for ``value`` and ``key``."""

SINK_PARTITION_TYPES = ("int", "bigint")
"""Types the sink takes for ``partition`` (a segment id)."""

SINK_HEADERS_TYPE = "array<struct<key:string,value:binary>>"
"""The type of Kafka's ``headers`` column, which the sink takes (empty or null only)."""


def _check_sink_schema(schema: StructType) -> bool:
    """Refuse a DataFrame the sink cannot write; returns whether it has a
    ``stream`` column (then the ``stream`` option may be left out)."""
    from .options import OptionError

    types = {f.name.lower(): f.dataType.simpleString() for f in schema.fields}
    if "value" not in types:
        raise OptionError("the headrace sink needs a 'value' column (string or binary)")
    for name in ("stream", "scope"):
        if name in types and types[name] != "string":
            raise OptionError(f"the headrace sink's '{name}' column must be a string")
    if "partition" in types and types["partition"] not in SINK_PARTITION_TYPES:
        raise OptionError(
            "the headrace sink's 'partition' column must be an int or bigint (a segment id)"
        )
    if "headers" in types and types["headers"] != SINK_HEADERS_TYPE:
        raise OptionError(f"the headrace sink's 'headers' column must be {SINK_HEADERS_TYPE}")
    return "stream" in types


def _write(opts: WriteOptions, rows: Iterator[Row]) -> TxnMessage:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    query_id = batch_id = None
    if ctx is not None:
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        raw_batch = ctx.getLocalProperty("streaming.sql.batchId")
        batch_id = int(raw_batch) if raw_batch is not None else None

    def sink_rows() -> Iterator[_txns.SinkRow]:
        for row in rows:
            d = row.asDict()
            value = d.get("value")
            if value is None:
                raise ValueError("the headrace sink got a row whose 'value' is null")
            if d.get("headers"):
                raise ValueError(
                    "the headrace sink got a row with headers: headrace stores no record "
                    "headers (drop the 'headers' column, or leave it null or empty)"
                )
            name = opts.stream_of(d.get("stream"), d.get("scope"))
            yield name, d.get("key"), value, d.get("partition")

    if not opts.exactly_once:
        return TxnMessage([], _txns.write_plain(opts, sink_rows()), query_id, batch_id)
    refs, count = _txns.write_txns(opts, sink_rows())
    txns = [(r.scope, r.stream, r.high_bits, r.low_bits) for r in refs]
    return TxnMessage(txns, count, query_id, batch_id)


def _refs(messages: Sequence[WriterCommitMessage | None]) -> list[_txns.TxnRef]:
    return [_txns.TxnRef(*t) for m in messages if isinstance(m, TxnMessage) for t in m.txns]


class HeadraceWriter(DataSourceWriter):
    """Batch write: one transaction per task, all committed by the driver.

    With options ``writerId`` and ``batchId`` (e.g. inside ``foreachBatch``)
    the commit is idempotent per that pair, like the streaming writer's.
    """

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts
        self.writer_id = opts.writer_id or _txns.new_writer_id()

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return _write(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if not self.opts.exactly_once:
            return  # the tasks appended their rows themselves
        _txns.commit_batch(
            self.opts.connection,
            self.opts.commit_scope,
            self.writer_id,
            self.opts.batch_id,
            _refs(messages),
            retain=self.opts.commits_to_retain,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _txns.abort_txns(self.opts.connection, _refs(messages))


class HeadraceStreamWriter(DataSourceStreamWriter):
    """Streaming write, exactly once: a batch's transactions (one per task and
    target stream) are committed together, once per ``(query id, batch id)``
    (``_txns.commit_batch``)."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return _write(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        refs = _refs(messages)
        if not refs:
            return  # an empty batch, or exactlyOnce=false: nothing to commit
        writer_id = self.opts.writer_id
        if writer_id is None:
            ids = {m.query_id for m in messages if isinstance(m, TxnMessage) and m.query_id}
            if len(ids) != 1:
                raise RuntimeError(f"cannot tell the streaming query id from the tasks: {ids}")
            writer_id = ids.pop()
        _txns.commit_batch(
            self.opts.connection,
            self.opts.commit_scope,
            writer_id,
            batchId,
            refs,
            retain=self.opts.commits_to_retain,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _txns.abort_txns(self.opts.connection, _refs(messages))
