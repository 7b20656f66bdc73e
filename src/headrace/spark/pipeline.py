"""The reference pipeline: web access logs in a headrace stream, summarised per minute.

A Structured Streaming job reads access-log events from a headrace stream
(``logs/access``; Lumberjack documents whose ``message`` is a Common/Combined
Log Format line, or bare lines), parses them, and computes for every
1-minute window (by the time in the log line): requests, bytes, the share of
2xx/3xx/4xx/5xx answers and the top paths.

State stays bounded: the aggregation runs in *update* mode with a watermark
on the log time (``WATERMARK_DELAY`` behind the latest time seen), so Spark
keeps only the windows that can still change and drops events older than
that. Each micro-batch gets the (window, path) counts it changed and
publishes the current summary of every window it touched

* to the headrace stream ``logs/summary`` (one JSON record per window, routed
  by the window's start; committed exactly once per micro-batch, so the
  latest record of a window is its current summary), and
* to Parquet, partitioned by ``minute``: only the touched windows'
  partitions are rewritten. The per-path counts of every window are kept
  beside it (``<parquet>/_paths``, also by ``minute``; Spark's readers skip
  ``_`` directories), because a window's top paths need all of its paths,
  not only those that changed in the batch.

``headrace demo`` runs it on an embedded server; on a cluster::

    PIPELINE=$(python -c 'import headrace.spark.pipeline as m; print(m.__file__)')
    spark-submit --master spark://host:7077 "$PIPELINE" --controller tcp://hr:9090 \\
        --checkpoint hdfs:///ck/summary --parquet hdfs:///out/summary

(``docs/spark.md``: what to install on the driver and executors).
"""

from __future__ import annotations

import argparse
import hashlib
from typing import TYPE_CHECKING, Any

from pyspark.errors import AnalysisException
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from . import _connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "ACCESS_LOG_PATTERN",
    "SUMMARY_COLUMNS",
    "TOP_PATHS",
    "WATERMARK_DELAY",
    "parse_access_logs",
    "start_summary_query",
    "summarise",
]

ACCESS_LOG_PATTERN = r'^(\S+) \S+ \S+ \[([^\]]+)\] "(\S+) (\S+)[^"]*" (\d{3}) (\d+|-)'
"""Common Log Format (Combined adds referrer and agent after it): client,
identity, user, [time], "method path protocol", status, bytes."""

LOG_TIME_FORMAT = "dd/MMM/yyyy:HH:mm:ss Z"
"""The ``[10/Oct/2026:13:55:36 +0000]`` time of the log format."""

TOP_PATHS = 3
"""Paths listed per window, most requested first."""

WATERMARK_DELAY = "10 minutes"
"""How far behind the latest log time an event may arrive and still count;
windows that end before the watermark are final and leave Spark's state."""

MINUTE_FORMAT = "yyyyMMdd'T'HHmm"
"""The ``minute`` partition value (a window's start, UTC): not a date or a
number, so Spark's partition inference leaves it a string."""

PATHS_DIR = "_paths"
"""Sub-directory of the Parquet output with the per-(window, path) counts."""

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


def parse_access_logs(events: DataFrame) -> DataFrame:
    """Stored events (the data source's rows) -> one row per parsed request.

    Lines that do not parse are dropped.
    """
    text = F.col("value").cast("string")
    line = F.coalesce(F.get_json_object(text, "$.message"), text)
    parts = [F.regexp_extract(line, ACCESS_LOG_PATTERN, i) for i in range(1, 7)]
    size = F.when(parts[5] == "-", F.lit(0)).otherwise(parts[5].cast("long"))
    return events.select(
        parts[0].alias("client"),
        F.to_timestamp(parts[1], LOG_TIME_FORMAT).alias("time"),
        parts[2].alias("method"),
        parts[3].alias("path"),
        parts[4].cast("int").alias("status"),
        size.alias("bytes"),
    ).where(F.col("time").isNotNull() & F.col("status").isNotNull())


def _per_window_and_path(requests: DataFrame, watermark: str | None = None) -> DataFrame:
    status_class = (F.col("status") / 100).cast("int")
    if watermark is not None:
        requests = requests.withWatermark("time", watermark)
    return requests.groupBy(F.window("time", "1 minute").alias("window"), "path").agg(
        F.count(F.lit(1)).alias("requests"),
        F.sum("bytes").alias("bytes"),
        *(F.sum((status_class == c).cast("long")).alias(f"s{c}xx") for c in (2, 3, 4, 5)),
    )


def summarise(per_path: DataFrame) -> DataFrame:
    """Per-(window, path) counts -> one summary row per window (``SUMMARY_COLUMNS``)."""
    ranked = per_path.withColumn(
        "rank",
        F.row_number().over(
            Window.partitionBy("window").orderBy(F.desc("requests"), F.asc("path"))
        ),
    )
    top = F.struct(F.col("requests").alias("n"), F.col("path").alias("path"))
    totals = ranked.groupBy("window").agg(
        F.sum("requests").alias("requests"),
        F.sum("bytes").alias("bytes"),
        *(F.sum(f"s{c}xx").alias(f"s{c}xx") for c in (2, 3, 4, 5)),
        F.sort_array(F.collect_list(F.when(F.col("rank") <= TOP_PATHS, top)), asc=False).alias(
            "top"
        ),
    )
    n = F.col("requests")
    return totals.select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        n.alias("requests"),
        F.col("bytes"),
        *(F.round(F.col(f"s{c}xx") / n, 4).alias(f"rate_{c}xx") for c in (2, 3, 4, 5)),
        F.round((F.col("s4xx") + F.col("s5xx")) / n, 4).alias("error_rate"),
        F.transform("top", lambda t: t["path"]).alias("top_paths"),
    ).orderBy("window_start")


def _writer_id(checkpoint: str) -> str:
    """A stable id for the summary sink: the same checkpoint, the same id."""
    return "summary-" + hashlib.sha256(checkpoint.encode()).hexdigest()[:16]


def _overwrite(table: DataFrame, path: str) -> None:
    """Replace the ``minute`` partitions of ``path`` that ``table`` has, keep the others."""
    (
        table.write.mode("overwrite")
        .option("partitionOverwriteMode", "dynamic")
        .partitionBy("minute")
        .parquet(path)
    )


def start_summary_query(
    spark: SparkSession,
    *,
    controller: str,
    checkpoint: str,
    parquet: str,
    source: str = "logs/access",
    summary: str = "logs/summary",
    max_events_per_trigger: int | None = None,
    available_now: bool = True,
    processing_time: str = "5 seconds",
    watermark: str = WATERMARK_DELAY,
) -> StreamingQuery:
    """Start the pipeline and return its query (``availableNow``: it stops by
    itself once everything stored when it started is processed)."""
    reader = (
        spark.readStream.format("headrace")
        .option("controller", controller)
        .option("stream", source)
        .option("startingOffsets", "earliest")
    )
    if max_events_per_trigger:
        reader = reader.option("maxEventsPerTrigger", str(max_events_per_trigger))
    per_path = _per_window_and_path(parse_access_logs(reader.load()), watermark)
    _connect.ensure_stream(controller, summary, SUMMARY_SEGMENTS)
    writer_id = _writer_id(checkpoint)
    paths_dir = f"{parquet.rstrip('/')}/{PATHS_DIR}"

    def publish(updates: DataFrame, batch_id: int) -> None:
        spark_ = updates.sparkSession
        minute = F.date_format("window.start", MINUTE_FORMAT)
        updates = updates.withColumn("minute", minute).localCheckpoint()
        touched = [r.minute for r in updates.select("minute").distinct().collect()]
        if not touched:
            return
        # The current counts of every path of the touched windows: what was
        # stored for them, with the batch's (newer) counts replacing their keys.
        try:
            stored = spark_.read.parquet(paths_dir).where(F.col("minute").isin(touched))
            merged = stored.join(updates, ["minute", "path"], "left_anti").unionByName(updates)
        except AnalysisException:  # the first batch: nothing stored yet
            merged = updates
        merged = merged.localCheckpoint()  # read and rewritten below: cut the lineage
        _overwrite(merged, paths_dir)
        table = summarise(merged).withColumn("minute", F.date_format("window_start", MINUTE_FORMAT))
        table = table.localCheckpoint()
        _overwrite(table, parquet)
        records = table.select(
            F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ssXXX").alias("key"),
            F.to_json(F.struct(*SUMMARY_COLUMNS)).alias("value"),
        )
        (
            records.write.format("headrace")
            .option("controller", controller)
            .option("stream", summary)
            .option("writerId", writer_id)
            .option("batchId", str(batch_id))
            .mode("append")
            .save()
        )

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
    row: Any
    for row in spark.read.parquet(args.parquet).orderBy("window_start").collect():
        print(row.asDict())


if __name__ == "__main__":
    main()
