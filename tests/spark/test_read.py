"""Batch reads through ``spark.read.format("headrace")``."""

from __future__ import annotations

from typing import Any

from tests.spark.conftest import Server


def test_batch_read_of_pravega_events_matches_what_was_written(
    server: Server, spark: Any, stream_name: str
) -> None:
    server.create_stream("sp", stream_name, segments=3)
    events = [(f"k{i % 50}", f"event-{i}".encode()) for i in range(3000)]
    server.write("sp", stream_name, events)

    df = (
        spark.read.format("headrace")
        .option("controller", server.uri)
        .option("scope", "sp")
        .option("stream", stream_name)
        .load()
    )
    rows = df.collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(e for _, e in events)
    assert {r.stream for r in rows} == {stream_name}
    assert {r.scope for r in rows} == {"sp"}
    assert len({r.partition for r in rows}) == 3
    assert len({(r.partition, r.offset) for r in rows}) == 3000
