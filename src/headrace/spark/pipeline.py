"""The reference pipeline: web access logs in a headrace stream, summarised per minute.

A Structured Streaming job reads access-log events from a headrace stream
(``logs/access``; Lumberjack documents whose ``message`` is a Common/Combined
Log Format line, or bare lines), parses them, and computes for every
1-minute window (by the time in the log line): requests, bytes, the share of
2xx/3xx/4xx/5xx answers and the top paths.

Spark does the per-event work in one stage per micro-batch: it parses each
line once (one JSON lookup, one regular expression), and counts per
(window, path) in its state store, in *update* mode with a watermark on the
log time (``WATERMARK_DELAY`` behind the latest time seen), so it keeps only
the windows that can still change and drops events older than that. The
micro-batch's output, the (window, path) counts it changed, is a few rows
per window: the driver collects them and, for every window they touch,

* recomputes the window's summary from all of its paths (it keeps the counts
  of the windows Spark still holds; after a restart it reads them back from
  the checkpoint's state store, so nothing else has to be stored),
* rewrites that window's ``minute`` partition of the Parquet summary, and
* publishes the summary to the headrace stream ``logs/summary`` (one JSON
  record per window, routed by the window's start), committed exactly once
  per micro-batch, so the latest record of a window is its current summary.

``headrace demo`` runs it on an embedded server; on a cluster::

    PIPELINE=$(python -c 'import headrace.spark.pipeline as m; print(m.__file__)')
    spark-submit --master spark://host:7077 "$PIPELINE" --controller tcp://hr:9090 \\
        --checkpoint hdfs:///ck/summary --parquet hdfs:///out/summary

(``docs/spark.md``: what to install on the driver and executors).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

# Absolute imports: spark-submit runs this file as a script.
from headrace.spark import _connect, _txns
from headrace.spark.options import write_options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "ACCESS_LOG_PATTERN",
    "SUMMARY_COLUMNS",
    "TOP_PATHS",
    "WATERMARK_DELAY",
    "Summaries",
    "parse_access_logs",
    "start_summary_query",
    "warm_up",
]

ACCESS_LOG_PATTERN = r'^(\S+) \S+ \S+ \[([^\]]+)\] "(\S+) (\S+)[^"]*" (\d{3}) (\d+|-)'
"""Common Log Format (Combined adds referrer and agent after it): client,
identity, user, [time], "method path protocol", status, bytes."""

LINE_PATTERN = "(?s)" + ACCESS_LOG_PATTERN + ".*"
""":data:`ACCESS_LOG_PATTERN` over the whole line, so that one replacement
rewrites a matching line into its fields (``FIELDS``)."""

FIELDS = "$1 $3 $4 $5 $6 $2"
"""A matching line rewritten: client, method, path, status, bytes, time. Only
the time can hold a space, so it goes last and a split in 6 keeps it whole;
the result is always shorter than the line (identity, user, brackets and
quotes are gone), which tells a match from a line left as it was (compared
in bytes: a string knows its byte length, its characters need counting)."""

LOG_TIME_FORMAT = "dd/MMM/yyyy:HH:mm:ss Z"
"""The ``[10/Oct/2026:13:55:36 +0000]`` time of the log format."""

TOP_PATHS = 3
"""Paths listed per window, most requested first."""

WATERMARK_DELAY = "10 minutes"
"""How far behind the latest log time an event may arrive and still count;
windows that end before the watermark are final and leave Spark's state."""

MINUTE_FORMAT = "%Y%m%dT%H%M"
"""The ``minute`` partition value (a window's start, UTC): not a date or a
number, so Spark's partition inference leaves it a string."""

SUMMARY_SEGMENTS = 2
"""Segments of the summary stream when the pipeline creates it (a few records a minute)."""

SUMMARY_COLUMNS = (
    "window_start",
    "window_end",
    "requests",
    "bytes",
    "rate_2xx",
    "rate_3xx",
    "rate_4xx",
    "rate_5xx",
    "error_rate",
    "top_paths",
)

PARQUET_SCHEMA = (
    "window_start TIMESTAMP, window_end TIMESTAMP, requests BIGINT, bytes BIGINT, "
    "rate_2xx DOUBLE, rate_3xx DOUBLE, rate_4xx DOUBLE, rate_5xx DOUBLE, error_rate DOUBLE, "
    "top_paths ARRAY<STRING>, minute STRING"
)
"""One row per window: :data:`SUMMARY_COLUMNS` and the partition column ``minute``."""

COUNTS = ("requests", "bytes", "s2xx", "s3xx", "s4xx", "s5xx")
"""The per-(window, path) counts Spark keeps, in the order of its state's values."""

Counts = tuple[int, int, int, int, int, int]
"""Values of :data:`COUNTS` for one (window, path)."""

Window = tuple[int, int]
"""A window's start and end, epoch microseconds."""

_TIME_UNITS = {
    "week": timedelta(weeks=1),
    "day": timedelta(days=1),
    "hour": timedelta(hours=1),
    "minute": timedelta(minutes=1),
    "second": timedelta(seconds=1),
    "millisecond": timedelta(milliseconds=1),
    "microsecond": timedelta(microseconds=1),
}


def parse_access_logs(events: DataFrame) -> DataFrame:
    """Stored events (the data source's rows) -> one row per parsed request:
    ``client, time, method, path, status, bytes``.

    Each line is parsed once: one JSON lookup, one regular expression
    (``LINE_PATTERN`` rewrites a matching line into its fields), one split.
    The rows come out of ``inline``, a generator: Spark does not push the
    filter on ``time`` below it, so the filter does not parse the line again.
    Lines that do not parse, or whose time does not, are dropped; a byte
    count too large for a long is null.
    """
    text = F.col("value").cast("string")
    lines = events.select(F.coalesce(F.get_json_object(text, "$.message"), text).alias("line"))
    fields = F.regexp_replace("line", LINE_PATTERN, FIELDS)
    split = lines.select(
        F.when(F.octet_length(fields) < F.octet_length("line"), F.split(fields, " ", 6)).alias("f")
    )
    f = F.col("f")
    size = F.when(f[4] == "-", F.lit(0).cast("long")).otherwise(f[4].try_cast("long"))
    request = F.struct(
        f[0].alias("client"),
        F.try_to_timestamp(f[5], F.lit(LOG_TIME_FORMAT)).alias("time"),
        f[1].alias("method"),
        f[2].alias("path"),
        f[3].cast("int").alias("status"),
        size.alias("bytes"),
    )
    parsed = split.select(F.inline(F.when(f.isNotNull(), F.array(request))))
    return parsed.where(F.col("time").isNotNull())


def _per_window_and_path(requests: DataFrame, watermark: str | None = None) -> DataFrame:
    status_class = (F.col("status") / 100).cast("int")
    if watermark is not None:
        requests = requests.withWatermark("time", watermark)
    counts = requests.groupBy(F.window("time", "1 minute").alias("window"), "path").agg(
        F.count(F.lit(1)).alias("requests"),
        F.sum("bytes").alias("bytes"),
        *(F.sum((status_class == c).cast("long")).alias(f"s{c}xx") for c in (2, 3, 4, 5)),
    )
    return counts.select(
        F.unix_micros("window.start").alias("start"),
        F.unix_micros("window.end").alias("end"),
        "path",
        *COUNTS,
    )


def _lateness(watermark: str) -> timedelta | None:
    """The watermark delay as a timedelta (``"10 minutes"``, ``"1 hour 30 minutes"``);
    None for one with months or years, or one this does not read."""
    words = watermark.lower().split()
    if words[:1] == ["interval"]:
        words = words[1:]
    if not words or len(words) % 2:
        return None
    total = timedelta()
    for amount, unit in zip(words[::2], words[1::2], strict=True):
        step = _TIME_UNITS.get(unit.removesuffix("s"))
        if step is None or not re.fullmatch(r"\d+", amount):
            return None
        total += int(amount) * step
    return total


def _round(x: float) -> float:
    """Spark's ``round(x, 4)`` (half up, on the shortest decimal form of ``x``)."""
    return float(Decimal(repr(x)).quantize(Decimal("0.0001"), ROUND_HALF_UP))


def _utc(micros: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)


@dataclass
class Summaries:
    """The per-path counts of the windows Spark still holds, kept by the driver.

    Spark's output in update mode holds only the (window, path) counts a
    micro-batch changed; a window's totals and top paths need all of its
    paths. The driver keeps them between micro-batches; after a restart (the
    first micro-batch of a run) it reads them from the checkpoint's state store
    as they were after the previous micro-batch, so a replayed micro-batch
    gives the same summaries. Windows the watermark has passed are forgotten.

    Attributes:
        lateness: the watermark delay; None: windows are never forgotten.
    """

    lateness: timedelta | None
    windows: dict[Window, dict[str, Counts]] = field(default_factory=dict)
    restored: bool = False

    def restore(self, spark: SparkSession, checkpoint: str, batch_id: int) -> None:
        """Load the counts of the state store after micro-batch ``batch_id - 1``."""
        self.restored = True
        self.windows.clear()
        if batch_id == 0:
            return
        state = spark.read.format("statestore").option("batchId", batch_id - 1).load(checkpoint)
        rows = state.select(
            F.unix_micros("key.window.start").alias("start"),
            F.unix_micros("key.window.end").alias("end"),
            F.col("key.path").alias("path"),
            "value",
        ).collect()
        self.update((r.start, r.end, r.path, *r.value) for r in rows)

    def update(self, rows: Iterable[Sequence[Any]]) -> list[Window]:
        """Merge ``(start, end, path, *COUNTS)`` rows; returns the windows they touched."""
        touched: set[Window] = set()
        for start, end, path, requests, size, s2, s3, s4, s5 in rows:
            window = (start, end)
            counts = (requests, size or 0, s2, s3, s4, s5)  # bytes: null if none fit a long
            self.windows.setdefault(window, {})[path] = counts
            touched.add(window)
        return sorted(touched)

    def forget_final(self) -> None:
        """Forget windows Spark will not change again: those ending at least
        ``lateness`` before the latest window start seen (Spark's watermark,
        the latest event time minus ``lateness``, is at or past that)."""
        if self.lateness is None or not self.windows:
            return
        horizon = max(start for start, _ in self.windows) - self.lateness // timedelta(
            microseconds=1
        )
        for window in [w for w in self.windows if w[1] <= horizon]:
            del self.windows[window]

    def summary(self, window: Window) -> dict[str, Any]:
        """The summary of one window (:data:`SUMMARY_COLUMNS`, times as UTC datetimes)."""
        paths = self.windows[window]
        totals = [sum(c[i] for c in paths.values()) for i in range(len(COUNTS))]
        n, size, s2, s3, s4, s5 = totals
        top = sorted(paths.items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP_PATHS]
        return {
            "window_start": _utc(window[0]),
            "window_end": _utc(window[1]),
            "requests": n,
            "bytes": size,
            "rate_2xx": _round(s2 / n),
            "rate_3xx": _round(s3 / n),
            "rate_4xx": _round(s4 / n),
            "rate_5xx": _round(s5 / n),
            "error_rate": _round((s4 + s5) / n),
            "top_paths": [path for path, _ in top],
        }


def _record(summary: dict[str, Any]) -> tuple[str, str]:
    """A summary as a ``logs/summary`` record: key = window start, value = JSON
    (times as Spark's ``to_json`` writes them, UTC)."""
    doc = dict(summary)
    for name in ("window_start", "window_end"):
        doc[name] = doc[name].strftime("%Y-%m-%dT%H:%M:%S.") + "000Z"
    return summary["window_start"].strftime("%Y-%m-%dT%H:%M:%SZ"), json.dumps(doc)


def _writer_id(checkpoint: str) -> str:
    """A stable id for the summary sink: the same checkpoint, the same id."""
    return "summary-" + hashlib.sha256(checkpoint.encode()).hexdigest()[:16]


def _write_parquet(spark: SparkSession, path: str, table: list[dict[str, Any]]) -> None:
    """Replace the ``minute`` partitions of the summaries in ``table``, keep the others.

    The rows go to Spark as an Arrow table: Spark reads it in the JVM, where
    rows from Python would need a Python worker to unpickle them.
    """
    import pyarrow as pa

    rows = [{**s, "minute": s["window_start"].strftime(MINUTE_FORMAT)} for s in table]
    (
        spark.createDataFrame(pa.Table.from_pylist(rows), PARQUET_SCHEMA)
        .write.mode("overwrite")
        .option("partitionOverwriteMode", "dynamic")
        .partitionBy("minute")
        .parquet(path)
    )


@dataclass
class _Publisher:
    """The ``foreachBatch`` function: summaries of the touched windows to
    Parquet and, exactly once, to the summary stream."""

    controller: str
    checkpoint: str
    parquet: str
    summary: str
    summaries: Summaries

    def __call__(self, updates: DataFrame, batch_id: int) -> None:
        spark = updates.sparkSession
        rows = updates.collect()
        if not rows:
            return
        if not self.summaries.restored:
            self.summaries.restore(spark, self.checkpoint, batch_id)
        touched = self.summaries.update(rows)
        table = [self.summaries.summary(w) for w in touched]
        _write_parquet(spark, self.parquet, table)
        opts = write_options(
            {
                "controller": self.controller,
                "stream": self.summary,
                "writerId": _writer_id(self.checkpoint),
                "batchId": str(batch_id),
            }
        )
        _txns.write_batch(opts, self._records(table))
        self.summaries.forget_final()

    def _records(self, table: list[dict[str, Any]]) -> Iterator[tuple[str, object, object]]:
        for s in table:
            key, value = _record(s)
            yield self.summary, key, value


def warm_up(spark: SparkSession, controller: str, stream: str, scratch: str) -> None:
    """Start, before any event arrives, what the first micro-batch with events
    would otherwise start on its way: the Python workers of the data source's
    reads (one per range of ``stream``, a few events in each segment; Spark
    keeps them and gives them the query's read tasks) with its modules
    imported, and the Parquet writer (a one-row summary written to ``scratch``)."""
    cores = spark.sparkContext.defaultParallelism
    (
        spark.read.format("headrace")
        .option("controller", controller)
        .option("stream", stream)
        .option("minPartitions", str(cores))
        .load()
        .select(F.length("value"))
        .collect()
    )
    window = (0, 60_000_000)
    summaries = Summaries(None, {window: {"/": (1, 0, 1, 0, 0, 0)}})
    _write_parquet(spark, scratch, [summaries.summary(window)])


def start_summary_query(
    spark: SparkSession,
    *,
    controller: str,
    checkpoint: str,
    parquet: str,
    source: str = "logs/access",
    summary: str = "logs/summary",
    max_events_per_trigger: int | None = None,
    min_partitions: int | None = None,
    available_now: bool = True,
    processing_time: str = "5 seconds",
    watermark: str = WATERMARK_DELAY,
) -> StreamingQuery:
    """Start the pipeline and return its query (``availableNow``: it stops by
    itself once everything stored when it started is processed).

    ``min_partitions`` (default: Spark's default parallelism) splits each
    micro-batch's segment ranges so that every core has a share.
    """
    reader = (
        spark.readStream.format("headrace")
        .option("controller", controller)
        .option("stream", source)
        .option("startingOffsets", "earliest")
        .option("minPartitions", str(min_partitions or spark.sparkContext.defaultParallelism))
    )
    if max_events_per_trigger:
        reader = reader.option("maxEventsPerTrigger", str(max_events_per_trigger))
    per_path = _per_window_and_path(parse_access_logs(reader.load()), watermark)
    _connect.ensure_stream(controller, summary, SUMMARY_SEGMENTS)
    publish = _Publisher(controller, checkpoint, parquet, summary, Summaries(_lateness(watermark)))
    writer = (
        per_path.writeStream.outputMode("update")
        .option("checkpointLocation", checkpoint)
        .foreachBatch(publish)
        .queryName("access-log-summary")
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=processing_time)
    return writer.start()


def main(argv: list[str] | None = None) -> None:
    """``spark-submit pipeline.py --controller ... --checkpoint ... --parquet ...``."""
    from pyspark.sql import SparkSession

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--controller", required=True, help="tcp://host:9090")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--parquet", required=True)
    parser.add_argument("--source", default="logs/access")
    parser.add_argument("--summary", default="logs/summary")
    parser.add_argument("--max-events-per-trigger", type=int, default=None)
    parser.add_argument(
        "--watermark", default=WATERMARK_DELAY, help="lateness allowed (a Spark interval)"
    )
    parser.add_argument("--continuous", action="store_true", help="keep running (5 s trigger)")
    args = parser.parse_args(argv)
    spark = SparkSession.builder.appName("headrace-access-log-summary").getOrCreate()
    if not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        # The state store has this many partitions for the checkpoint's lifetime;
        # Spark's default of 200 makes every micro-batch run 200 small tasks.
        spark.conf.set("spark.sql.shuffle.partitions", str(spark.sparkContext.defaultParallelism))
    query = start_summary_query(
        spark,
        controller=args.controller,
        checkpoint=args.checkpoint,
        parquet=args.parquet,
        source=args.source,
        summary=args.summary,
        max_events_per_trigger=args.max_events_per_trigger,
        available_now=not args.continuous,
        watermark=args.watermark,
    )
    query.awaitTermination()
    row: Row
    for row in spark.read.parquet(args.parquet).orderBy("window_start").collect():
        print(row.asDict())
    spark.stop()


if __name__ == "__main__":
    main()
