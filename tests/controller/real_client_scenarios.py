"""Test-only: real ``pravega_client`` scenarios against a controller, one per process.

Usage: ``python real_client_scenarios.py SCENARIO tcp://127.0.0.1:PORT``. Prints
one JSON object with what the client returned (errors as
``{"error": "<type>", "final": <failed at once>}``); the parent test asserts
on it. Run only in a child process with a hard timeout: the real client's
calls block, hold the GIL, and retry for about a minute against a dead server.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pravega_client as pc

if __name__ == "__main__":  # run as a script: make ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.pravega_binding import read_slice, run

FAST_S = 5.0
"""A final error arrives at once; a retried one takes about 61 s."""


def attempt(fn: Callable[[], Any]) -> Any:
    start = time.monotonic()
    try:
        return fn()
    except Exception as exc:
        return {"error": type(exc).__name__, "final": time.monotonic() - start < FAST_S}


def scopes_and_streams(m: Any) -> dict[str, Any]:
    r: dict[str, Any] = {}
    r["create_scope"] = m.create_scope("rc1")
    r["create_scope_again"] = m.create_scope("rc1")
    r["create_stream"] = m.create_stream("rc1", "fixed", 3)
    r["create_stream_again"] = m.create_stream("rc1", "fixed", 3)
    r["create_tagged"] = m.create_stream_with_policy(
        "rc1",
        "tagged",
        pc.StreamScalingPolicy.fixed_scaling_policy(2),
        pc.StreamRetentionPolicy.none(),
        ["red", "blue"],
    )
    r["list_scope"] = m.list_scope()
    r["list_stream"] = sorted(m.list_stream("rc1"))
    r["tags_untagged"] = m.get_stream_tags("rc1", "fixed")
    r["tags"] = m.get_stream_tags("rc1", "tagged")
    r["update"] = m.update_stream_with_policy(
        "rc1",
        "tagged",
        pc.StreamScalingPolicy.fixed_scaling_policy(2),
        pc.StreamRetentionPolicy.by_size(1 << 20),
        ["green"],
    )
    r["tags_updated"] = m.get_stream_tags("rc1", "tagged")
    m.update_stream_with_policy(
        "rc1",
        "tagged",
        pc.StreamScalingPolicy.fixed_scaling_policy(2),
        pc.StreamRetentionPolicy.none(),
        [],
    )
    r["tags_cleared"] = m.get_stream_tags("rc1", "tagged")
    r["delete_scope_not_empty"] = attempt(lambda: m.delete_scope("rc1"))
    r["delete_unsealed"] = attempt(lambda: m.delete_stream("rc1", "fixed"))
    r["seal"] = m.seal_stream("rc1", "fixed")
    r["seal_again"] = m.seal_stream("rc1", "fixed")
    r["delete"] = m.delete_stream("rc1", "fixed")
    r["delete_again"] = m.delete_stream("rc1", "fixed")
    r["seal_tagged"] = m.seal_stream("rc1", "tagged")
    r["delete_tagged"] = m.delete_stream("rc1", "tagged")
    r["list_stream_after"] = m.list_stream("rc1")
    r["delete_scope"] = m.delete_scope("rc1")
    r["delete_scope_again"] = m.delete_scope("rc1")
    r["list_scope_after"] = m.list_scope()
    return r


def policies(m: Any) -> dict[str, Any]:
    m.create_scope("rc2")
    return {
        "by_event_rate": m.create_stream_with_policy(
            "rc2",
            "events",
            pc.StreamScalingPolicy.auto_scaling_policy_by_event_rate(100, 2, 3),
            pc.StreamRetentionPolicy.by_time(60_000),
            ["auto"],
        ),
        "by_data_rate": m.create_stream_with_policy(
            "rc2",
            "bytes",
            pc.StreamScalingPolicy.auto_scaling_policy_by_data_rate(1024, 2, 2),
            pc.StreamRetentionPolicy.by_size(4096),
            None,
        ),
        "tags_events": m.get_stream_tags("rc2", "events"),
        "tags_bytes": m.get_stream_tags("rc2", "bytes"),
        "list_stream": sorted(m.list_stream("rc2")),
    }


def bad_requests(m: Any) -> dict[str, Any]:
    m.create_scope("rc3")
    return {
        "invalid_scope": attempt(lambda: m.create_scope("bad/name")),
        "invalid_stream": attempt(lambda: m.create_stream("rc3", "bad_name", 1)),
        "stream_in_missing_scope": attempt(lambda: m.create_stream("nope", "st", 1)),
        "seal_missing": attempt(lambda: m.seal_stream("rc3", "nope")),
        "tags_missing": attempt(lambda: m.get_stream_tags("rc3", "nope")),
        "delete_missing_scope": m.delete_scope("nope"),
        "list_missing_scope": m.list_stream("nope"),
    }


def transactions(m: Any) -> dict[str, Any]:
    m.create_scope("rc4")
    m.create_stream("rc4", "tx", 2)
    writer = m.create_transaction_writer("rc4", "tx", 7)
    first = writer.begin_txn()
    r: dict[str, Any] = {"first_id": first.get_txn_id(), "first_open": first.is_open()}
    r["get_txn_open"] = writer.get_txn(first.get_txn_id()).is_open()
    first.abort()
    r["first_open_after_abort"] = first.is_open()
    second = writer.begin_txn()
    r["second_id"] = second.get_txn_id()
    second.commit()
    r["second_open_after_commit"] = second.is_open()
    m.seal_stream("rc4", "tx")
    r["begin_on_sealed"] = attempt(writer.begin_txn)
    return r


def many_scopes(m: Any) -> dict[str, Any]:
    names = [f"many-{i:04d}" for i in range(1100)]  # more than one listScopes page
    created = [m.create_scope(n) for n in names]
    listed = m.list_scope()
    ours = [n for n in listed if n.startswith("many-")]
    return {
        "created": all(created),
        "listed": sorted(ours) == names,
        "no_duplicates": len(listed) == len(set(listed)),
    }


def restart_write(m: Any) -> dict[str, Any]:
    return {
        "scope": m.create_scope("durable"),
        "stream": m.create_stream_with_policy(
            "durable",
            "st",
            pc.StreamScalingPolicy.fixed_scaling_policy(2),
            pc.StreamRetentionPolicy.none(),
            ["kept"],
        ),
        "sealed": m.create_stream("durable", "sealed", 1) and m.seal_stream("durable", "sealed"),
    }


def restart_read(m: Any) -> dict[str, Any]:
    return {
        "scopes": m.list_scope(),
        "streams": sorted(m.list_stream("durable")),
        "tags": m.get_stream_tags("durable", "st"),
        "create_again": m.create_stream("durable", "st", 2),
        "delete_sealed": m.delete_stream("durable", "sealed"),
    }


SCENARIOS: dict[str, Callable[[Any], dict[str, Any]]] = {
    f.__name__: f
    for f in (
        scopes_and_streams,
        policies,
        bad_requests,
        transactions,
        many_scopes,
        restart_write,
        restart_read,
    )
}


# --------------------------------------------------------------------------- with the segment store

READ_DEADLINE_S = 30.0


def _controller_call(uri: str, name: str, request: Any) -> Any:
    """One controller RPC through our own stubs (for what the Python API lacks)."""
    import grpc

    from headrace.controller.rpc import METHODS

    method = METHODS[name]
    with grpc.insecure_channel(uri.removeprefix("tcp://")) as channel:
        call = channel.unary_unary(
            method.path,
            request_serializer=method.request.SerializeToString,
            response_deserializer=method.response.FromString,
        )
        return call(request, timeout=10)


def _read_all(m: Any, scope: str, stream: str, group: str, count: int) -> list[str]:
    """Read with a one-reader group until ``count`` events or the deadline."""
    rg = m.create_reader_group(group, scope, stream)
    reader = rg.create_reader("r1")

    async def read() -> list[str]:
        got: list[str] = []
        deadline = time.monotonic() + READ_DEADLINE_S
        while len(got) < count and time.monotonic() < deadline:
            got.extend(event.decode() for event in await read_slice(reader))
        return got

    # No reader_offline(): the process leaves with os._exit.
    return run(read())


def events_and_transactions(m: Any) -> dict[str, Any]:
    m.create_scope("e2e1")
    m.create_stream("e2e1", "st", 2)
    writer = m.create_writer("e2e1", "st")
    for i in range(10):
        writer.write_event(f"ev{i}", routing_key=f"k{i % 3}")
    writer.flush()
    txn_writer = m.create_transaction_writer("e2e1", "st", 11)
    committed = txn_writer.begin_txn()
    committed.write_event("tx1", routing_key="k0")
    committed.write_event("tx2", routing_key="k0")
    committed.commit()
    aborted = txn_writer.begin_txn()
    aborted.write_event("never", routing_key="k1")
    aborted.abort()
    writer.write_event("after", routing_key="k0")
    writer.flush()
    return {"events": _read_all(m, "e2e1", "st", "rg1", 13)}


def scale_while_writing(m: Any, uri: str) -> dict[str, Any]:
    from headrace.protocols.pravega import controller_pb2 as pb

    m.create_scope("e2e2")
    m.create_stream("e2e2", "st", 1)
    writer = m.create_writer("e2e2", "st")
    for i in range(5):
        writer.write_event(f"a{i}", routing_key="a")
        writer.write_event(f"b{i}", routing_key="b")
    writer.flush()
    reply = _controller_call(
        uri,
        "scale",
        pb.ScaleRequest(
            streamInfo=pb.StreamInfo(scope="e2e2", stream="st"),
            sealedSegments=[0],
            newKeyRanges=[
                pb.ScaleRequest.KeyRangeEntry(start=0.0, end=0.5),
                pb.ScaleRequest.KeyRangeEntry(start=0.5, end=1.0),
            ],
        ),
    )
    for i in range(5, 10):
        writer.write_event(f"a{i}", routing_key="a")
        writer.write_event(f"b{i}", routing_key="b")
    writer.flush()
    return {
        "scale_status": reply.status,
        "new_segments": len(reply.segments),
        "events": _read_all(m, "e2e2", "st", "rg2", 20),
    }


def byte_stream_head(m: Any) -> dict[str, Any]:
    m.create_scope("e2e3")
    m.create_stream("e2e3", "bs", 1)
    first = m.create_byte_stream("e2e3", "bs")
    first.write(b"hello world, this is a byte stream")
    first.flush()
    tail = first.current_tail_offset()
    first.truncate(6)
    second = m.create_byte_stream("e2e3", "bs")  # getSegments must give one segment
    buf = bytearray(5)
    second.seek(6, 0)
    n = second.readinto(buf)
    return {"tail": tail, "head": second.current_head_offset(), "read": bytes(buf[:n]).decode()}


SEGMENT_STORE_SCENARIOS: dict[str, Callable[..., dict[str, Any]]] = {
    "events_and_transactions": events_and_transactions,
    "scale_while_writing": scale_while_writing,
    "byte_stream_head": byte_stream_head,
}


def _head(uri: str, scope: str, stream: str) -> list[tuple[int, int]]:
    from headrace.protocols.pravega import controller_pb2 as pb

    reply = _controller_call(
        uri,
        "getSegments",
        pb.GetSegmentsRequest(streamInfo=pb.StreamInfo(scope=scope, stream=stream)),
    )
    return [(s.segmentId.segmentId, s.offset) for s in reply.segments]


def retention_by_size(m: Any, uri: str) -> dict[str, Any]:
    """A reader that keeps up goes on across truncations; a new one starts at the head."""
    m.create_scope("ret")
    m.create_stream_with_policy(
        "ret",
        "st",
        pc.StreamScalingPolicy.fixed_scaling_policy(1),
        pc.StreamRetentionPolicy.by_size(2000),
        None,
    )
    writer = m.create_writer("ret", "st")
    live = m.create_reader_group("live", "ret", "st").create_reader("r1")
    written: list[str] = []
    seen: list[str] = []

    async def catch_up() -> None:
        deadline = time.monotonic() + READ_DEADLINE_S
        while len(seen) < len(written) and time.monotonic() < deadline:
            seen.extend(event.decode() for event in await read_slice(live))

    def write(count: int) -> None:
        for _ in range(count):
            event = f"ev{len(written):05d}".ljust(99, "x")  # 99 bytes + 8 of framing
            writer.write_event(event)
            written.append(event)
        writer.flush()

    truncations = 0
    deadline = time.monotonic() + READ_DEADLINE_S
    while truncations < 2 and time.monotonic() < deadline:
        head_before = _head(uri, "ret", "st")
        write(10)
        run(catch_up())
        if _head(uri, "ret", "st") != head_before:
            truncations += 1
    write(10)
    run(catch_up())
    [(_, head_offset)] = _head(uri, "ret", "st")
    late = _read_all(m, "ret", "st", "late", len(written) - head_offset // 107)
    return {
        "truncations": truncations,
        "head_offset": head_offset,
        "written": len(written),
        "live_complete": seen == written,
        "late_first": late[0][:7] if late else None,
        "late_is_tail": late == written[head_offset // 107 :],
    }


SEGMENT_STORE_SCENARIOS["retention_by_size"] = retention_by_size


def _current_segments(uri: str, scope: str, stream: str) -> int:
    from headrace.protocols.pravega import controller_pb2 as pb

    reply = _controller_call(uri, "getCurrentSegments", pb.StreamInfo(scope=scope, stream=stream))
    return len(reply.segmentRanges)


def auto_scale(m: Any, uri: str) -> dict[str, Any]:
    """A stream auto-scaling by event rate (target 10 events/s) is written to
    well above the target until the controller splits its segment; events of
    each key are then read back exactly once and in order."""
    m.create_scope("e2e5")
    m.create_stream_with_policy(
        "e2e5",
        "st",
        pc.StreamScalingPolicy.auto_scaling_policy_by_event_rate(10, 2, 1),
        pc.StreamRetentionPolicy.none(),
        None,
    )
    writer = m.create_writer("e2e5", "st")
    keys = ["a", "b", "c", "d"]
    written: dict[str, int] = dict.fromkeys(keys, 0)

    def write_round() -> None:
        for key in keys:
            for _ in range(5):
                writer.write_event(f"{key}{written[key]}", routing_key=key)
                written[key] += 1
        writer.flush()

    before = _current_segments(uri, "e2e5", "st")
    after = before
    deadline = time.monotonic() + READ_DEADLINE_S
    while after == before and time.monotonic() < deadline:
        write_round()
        after = _current_segments(uri, "e2e5", "st")
    write_round()  # the writer goes on across the scale, into the successors
    total = sum(written.values())
    return {
        "before": before,
        "after": after,
        "written": written,
        "events": _read_all(m, "e2e5", "st", "rg5", total),
    }


SEGMENT_STORE_SCENARIOS["auto_scale"] = auto_scale


if __name__ == "__main__":
    scenario, uri = sys.argv[1], sys.argv[2]
    manager = pc.StreamManager(uri)
    if scenario in ("scale_while_writing", "retention_by_size", "auto_scale"):
        result = SEGMENT_STORE_SCENARIOS[scenario](manager, uri)
    elif scenario in SEGMENT_STORE_SCENARIOS:
        result = SEGMENT_STORE_SCENARIOS[scenario](manager)
    else:
        result = SCENARIOS[scenario](manager)
    print(json.dumps(result), flush=True)
    # Leave without interpreter finalisation: the client's background (tokio)
    # threads still run, and tearing Python down under them now and then ends
    # in a segfault or a panic after the scenario has finished and reported.
    os._exit(0)
