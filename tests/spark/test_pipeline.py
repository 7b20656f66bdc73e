"""The reference pipeline (``headrace.spark.pipeline``) against a summary computed in Python.

Every test runs the real query on the session's Spark and server: access-log
events in a stream, per-minute summaries in Parquet and in a summary stream.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from headrace.cli.demo import generate_access_logs
from headrace.client import PravegaClient
from headrace.spark import pipeline
from tests.spark.conftest import Server

QUERY_TIMEOUT_S = 300

BAD_LINES = [
    "garbage",
    "",
    '10.0.0.1 - - [not a time] "GET /x HTTP/1.1" 200 5',
    '10.0.0.1 - - [22/Nov/2026:03:00:10 +0000] "GET /x HTTP/1.1" 20 5',
    '10.0.0.1 - - [31/Feb/2026:03:00:10 +0000] "GET /x HTTP/1.1" 200 5',
]
"""Lines the pipeline drops (no match, no time, a time that does not parse)."""


def _expected(lines: list[str]) -> dict[datetime, dict[str, Any]]:
    """Per-minute summaries of the lines that parse, computed here in Python."""
    counts: dict[datetime, dict[str, list[int]]] = defaultdict(dict)
    for line in lines:
        m = re.match(pipeline.ACCESS_LOG_PATTERN, line)
        if m is None:
            continue
        try:
            at = datetime.strptime(m[2], "%d/%b/%Y:%H:%M:%S %z").astimezone(UTC)
        except ValueError:
            continue
        minute = at.replace(second=0, tzinfo=None)
        status, size = int(m[5]), 0 if m[6] == "-" else int(m[6])
        c = counts[minute].setdefault(m[4], [0, 0, 0, 0, 0, 0])
        c[0] += 1
        c[1] += size
        if 2 <= status // 100 <= 5:
            c[status // 100] += 1
    out = {}
    for minute, paths in counts.items():
        n = sum(c[0] for c in paths.values())
        s = [sum(c[i] for c in paths.values()) for i in range(6)]
        top = sorted(paths.items(), key=lambda kv: (-kv[1][0], kv[0]))[: pipeline.TOP_PATHS]
        out[minute] = {
            "window_start": minute,
            "window_end": minute + timedelta(minutes=1),
            "requests": n,
            "bytes": s[1],
            **{f"rate_{c}xx": round(s[c] / n, 4) for c in (2, 3, 4, 5)},
            "error_rate": round((s[4] + s[5]) / n, 4),
            "top_paths": [p for p, _ in top],
        }
    return out


def _write_logs(server: Server, name: str, lines: list[str], *, bare: int = 0) -> None:
    """Ship ``lines`` as Lumberjack-style JSON documents routed by host; the
    first ``bare`` of them as bare lines instead."""
    scope, stream = name.split("/")
    events: list[tuple[str | None, bytes]] = []
    for i, line in enumerate(lines):
        host = f"web-{i % 4}"
        doc = line.encode() if i < bare else json.dumps({"message": line, "host": host}).encode()
        events.append((host, doc))
    server.write(scope, stream, events)


def _run(spark: Any, server: Server, source: str, work: Path, **options: Any) -> Any:
    query = pipeline.start_summary_query(
        spark,
        controller=server.uri,
        checkpoint=str(work / "checkpoint"),
        parquet=str(work / "summary"),
        source=source,
        summary=f"{source}-summary",
        **options,
    )
    assert query.awaitTermination(QUERY_TIMEOUT_S), "the query did not finish in time"
    assert query.exception() is None
    return query


def _parquet(spark: Any, work: Path) -> dict[datetime, dict[str, Any]]:
    """The Parquet summary by window start (naive UTC, as :func:`_expected`)."""
    from pyspark.sql import functions as F

    table = spark.read.parquet(str(work / "summary"))
    for name in ("window_start", "window_end"):
        table = table.withColumn(name, F.unix_micros(name))
    out = {}
    for r in table.collect():
        row = r.asDict()
        for name in ("window_start", "window_end"):
            row[name] = datetime(1970, 1, 1) + timedelta(microseconds=row[name])
        assert row.pop("minute") == row["window_start"].strftime("%Y%m%dT%H%M")
        out[row["window_start"]] = row
    return out


def _summary_records(server: Server, name: str) -> dict[datetime, list[dict[str, Any]]]:
    """The summary stream's records per window, in the order they were committed
    (a window's records share a routing key, so they are in one segment, in order)."""
    scope, stream = name.split("/")

    async def work(client: PravegaClient) -> list[tuple[str, int, bytes]]:
        reader = client.record_reader(scope, stream)
        try:
            return [(r.segment, r.offset, r.value) async for r in reader]
        finally:
            await reader.aclose()

    out: dict[datetime, list[dict[str, Any]]] = defaultdict(list)
    for _, _, value in sorted(server.run(work)):
        doc = json.loads(value)
        start = datetime.fromisoformat(doc["window_start"]).astimezone(UTC).replace(tzinfo=None)
        out[start].append(doc)
    return out


def _check_summary_stream(
    records: dict[datetime, list[dict[str, Any]]], want: dict[datetime, dict[str, Any]]
) -> None:
    """Each window's latest record is its summary, and its records are each
    batch's once: every micro-batch that touches a window adds requests to it,
    so a record published twice would repeat a count."""
    assert set(records) == set(want)
    for start, docs in records.items():
        latest = docs[-1]
        assert latest["requests"] == want[start]["requests"]
        assert latest["bytes"] == want[start]["bytes"]
        assert latest["top_paths"] == want[start]["top_paths"]
        counts = [d["requests"] for d in docs]
        assert counts == sorted(set(counts)), f"{start}: {counts}"


def test_the_pipeline_summarises_every_minute_drops_bad_and_late_lines_and_publishes_once(
    server: Server, spark: Any, stream_name: str, tmp_path: Path
) -> None:
    server.create_stream("sp", stream_name, segments=2)
    server.create_stream("sp", f"{stream_name}-summary", segments=2)
    lines = list(generate_access_logs(3000, minutes=3))
    # At the end of every segment: events of the first minute, once later
    # batches have moved the 1-minute watermark past it; Spark drops them.
    late = ['10.0.0.9 - - [22/Nov/2026:03:00:05 +0000] "GET /late HTTP/1.1" 200 7'] * 8
    _write_logs(server, f"sp/{stream_name}", [*lines[:20], *BAD_LINES, *lines[20:]], bare=20)
    _write_logs(server, f"sp/{stream_name}", late)

    query = _run(
        spark,
        server,
        f"sp/{stream_name}",
        tmp_path,
        max_events_per_trigger=700,
        watermark="1 minute",
    )
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert len(batches) >= 4
    # Counted after Spark's partial aggregation: at least one row.
    assert sum(op["numRowsDroppedByWatermark"] for p in batches for op in p["stateOperators"])
    want = _expected(lines)
    assert _parquet(spark, tmp_path) == want
    _check_summary_stream(_summary_records(server, f"sp/{stream_name}-summary"), want)


def test_the_pipeline_restarts_from_its_checkpoint_and_replays_a_batch_once(
    server: Server, spark: Any, stream_name: str, tmp_path: Path
) -> None:
    server.create_stream("sp", stream_name, segments=2)
    server.create_stream("sp", f"{stream_name}-summary", segments=2)
    lines = list(generate_access_logs(2000, minutes=2))
    first, second = lines[::2], lines[1::2]  # both cover every minute and every path
    _write_logs(server, f"sp/{stream_name}", first)
    _run(spark, server, f"sp/{stream_name}", tmp_path, max_events_per_trigger=600)
    assert _parquet(spark, tmp_path) == _expected(first)

    # A new run on the same checkpoint: the windows' paths counted by the first
    # run come back from the state store, so the summaries cover both halves.
    _write_logs(server, f"sp/{stream_name}", second)
    _run(spark, server, f"sp/{stream_name}", tmp_path, max_events_per_trigger=600)
    want = _expected(lines)
    assert _parquet(spark, tmp_path) == want
    summary = f"sp/{stream_name}-summary"
    before = _summary_records(server, summary)
    _check_summary_stream(before, want)

    # The driver "crashes" after the last batch published its summaries but
    # before Spark marked the batch done: the batch is replayed with the same
    # id, gives the same summaries, and publishes nothing twice.
    commits = tmp_path / "checkpoint" / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink()
    replayed = _run(spark, server, f"sp/{stream_name}", tmp_path)
    assert any(p["numInputRows"] for p in replayed.recentProgress), "nothing was replayed"
    assert _parquet(spark, tmp_path) == want
    assert _summary_records(server, summary) == before


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("10 minutes", timedelta(minutes=10)),
        ("1 hour 30 minutes", timedelta(minutes=90)),
        ("interval 2 seconds", timedelta(seconds=2)),
        ("1 day", timedelta(days=1)),
        ("1 month", None),
        ("ten minutes", None),
        ("", None),
    ],
)
def test_the_watermark_delay_is_read_or_left_alone(text: str, want: timedelta | None) -> None:
    assert pipeline._lateness(text) == want


def test_summaries_forget_windows_the_watermark_has_passed() -> None:
    minute = 60_000_000
    summaries = pipeline.Summaries(timedelta(minutes=2))
    rows = [(m * minute, (m + 1) * minute, "/", 1, 10, 1, 0, 0, 0) for m in range(6)]
    assert summaries.update(rows) == [(m * minute, (m + 1) * minute) for m in range(6)]
    summaries.forget_final()
    # The latest start is minute 5: Spark's watermark is at least minute 3, so
    # windows ending at minute 3 or earlier are final.
    assert sorted(summaries.windows) == [(m * minute, (m + 1) * minute) for m in range(3, 6)]
    assert summaries.summary((5 * minute, 6 * minute))["requests"] == 1
