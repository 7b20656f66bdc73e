"""The exactly-once sink: retried tasks, replayed batches, interrupted commits."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from headrace.client import PravegaClient
from headrace.spark import _txns, write_options
from tests.spark.conftest import Server

QUERY_TIMEOUT_S = 180.0


def _fail_once(row: bytes, marker: Path) -> Any:
    """A UDF passing values through, except that the first task attempt to see
    ``row`` fails (after its earlier rows were written), so Spark retries it
    (local[2,3]). ``marker`` records the failure: a file, because workers are
    processes. Made here, not at module level, so it is pickled by value."""
    from pyspark.sql.functions import udf

    @udf("binary", useArrow=False)
    def fail_once(value: bytes) -> bytes:
        if value == row and not marker.exists():
            marker.touch()
            raise RuntimeError("injected task failure")
        return value

    return fail_once


def _stored(server: Server, name: str) -> Counter[bytes]:
    scope, stream = name.split("/")

    async def work(client: PravegaClient) -> list[bytes]:
        reader = client.record_reader(scope, stream)
        try:
            return [r.value async for r in reader]
        finally:
            await reader.aclose()

    return Counter(server.run(work))


def test_sink_writes_each_row_once_with_a_retried_task_and_a_replayed_batch(
    server: Server, spark: Any, stream_name: str, tmp_path: Path
) -> None:
    from pyspark.sql.functions import col

    server.create_stream("sp", stream_name + "-in", segments=2)
    server.create_stream("sp", stream_name + "-out", segments=2)
    events = [(f"k{i % 13}", b"row-%04d" % i) for i in range(1200)]
    server.write("sp", stream_name + "-in", events)
    marker = tmp_path / "failed-once"

    fail_once = _fail_once(b"row-0600", marker)

    def run() -> Any:
        df = (
            spark.readStream.format("headrace")
            .option("controller", server.uri)
            .option("stream", f"sp/{stream_name}-in")
            .option("startingOffsets", "earliest")
            .option("maxEventsPerTrigger", "500")
            .load()
        )
        query = (
            df.select(
                col("partition").cast("string").alias("key"), fail_once("value").alias("value")
            )
            .writeStream.format("headrace")
            .option("controller", server.uri)
            .option("stream", f"sp/{stream_name}-out")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(QUERY_TIMEOUT_S)
        return query

    query = run()
    assert marker.exists(), "the injected failure did not happen"
    want = Counter(e for _, e in events)
    assert _stored(server, f"sp/{stream_name}-out") == want

    # The driver "crashes" after the last batch's transactions were committed but
    # before Spark marked the batch committed: drop that mark and run again. The batch
    # is replayed with the same id and new transactions; nothing lands twice.
    commits = tmp_path / "checkpoint" / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink()
    replayed = run()
    assert replayed.id == query.id
    assert any(p["numInputRows"] for p in replayed.recentProgress), "nothing was replayed"
    assert _stored(server, f"sp/{stream_name}-out") == want


def test_commit_after_an_interrupted_commit_finishes_it_and_drops_the_replay(
    server: Server, stream_name: str
) -> None:
    server.create_stream("sp", stream_name, segments=1)
    opts = write_options({"controller": server.uri, "stream": f"sp/{stream_name}"})
    target = f"sp/{stream_name}"
    (first,), _ = _txns.write_txns(opts, iter([(target, None, b"first-%d" % i) for i in range(50)]))
    (replay,), _ = _txns.write_txns(
        opts, iter([(target, None, b"replay-%d" % i) for i in range(50)])
    )

    # The first attempt recorded its transactions for (writer, batch 7), then died
    # before committing them.
    async def record(client: PravegaClient) -> None:
        table = await client.kv_table("sp", _txns.COMMIT_TABLE)
        await table.put(b"w1/7", json.dumps([first.to_json()]).encode())

    server.run(record)
    assert _stored(server, f"sp/{stream_name}") == Counter()
    chosen = _txns.commit_batch(server.uri, "sp", "w1", 7, [replay])
    assert chosen == [first]
    assert _stored(server, f"sp/{stream_name}") == Counter(b"first-%d" % i for i in range(50))
    # And once more (another replay): still nothing twice.
    (again,), _ = _txns.write_txns(opts, iter([(target, None, b"again")]))
    assert _txns.commit_batch(server.uri, "sp", "w1", 7, [again]) == [first]
    assert _stored(server, f"sp/{stream_name}") == Counter(b"first-%d" % i for i in range(50))


def test_tasks_transactions_commit_after_the_stream_scaled(
    server: Server, stream_name: str
) -> None:
    """A scale does not wait for the tasks' open transactions; the driver's
    commit rolls them, all of them into one new epoch."""
    server.create_stream("sp", stream_name, segments=1)
    opts = write_options({"controller": server.uri, "stream": f"sp/{stream_name}"})
    target = f"sp/{stream_name}"
    refs = [
        _txns.write_txns(opts, iter([(target, None, b"task%d-%d" % (t, i)) for i in range(20)]))[0][
            0
        ]
        for t in range(3)
    ]

    async def scale(client: PravegaClient) -> None:
        (old,) = await client.controller.get_current_segments("sp", stream_name)
        await client.controller.scale_stream(
            "sp", stream_name, [old.segment.segment_id], [(0.0, 0.5), (0.5, 1.0)]
        )

    server.run(scale)
    assert _txns.commit_batch(server.uri, "sp", "w-scaled", 0, refs) == refs
    want = Counter(b"task%d-%d" % (t, i) for t in range(3) for i in range(20))
    assert _stored(server, target) == want

    async def epoch(client: PravegaClient) -> int:
        segs = await client.controller.get_current_segments("sp", stream_name)
        return max(s.segment.epoch for s in segs)

    assert server.run(epoch) == 3  # scale to 1, one rolling commit to 2 and 3


def _records(server: Server, scope: str, writer_id: str) -> set[int]:
    """Batch ids of ``writer_id`` in the scope's exactly-once table."""

    async def work(client: PravegaClient) -> list[bytes]:
        table = await client.kv_table(scope, _txns.COMMIT_TABLE)
        return [k for k, _, _ in await table.items()]

    keys = [k.decode() for k in server.run(work)]
    return {int(k.rpartition("/")[2]) for k in keys if k.rpartition("/")[0] == writer_id}


def test_the_commit_table_keeps_the_last_batches_and_still_recognises_their_replays(
    server: Server, stream_name: str
) -> None:
    server.create_stream("sp", stream_name, segments=1)
    name = f"sp/{stream_name}"
    opts = write_options({"controller": server.uri, "stream": name})
    retain = 3
    originals = {}
    for batch in range(10):
        (ref,), _ = _txns.write_txns(opts, iter([(name, None, b"b%d" % batch)]))
        originals[batch] = ref
        assert _txns.commit_batch(server.uri, "sp", "w-prune", batch, [ref], retain=retain) == [ref]
        assert _records(server, "sp", "w-prune") == set(range(max(0, batch - 2), batch + 1))
    want = Counter(b"b%d" % b for b in range(10))
    assert _stored(server, name) == want

    # A replay of a batch inside the window is recognised: the new rows are dropped.
    (late,), _ = _txns.write_txns(opts, iter([(name, None, b"replayed-8")]))
    assert _txns.commit_batch(server.uri, "sp", "w-prune", 8, [late], retain=retain) == [
        originals[8]
    ]
    assert _stored(server, name) == want
    # Another writer's records in the same table are left alone.
    (other,), _ = _txns.write_txns(opts, iter([(name, None, b"other")]))
    _txns.commit_batch(server.uri, "sp", "w-other", 0, [other], retain=retain)
    assert _txns.prune_commits(server.uri, "sp", "w-prune", 100) == 3
    assert _records(server, "sp", "w-prune") == set()
    assert _records(server, "sp", "w-other") == {0}


def test_rows_fan_out_to_the_stream_column_exactly_once_with_a_retried_task(
    server: Server, spark: Any, stream_name: str, tmp_path: Path
) -> None:
    from pyspark.sql.functions import col, concat, lit, when

    server.create_stream("sp", stream_name + "-in", segments=2)
    server.create_stream("sp", stream_name + "-a", segments=2)
    server.create_stream("fan", stream_name + "-b", segments=1)
    events = [(f"k{i % 7}", b"row-%04d" % i) for i in range(1000)]
    server.write("sp", stream_name + "-in", events)
    marker = tmp_path / "failed-once"

    fail_once = _fail_once(b"row-0500", marker)  # after writing to both streams

    def run() -> Any:
        df = (
            spark.readStream.format("headrace")
            .option("controller", server.uri)
            .option("stream", f"sp/{stream_name}-in")
            .option("startingOffsets", "earliest")
            .option("maxEventsPerTrigger", "200")
            .load()
        )
        # Even rows to sp/<name>-a (a bare name: the 'scope' option), odd ones to
        # fan/<name>-b (qualified); the record goes to the 'scope' option's scope.
        number = col("value").cast("string").substr(5, 4).cast("int")
        target = when(number % 2 == 0, lit(stream_name + "-a")).otherwise(
            concat(lit("fan/"), lit(stream_name + "-b"))
        )
        query = (
            df.select(target.alias("stream"), fail_once("value").alias("value"))
            .writeStream.format("headrace")
            .option("controller", server.uri)
            .option("scope", "sp")
            .option("commitsToRetain", "2")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(QUERY_TIMEOUT_S)
        return query

    query = run()
    assert marker.exists(), "the injected failure did not happen"
    even = Counter(e for i, (_, e) in enumerate(events) if i % 2 == 0)
    odd = Counter(e for i, (_, e) in enumerate(events) if i % 2 == 1)
    assert _stored(server, f"sp/{stream_name}-a") == even
    assert _stored(server, f"fan/{stream_name}-b") == odd
    batches = [p["batchId"] for p in query.recentProgress if p["numInputRows"]]
    assert len(batches) >= 4, batches
    # Bounded bookkeeping: only the last two batches' records are kept.
    assert _records(server, "sp", query.id) == set(batches[-2:])

    # Replay the last batch (its commit mark dropped): recognised, nothing twice.
    commits = tmp_path / "checkpoint" / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink()
    replayed = run()
    assert any(p["numInputRows"] for p in replayed.recentProgress), "nothing was replayed"
    assert _stored(server, f"sp/{stream_name}-a") == even
    assert _stored(server, f"fan/{stream_name}-b") == odd
