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
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

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
    query at planning time, not after the clients' retries in every task."""
    _connect.check_connection(opts.connection, opts.streams[0])
    return opts


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
    lifetime (the ``availableNow`` target); everything else is in the offsets.
    """

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.target: _positions.Position | None = None

    def initialOffset(self) -> dict[str, Any]:
        return _positions.starting_position(self.opts, "latest")

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = _positions.latest(self.opts.connection, self.opts.streams)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        end = _positions.advance(self.opts.connection, start, self.opts)
        if self.target is not None:
            end = _cap(start, end, self.target)
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        ranges = _planning.plan_ranges(self.opts.connection, start, end, self.opts.min_partitions)
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
    return "stream" in types


def _write(opts: WriteOptions, rows: Iterator[Row]) -> TxnMessage:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    query_id = batch_id = None
    if ctx is not None:
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        raw_batch = ctx.getLocalProperty("streaming.sql.batchId")
        batch_id = int(raw_batch) if raw_batch is not None else None

    def triples() -> Iterator[tuple[str, object, object]]:
        for row in rows:
            d = row.asDict()
            value = d.get("value")
            if value is None:
                raise ValueError("the headrace sink got a row whose 'value' is null")
            yield opts.stream_of(d.get("stream"), d.get("scope")), d.get("key"), value

    refs, count = _txns.write_txns(opts, triples())
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
            return  # an empty batch: no task wrote anything
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
