"""Micro-batch planning without Spark: trigger limits and splits fall on event boundaries."""

from __future__ import annotations

import itertools
import re

import pytest

from headrace.spark import OptionError, _planning, _positions, read_options, write_options
from tests.spark.conftest import Server

EVENT_BYTES = 12  # 4-byte payload + the 8-byte event header


def test_trigger_limits_cut_batches_on_event_boundaries(server: Server, stream_name: str) -> None:
    server.create_stream("sp", stream_name, segments=1)
    server.write("sp", stream_name, [(None, b"e%03d" % i) for i in range(100)])
    name = f"sp/{stream_name}"
    start = {name: {"0": 0}}
    base = {"controller": server.uri, "stream": name}

    by_events = read_options({**base, "maxEventsPerTrigger": "7"}, streaming=True)
    assert _positions.advance(server.uri, start, by_events) == {name: {"0": 7 * EVENT_BYTES}}
    by_bytes = read_options({**base, "maxBytesPerTrigger": "130"}, streaming=True)
    assert _positions.advance(server.uri, start, by_bytes) == {name: {"0": 10 * EVENT_BYTES}}
    unlimited = read_options(base, streaming=True)
    assert _positions.advance(server.uri, start, unlimited) == {name: {"0": 100 * EVENT_BYTES}}
    near_end = {name: {"0": 98 * EVENT_BYTES}}
    assert _positions.advance(server.uri, near_end, by_events) == {name: {"0": 100 * EVENT_BYTES}}

    ranges = _planning.plan_ranges(server.uri, start, {name: {"0": 100 * EVENT_BYTES}}, 3)
    assert len(ranges) == 3
    assert all(r.start % EVENT_BYTES == 0 for r in ranges)
    assert ranges[0].start == 0 and ranges[-1].end == 100 * EVENT_BYTES
    assert all(a.end == b.start for a, b in itertools.pairwise(ranges))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"stream": "a/b"}, "controller"),
        ({"controller": "tcp://h:1"}, "stream"),
        ({"controller": "tcp://h:1", "stream": "b"}, "scope"),
        ({"controller": "tcp://h:1", "stream": "a/b", "maxBytesPerTrigger": "0"}, "maxBytes"),
        ({"controller": "tcp://h:1", "stream": "a/b", "startingOffsets": "{"}, "startingOffsets"),
        ({"controller": "tcp://h:1", "stream": "a/b", "failOnDataLoss": "maybe"}, "failOnData"),
        ({"controller": "tcp://h:1", "stream": "a/b", "startingTimestamp": "-1"}, "startingTime"),
        ({"controller": "tcp://h:1", "stream": "a/b", "startingTimestamp": "x"}, "startingTime"),
        (
            {"controller": "h:1", "stream": "a/b", "startingOffsetsByTimestamp": '{"c/d": 1}'},
            "names streams not read",
        ),
        (
            {"controller": "tcp://h:1", "stream": "a/b", "startingOffsetsByTimestamp": "[1]"},
            "startingOffsetsByTimestamp",
        ),
        ({"controller": "h:1", "stream": "a/b", "maxTriggerDelay": "soon"}, "maxTriggerDelay"),
        ({"controller": "h:1", "stream": "a/b", "minOffsetsPerTrigger": "0"}, "minOffsets"),
        ({"controller": "h:1", "stream": "a/b", "maxRecordsPerPartition": "x"}, "maxRecords"),
        ({"controller": "h:1", "streamPattern": "a/("}, "not a regular expression"),
        ({"controller": "h:1", "stream": "a/b", "streamPattern": "a/.*"}, "excludes"),
        ({"controller": "tcp://h:1", "stream": "a/b", "endingTimestamp": "1"}, "batch reads only"),
        (
            {"controller": "h:1", "stream": "a/b", "startingOffsetsByTimestampStrategy": "x"},
            "latest or error",
        ),
    ],
)
def test_bad_read_options_name_the_option(options: dict[str, str], named: str) -> None:
    with pytest.raises(OptionError, match=named):
        read_options(options, streaming=True)


def test_bad_write_options_name_the_option() -> None:
    with pytest.raises(OptionError, match="transactionTimeoutMs"):
        write_options({"controller": "h:1", "stream": "a/b", "transactionTimeoutMs": "999999"})
    with pytest.raises(OptionError, match="writerId"):
        write_options({"controller": "h:1", "stream": "a/b", "batchId": "3"})
    with pytest.raises(OptionError, match="'stream'"):
        write_options({"controller": "h:1"})
    with pytest.raises(OptionError, match="commitScope"):
        write_options({"controller": "h:1"}, stream_column=True)
    with pytest.raises(OptionError, match="commitsToRetain"):
        write_options({"controller": "h:1", "stream": "a/b", "commitsToRetain": "0"})


def test_the_stream_option_wins_over_the_stream_column() -> None:
    by_option = write_options({"controller": "h:1", "stream": "a/b"}, stream_column=True)
    assert by_option.stream_of("c/d") == "a/b"
    by_column = write_options({"controller": "h:1", "scope": "s"}, stream_column=True)
    assert by_column.commit_scope == "s"
    assert by_column.stream_of("c/d") == "c/d"
    assert by_column.stream_of("d") == "s/d"
    assert by_column.stream_of("d", "t") == "t/d"
    with pytest.raises(ValueError, match="'stream'"):
        by_column.stream_of(None)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("startingOffset", "did you mean 'startingOffsets'"),
        ("maxEventPerTrigger", "did you mean 'maxEventsPerTrigger'"),
        ("failondataloss_", "did you mean 'failOnDataLoss'"),
        ("compression", "unknown option 'compression': see docs/spark.md"),
        ("kafka.bootstrap.servers", "option 'controller'"),
        ("subscribe", "'stream' or 'streams'"),
        ("subscribePattern", "option 'streamPattern'"),
        ("kafka.security.protocol", "'caFile'"),
        ("fetchOffset.numRetries", "retries"),
        ("groupIdPrefix", "headrace keeps no consumer groups"),
    ],
)
def test_an_option_no_reader_takes_is_refused_with_what_to_use(given: str, says: str) -> None:
    """A typo or a Kafka-only option fails at planning instead of being ignored."""
    options = {"controller": "tcp://h:1", "stream": "a/b", given: "1"}
    with pytest.raises(OptionError, match=re.escape(says)):
        read_options(options, streaming=True)


def test_an_option_no_writer_takes_is_refused() -> None:
    with pytest.raises(OptionError, match=re.escape("did you mean 'transactionTimeoutMs'")):
        write_options({"controller": "h:1", "stream": "a/b", "transactionTimeout": "5000"})
    with pytest.raises(OptionError, match="Kafka's"):
        write_options({"controller": "h:1", "stream": "a/b", "topic": "t"})
    with pytest.raises(OptionError, match=re.escape("unknown option 'startingOffsets'")):
        write_options({"controller": "h:1", "stream": "a/b", "startingOffsets": "earliest"})


def test_what_spark_passes_along_is_accepted() -> None:
    """``load(path)`` and a streaming query's checkpoint reach the source as options."""
    read_options(
        {"controller": "h:1", "stream": "a/b", "path": "x", "checkpointLocation": "/c"},
        streaming=True,
    )
    write_options({"controller": "h:1", "stream": "a/b", "checkpointLocation": "/c"})
