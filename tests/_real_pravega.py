"""The real Rust ``pravega`` client (``pravega_client``, pravega 0.3.8) against a real server.

**Why a child process.** The client's blocking calls hold the GIL while they
wait for its tokio threads, and against a dead or misbehaving server they
retry for about a minute. So the client never runs in the test process: each
scenario runs as ``python -m tests._real_pravega SCENARIO URI ARGS...`` under
a hard timeout, prints one JSON object as its last line of stdout, and leaves
with ``os._exit`` right after (a normal interpreter exit under the client's
live threads sometimes crashes (SIGSEGV) or panics after the work was
printed; the JSON counts, not the exit code). A scenario that raises prints
``E <error>`` instead (and the traceback to stderr) and exits with code 1.

**Parent side.** ``run_scenario`` runs one scenario and returns its JSON
object (``run_scenario_with_stderr`` also the child's stderr, for tests that
look for a client panic); ``start_scenario`` starts one whose stdout the test
reads as it goes (the fault suite's writers, a writer the test kills the
server under). Both first check that the controller accepts a connection, so
a dead server fails at once with a clear message instead of after the
client's minute of retries. The child gets ``tests._server.server_env``: this
tree's ``headrace`` (some scenarios call the controller through our stubs),
no ``HEADRACE_*`` variable. It imports nothing it does not use (the parent's
helpers import ``tests._server`` when called): a writer that starts late
misses the short gaps between the fault suite's kills.

**Child side.** ``SCENARIOS`` maps names to functions ``(uri, *args) -> dict``;
``STREAMING`` those that print progress lines (``A <n>``: every event below
``n`` is acknowledged) until their stdin reaches end of file. Reads go through
``read_slice`` under ``run_reads``: the client's only read call,
``get_segment_slice_async``, completes the Python future from a worker thread
through the event loop's ``call_soon_threadsafe``, which queues the callback,
writes a byte to the loop's self-pipe with the GIL released, and needs the GIL
back to return. If the script goes on into a blocking call (which holds the
GIL) first, the worker waits for the GIL inside one of the client's tasks
until that call returns, and the call may be waiting for a task stuck behind
that worker: a stall until the client's 30 s request timeout, and under a
short token TTL a retry with an expired token the client never refreshes. So
the loop counts the threads inside ``call_soon_threadsafe``, and ``read_slice``
waits, GIL released and bounded, until none is left before it releases the
slice and returns to code that may block.

Readers are never put offline at the end: the process exits at once instead.
Events of the bulk scenarios are text ``<key>:<sequence>`` so the parent can
check exactly-once delivery and per-key order without shipping every payload
back.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

ROOT: Final = Path(__file__).resolve().parent.parent
SCENARIO_TIMEOUT_S: Final = 240.0
"""Hard bound on one scenario: a healthy one takes seconds, reads give up after
``READ_DEADLINE_S``, and a retried failure takes about a minute per call."""
CONNECT_TIMEOUT_S: Final = 5.0
"""Bound on the check that the controller accepts a connection."""
READ_DEADLINE_S: Final = 120.0
"""Longest a scenario keeps reading before it reports what it has."""
IDLE_SLICES: Final = 3
"""Empty slices in a row (each waits up to 1 s) after which a drained reader
group is taken to hold nothing more."""
SETTLE_TIMEOUT_S: Final = 30.0
"""Bound on waiting for the client's worker threads to leave
``call_soon_threadsafe`` (they need only the GIL to do so)."""
INFLIGHT: Final = 1000
"""``max_inflight_events`` for bulk writers: the writer batches while acks
are outstanding instead of waiting for each one."""
FAST_S: Final = 5.0
"""A final error arrives at once; a retried one takes about 61 s."""


# --------------------------------------------------------------------------- parent side


def command(scenario: str, uri: str, *args: str) -> list[str]:
    """The child's command line."""
    return [sys.executable, "-m", "tests._real_pravega", scenario, uri, *args]


def check_listening(uri: str) -> None:
    """AssertionError unless the controller at ``uri`` accepts a connection
    (the client would otherwise retry for about a minute)."""
    host, _, port = uri.partition("://")[2].rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise AssertionError(f"no controller accepts connections at {uri}: {exc}") from None


def result_of(scenario: str, stdout: str, stderr: str, returncode: int | None) -> dict[str, Any]:
    """The JSON object on the last line of a scenario's stdout (the client may
    log to stdout before it); AssertionError quoting the child's error and
    stderr if there is none."""
    from tests._server import STDERR_TAIL_CHARS

    lines = stdout.strip().splitlines()
    tail = stderr[-STDERR_TAIL_CHARS:]
    if lines and lines[-1].startswith("E "):
        raise AssertionError(f"{scenario} failed: {lines[-1][2:]}\n{tail}")
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise AssertionError(
            f"{scenario} printed no result (exit code {returncode}):\n{tail}"
        ) from None
    return result


def run_scenario_with_stderr(
    scenario: str,
    uri: str,
    *args: str,
    timeout_s: float = SCENARIO_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[dict[str, Any], str]:
    """Run ``scenario`` against the controller at ``uri`` in a child process
    killed after ``timeout_s``; its JSON object and its stderr. ``env``: more
    environment variables (the client's credentials, its trusted CAs)."""
    from tests._server import server_env

    check_listening(uri)
    done = subprocess.run(
        command(scenario, uri, *args),
        capture_output=True,
        timeout=timeout_s,
        text=True,
        env=server_env(env),
        cwd=ROOT if cwd is None else cwd,
    )
    return result_of(scenario, done.stdout, done.stderr, done.returncode), done.stderr


def run_scenario(
    scenario: str,
    uri: str,
    *args: str,
    timeout_s: float = SCENARIO_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> dict[str, Any]:
    """``run_scenario_with_stderr`` without the stderr."""
    return run_scenario_with_stderr(scenario, uri, *args, timeout_s=timeout_s, env=env, cwd=cwd)[0]


def start_scenario(
    scenario: str, uri: str, *args: str, check_server: bool = True, **popen: Any
) -> subprocess.Popen[Any]:
    """Start ``scenario`` in a child process (``popen``: ``subprocess.Popen``
    options; the caller bounds its waits on it). ``check_server=False`` for a
    child started while the server may be down: it waits for it."""
    from tests._server import server_env

    if check_server:
        check_listening(uri)
    env = server_env(popen.pop("env", None))
    return subprocess.Popen(command(scenario, uri, *args), env=env, cwd=ROOT, **popen)


# --------------------------------------------------------------------------- child side: reads

pc: Any = None
"""The ``pravega_client`` module, imported by ``main`` in the child only."""

T = TypeVar("T")


class SettlingLoop(asyncio.SelectorEventLoop):
    """An event loop that knows when no thread is inside ``call_soon_threadsafe``."""

    def __init__(self) -> None:
        super().__init__()
        self._inside = 0
        self._changed = threading.Condition()

    def call_soon_threadsafe(  # type: ignore[override]
        self, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.Handle:
        with self._changed:
            self._inside += 1
        try:
            return super().call_soon_threadsafe(callback, *args, context=context)
        finally:
            with self._changed:
                self._inside -= 1
                self._changed.notify_all()

    def settle(self, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
        """Wait, GIL released, until no other thread is inside ``call_soon_threadsafe``.

        Raises:
            TimeoutError: a thread stayed inside for ``timeout_s``.
        """
        with self._changed:
            if not self._changed.wait_for(lambda: self._inside == 0, timeout_s):
                raise TimeoutError(f"a client thread stayed in call_soon_threadsafe {timeout_s} s")


def run_reads(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a ``SettlingLoop``, settled before the loop closes."""
    with asyncio.Runner(loop_factory=SettlingLoop) as runner:
        result = runner.run(coro)
        loop = runner.get_loop()
        assert isinstance(loop, SettlingLoop)
        loop.settle()
        return result


async def read_slice(reader: Any) -> list[bytes]:
    """The events of the reader's next segment slice (empty after the client's
    wait of about a second), the slice released; for use under ``run_reads``."""
    slice_ = await reader.get_segment_slice_async()
    loop = asyncio.get_running_loop()
    if not isinstance(loop, SettlingLoop):
        raise TypeError("read_slice must run under run_reads")
    loop.settle()
    events = [bytes(event.data()) for event in slice_]
    reader.release_segment(slice_)
    return events


async def _drain(
    readers: list[Any],
    want: int | None,
    *,
    extra: bool = False,
    counts: list[int] | None = None,
) -> list[bytes]:
    """Read from ``readers`` in turn (one process must not run two readers of
    a group concurrently) until ``want`` events arrived, or, with ``want``
    None, until every reader came back empty ``IDLE_SLICES`` times in a row.
    With ``extra``, go on after ``want`` until every reader came back empty
    once, so that events beyond ``want`` (duplicates) would be seen too.
    ``counts``, if given, receives the number of events each reader read."""
    got: list[bytes] = []
    per_reader = [0] * len(readers)
    deadline = time.monotonic() + READ_DEADLINE_S
    idle = 0
    while time.monotonic() < deadline:
        if want is not None and len(got) >= want and (not extra or idle >= len(readers)):
            break
        if want is None and idle >= IDLE_SLICES * len(readers):
            break
        for i, reader in enumerate(readers):
            events = await read_slice(reader)
            got += events
            per_reader[i] += len(events)
            idle = 0 if events else idle + 1
    if counts is not None:
        counts[:] = per_reader
    return got


def _read_group(m: Any, scope: str, stream: str, group: str, count: int) -> list[str]:
    """Read with a new one-reader group until ``count`` events (or the
    deadline); payloads as latin-1 strings."""
    reader = m.create_reader_group(group, scope, stream).create_reader("r1")
    return [event.decode("latin-1") for event in run_reads(_drain([reader], count))]


# --------------------------------------------------------------------------- child side: helpers


def _manager(uri: str, *, auth: bool = False) -> Any:
    return pc.StreamManager(uri, auth, False)


def _attempt(fn: Callable[[], Any]) -> Any:
    """What ``fn`` returned, or ``{"error": <type>, "final": <failed at once>}``."""
    start = time.monotonic()
    try:
        return fn()
    except Exception as exc:
        return {"error": type(exc).__name__, "final": time.monotonic() - start < FAST_S}


def _outcome(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except Exception as exc:
        return type(exc).__name__
    return "ok"


def _sequence_check(events: list[bytes]) -> dict[str, Any]:
    """Exactly-once and per-key order of ``<key>:<n>`` events, in read order."""
    last: dict[str, int] = {}
    out_of_order = 0
    seen: set[bytes] = set()
    duplicates = 0
    for raw in events:
        if raw in seen:
            duplicates += 1
        seen.add(raw)
        key, _, n = raw.decode().partition(":")
        if int(n) <= last.get(key, -1):
            out_of_order += 1
        last[key] = int(n)
    return {
        "read": len(events),
        "distinct": len(seen),
        "duplicates": duplicates,
        "out_of_order": out_of_order,
        "keys": len(last),
    }


def _write_keyed(m: Any, scope: str, stream: str, count: int, keys: int, first: int = 0) -> float:
    writer = m.create_writer(scope, stream, INFLIGHT)
    start = time.monotonic()
    for i in range(first, first + count):
        key = f"k{i % keys:03d}"
        writer.write_event(f"{key}:{i}", routing_key=key)
    writer.flush()
    return time.monotonic() - start


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


def _current_segments(uri: str, scope: str, stream: str) -> int:
    from headrace.protocols.pravega import controller_pb2 as pb

    reply = _controller_call(uri, "getCurrentSegments", pb.StreamInfo(scope=scope, stream=stream))
    return len(reply.segmentRanges)


# --------------------------------------------------------------------------- the controller's API


def scopes_and_streams(uri: str) -> dict[str, Any]:
    m = _manager(uri)
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
    r["delete_scope_not_empty"] = _attempt(lambda: m.delete_scope("rc1"))
    r["delete_unsealed"] = _attempt(lambda: m.delete_stream("rc1", "fixed"))
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


def policies(uri: str) -> dict[str, Any]:
    m = _manager(uri)
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


def bad_requests(uri: str) -> dict[str, Any]:
    m = _manager(uri)
    m.create_scope("rc3")
    return {
        "invalid_scope": _attempt(lambda: m.create_scope("bad/name")),
        "invalid_stream": _attempt(lambda: m.create_stream("rc3", "bad_name", 1)),
        "stream_in_missing_scope": _attempt(lambda: m.create_stream("nope", "st", 1)),
        "seal_missing": _attempt(lambda: m.seal_stream("rc3", "nope")),
        "tags_missing": _attempt(lambda: m.get_stream_tags("rc3", "nope")),
        "delete_missing_scope": m.delete_scope("nope"),
        "list_missing_scope": m.list_stream("nope"),
    }


def transaction_states(uri: str) -> dict[str, Any]:
    """Transactions begun, aborted and committed without events; none on a sealed stream."""
    m = _manager(uri)
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
    r["begin_on_sealed"] = _attempt(writer.begin_txn)
    return r


def many_scopes(uri: str) -> dict[str, Any]:
    m = _manager(uri)
    names = [f"many-{i:04d}" for i in range(1100)]  # more than one listScopes page
    created = [m.create_scope(n) for n in names]
    listed = m.list_scope()
    ours = [n for n in listed if n.startswith("many-")]
    return {
        "created": all(created),
        "listed": sorted(ours) == names,
        "no_duplicates": len(listed) == len(set(listed)),
    }


def restart_write(uri: str) -> dict[str, Any]:
    m = _manager(uri)
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


def restart_read(uri: str) -> dict[str, Any]:
    m = _manager(uri)
    return {
        "scopes": m.list_scope(),
        "streams": sorted(m.list_stream("durable")),
        "tags": m.get_stream_tags("durable", "st"),
        "create_again": m.create_stream("durable", "st", 2),
        "delete_sealed": m.delete_stream("durable", "sealed"),
    }


# --------------------------------------------------------------------------- controller decisions


def events_and_transactions(uri: str) -> dict[str, Any]:
    """Events on two segments, a committed and an aborted transaction between them."""
    m = _manager(uri)
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
    return {"events": _read_group(m, "e2e1", "st", "rg1", 13)}


def scale_while_writing(uri: str) -> dict[str, Any]:
    from headrace.protocols.pravega import controller_pb2 as pb

    m = _manager(uri)
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
        "events": _read_group(m, "e2e2", "st", "rg2", 20),
    }


def rolling_transaction(uri: str) -> dict[str, Any]:
    """A transaction stays open across a scale and is committed afterwards."""
    from headrace.protocols.pravega import controller_pb2 as pb

    m = _manager(uri)
    m.create_scope("e2e5")
    m.create_stream("e2e5", "st", 1)
    writer = m.create_writer("e2e5", "st")
    writer.write_event("before", routing_key="k")
    writer.flush()
    txn_writer = m.create_transaction_writer("e2e5", "st", 12)  # holds the lease pinger
    txn = txn_writer.begin_txn()
    txn.write_event("tx1", routing_key="k")
    txn.write_event("tx2", routing_key="k")
    reply = _controller_call(
        uri,
        "scale",
        pb.ScaleRequest(
            streamInfo=pb.StreamInfo(scope="e2e5", stream="st"),
            sealedSegments=[0],
            newKeyRanges=[
                pb.ScaleRequest.KeyRangeEntry(start=0.0, end=0.5),
                pb.ScaleRequest.KeyRangeEntry(start=0.5, end=1.0),
            ],
        ),
    )
    writer.write_event("scaled", routing_key="k")
    writer.flush()
    txn.commit()
    writer.write_event("after", routing_key="k")
    writer.flush()
    return {
        "scale_status": reply.status,
        "segments": _current_segments(uri, "e2e5", "st"),
        "events": _read_group(m, "e2e5", "st", "rg5", 5),
    }


def byte_stream_head(uri: str) -> dict[str, Any]:
    m = _manager(uri)
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


def auto_scale(uri: str) -> dict[str, Any]:
    """A stream auto-scaling by event rate (target 10 events/s) is written to
    well above the target until the controller splits its segment; events of
    each key are then read back exactly once and in order."""
    m = _manager(uri)
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
        "events": _read_group(m, "e2e5", "st", "rg5", total),
    }


def retention_by_size(uri: str) -> dict[str, Any]:
    """Size retention truncates old data at event boundaries while a reader
    that keeps up reads on, and a reader group created later starts at the head.

    Events are 100 bytes framed as 108: ``ev<5 digits>`` padded with dots.
    The policy keeps 2000 bytes; rounds of 30 events are written until the
    head has moved twice (polled through a byte stream on the same stream)."""
    m = _manager(uri)
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
    probe = m.create_byte_stream("ret", "st")
    heads: list[int] = []
    live_events: list[bytes] = []
    written = 0
    deadline = time.monotonic() + READ_DEADLINE_S
    while len(heads) < 2 and time.monotonic() < deadline:
        for _ in range(30):
            writer.write_event(f"ev{written:05d}".ljust(100, "."))
            written += 1
        writer.flush()
        live_events += run_reads(_drain([live], written - len(live_events)))
        head = probe.current_head_offset()
        wait_until = time.monotonic() + 1.0
        while head == (heads[-1] if heads else 0) and time.monotonic() < wait_until:
            time.sleep(0.05)  # polling the head under a deadline, not synchronisation
            head = probe.current_head_offset()
        if head != (heads[-1] if heads else 0):
            heads.append(head)
    late = m.create_reader_group("late", "ret", "st").create_reader("r1")
    late_events = run_reads(_drain([late], None))
    expected = [f"ev{i:05d}".ljust(100, ".").encode() for i in range(written)]
    return {
        "written": written,
        "heads": heads,
        "tail": probe.current_tail_offset(),
        "live_complete": live_events == expected,
        "late_first": late_events[0][:7].decode() if late_events else None,
        "late_is_suffix": late_events == expected[len(expected) - len(late_events) :],
        "late_count": len(late_events),
    }


# --------------------------------------------------------------------------- events, end to end


def many_events(uri: str, count: str, scope: str = "many") -> dict[str, Any]:
    """``count`` events, 100 keys, 4 segments; a group of 2 readers reads them.

    The first reader of a group takes every segment; the group hands half of
    them to the second reader at its next rebalance (about 10 s later). So
    events trickle in (8 per round) while both readers poll, until both have
    read some; then the rest is written in bulk and read by both."""
    total = int(count)
    m = _manager(uri)
    m.create_scope(scope)
    m.create_stream(scope, "st", 4)
    rg = m.create_reader_group("rg", scope, "st")
    readers = [rg.create_reader("r1"), rg.create_reader("r2")]
    writer = m.create_writer(scope, "st", INFLIGHT)

    def write(first: int, n: int) -> None:
        for i in range(first, first + n):
            key = f"k{i % 100:03d}"
            writer.write_event(f"{key}:{i}", routing_key=key)
        writer.flush()

    written = 0

    async def share() -> tuple[list[bytes], list[int]]:
        nonlocal written
        got: list[bytes] = []
        per_reader = [0] * len(readers)
        deadline = time.monotonic() + READ_DEADLINE_S
        while min(per_reader) == 0 and written < total and time.monotonic() < deadline:
            n = min(8, total - written)
            write(written, n)
            written += n
            for i, reader in enumerate(readers):
                events = await read_slice(reader)
                got += events
                per_reader[i] += len(events)
        return got, per_reader

    shared, first_counts = run_reads(share())
    start = time.monotonic()
    write(written, total - written)
    write_s = time.monotonic() - start
    start = time.monotonic()
    counts: list[int] = []
    rest = run_reads(_drain(readers, total - len(shared), extra=True, counts=counts))
    read_s = time.monotonic() - start
    per_reader = [a + b for a, b in zip(first_counts, counts, strict=True)]
    return {
        **_sequence_check(shared + rest),
        "per_reader": per_reader,
        "bulk_per_reader": counts,
        "write_s": write_s,
        "read_s": read_s,
    }


def write_only(uri: str, count: str, scope: str) -> dict[str, Any]:
    """Write and flush; every event returned here was acknowledged."""
    m = _manager(uri)
    m.create_scope(scope)
    m.create_stream(scope, "st", 4)
    write_s = _write_keyed(m, scope, "st", int(count), 100)
    return {"acknowledged": int(count), "write_s": write_s}


def write_through_restart(uri: str, count: str, scope: str, segments: str = "4") -> dict[str, Any]:
    """Write while the parent kills and restarts the server (or moves the
    segments' containers): prints ``progress <n>`` lines so the parent knows
    when to strike; the writer reconnects, SetupAppend tells it what was
    stored, and it resends the rest."""
    m = _manager(uri)
    m.create_scope(scope)
    m.create_stream(scope, "st", int(segments))
    writer = m.create_writer(scope, "st", INFLIGHT)
    start = time.monotonic()
    for i in range(int(count)):
        key = f"k{i % 100:03d}"
        writer.write_event(f"{key}:{i}", routing_key=key)
        if i % 1000 == 999:
            print(f"progress {i + 1}", flush=True)
    writer.flush()
    return {"acknowledged": int(count), "write_s": time.monotonic() - start}


def write_more(uri: str, first: str, count: str, scope: str) -> dict[str, Any]:
    """A new writer appends to the existing stream."""
    m = _manager(uri)
    _write_keyed(m, scope, "st", int(count), 100, first=int(first))
    return {"acknowledged": int(count)}


def read_all(uri: str, scope: str, count: str) -> dict[str, Any]:
    """A new reader group reads everything the stream holds: ``count`` events
    are expected, and reading goes on until the readers are idle, so that any
    event beyond them shows."""
    m = _manager(uri)
    rg = m.create_reader_group(f"rg{int(time.time() * 1000)}", scope, "st")
    readers = [rg.create_reader("r1"), rg.create_reader("r2")]
    events = run_reads(_drain(readers, int(count), extra=True))
    return {**_sequence_check(events), "max": max(int(e.split(b":")[1]) for e in events)}


def round_trip(uri: str, scope: str, count: str, segments: str) -> dict[str, Any]:
    """``count`` events over ``segments`` segments (100 keys), then a group of two
    readers reads everything back."""
    m = _manager(uri)
    m.create_scope(scope)
    m.create_stream(scope, "st", int(segments))
    write_s = _write_keyed(m, scope, "st", int(count), 100)
    rg = m.create_reader_group("rg", scope, "st")
    readers = [rg.create_reader("r1"), rg.create_reader("r2")]
    events = run_reads(_drain(readers, int(count), extra=True))
    return {**_sequence_check(events), "write_s": write_s}


def write_keyed(uri: str, scope: str, stream: str, segments: str, keys_json: str) -> dict[str, Any]:
    """Create ``scope/stream`` with ``segments`` segments (if needed); write each key as an
    event whose payload is the key itself, routed by that key."""
    m = _manager(uri)
    m.create_scope(scope)
    m.create_stream(scope, stream, int(segments))
    writer = m.create_writer(scope, stream)
    keys: list[str] = json.loads(keys_json)
    for key in keys:
        writer.write_event_bytes(key.encode("utf-8"), routing_key=key)
    writer.flush()
    return {"written": len(keys)}


def read_group(uri: str, scope: str, stream: str, group: str, count: str) -> dict[str, Any]:
    """Read ``count`` events with a new one-reader group; payloads as latin-1 strings."""
    return {"events": _read_group(_manager(uri), scope, stream, group, int(count))}


def from_tail(uri: str) -> dict[str, Any]:
    """A reader group created at the tail sees only later events."""
    m = _manager(uri)
    m.create_scope("tail")
    m.create_stream("tail", "st", 2)
    writer = m.create_writer("tail", "st")
    for i in range(20):
        writer.write_event(f"before:{i}", routing_key=f"k{i % 4}")
    writer.flush()
    rg = m.create_reader_group("rg", "tail", "st", True)
    reader = rg.create_reader("r1")
    for i in range(20):
        writer.write_event(f"after:{i}", routing_key=f"k{i % 4}")
    writer.flush()
    events = run_reads(_drain([reader], 20, extra=True))
    return {"events": sorted(e.decode() for e in events)}


def sizes(uri: str) -> dict[str, Any]:
    """Events of 1 byte, 1 MiB and 9 MiB (the transient-segment path) round-trip."""
    m = _manager(uri)
    m.create_scope("sizes")
    m.create_stream("sizes", "st", 1)
    writer = m.create_writer("sizes", "st")
    payloads = [b"x", bytes(range(256)) * 4096, bytes(reversed(range(256))) * (9 * 4096)]
    for payload in payloads:
        writer.write_event_bytes(payload)
    writer.write_event_bytes(b"last")
    writer.flush()
    rg = m.create_reader_group("rg", "sizes", "st")
    reader = rg.create_reader("r1")
    events = run_reads(_drain([reader], 4))
    return {
        "sent": [[len(x), hashlib.sha256(x).hexdigest()] for x in [*payloads, b"last"]],
        "read": [[len(x), hashlib.sha256(x).hexdigest()] for x in events],
    }


def byte_stream(uri: str) -> dict[str, Any]:
    """Write, flush, seek, readinto, truncate, head and tail offsets."""
    m = _manager(uri)
    m.create_scope("bytes")
    m.create_stream("bytes", "st", 1)
    bs = m.create_byte_stream("bytes", "st")
    r: dict[str, Any] = {}
    bs.write(b"hello ")
    bs.write(b"byte world")
    bs.flush()
    r["tail"] = bs.current_tail_offset()
    r["head"] = bs.current_head_offset()
    r["seek_end"] = bs.seek(0, 2)
    bs.seek(0, 0)
    buf = bytearray(16)
    r["read_all"] = bytes(buf[: bs.readinto(buf)]).decode()
    r["tell"] = bs.tell()
    bs.seek(6, 0)
    buf = bytearray(4)
    r["read_at_6"] = bytes(buf[: bs.readinto(buf)]).decode()
    bs.truncate(6)
    r["head_after_truncate"] = bs.current_head_offset()
    bs.seek(11, 0)
    buf = bytearray(16)
    r["read_after_truncate"] = bytes(buf[: bs.readinto(buf)]).decode()
    bs.write(b"!")
    bs.flush()
    r["tail_after_append"] = bs.current_tail_offset()
    # A second ByteStream starts its writes at offset 0: the conditional append fails.
    other = m.create_byte_stream("bytes", "st")
    other.write(b"clash")
    r["second_writer"] = _outcome(other.flush)
    return r


def transactions(uri: str) -> dict[str, Any]:
    """A committed transaction's events appear together; an aborted one's never."""
    m = _manager(uri)
    m.create_scope("txn")
    m.create_stream("txn", "st", 1)
    writer = m.create_writer("txn", "st")
    txw = m.create_transaction_writer("txn", "st", 42)
    for i in range(5):
        writer.write_event(f"plain:{i}")
    txn = txw.begin_txn()
    for i in range(5):
        txn.write_event(f"txn:{i}")
    for i in range(5, 10):
        writer.write_event(f"plain:{i}")
    writer.flush()
    r: dict[str, Any] = {"open_before_commit": txn.is_open()}
    txn.commit()
    r["open_after_commit"] = txn.is_open()
    aborted = txw.begin_txn()
    for i in range(3):
        aborted.write_event(f"aborted:{i}")
    aborted.abort()
    writer.write_event("plain:10")
    writer.flush()
    rg = m.create_reader_group("rg", "txn", "st")
    reader = rg.create_reader("r1")
    events = run_reads(_drain([reader], None))
    r["events"] = [e.decode() for e in events]
    return r


def abort_right_after_write(uri: str, rounds: str) -> dict[str, Any]:
    """Transactions aborted right after their first event, so the abort races
    the transaction writer's ``SetupAppend``; then a committed one, read back
    through a reader group (the parent checks this process's stderr for a
    client panic)."""
    m = _manager(uri)
    m.create_scope("race")
    m.create_stream("race", "st", 2)
    txw = m.create_transaction_writer("race", "st", 43)
    for i in range(int(rounds)):
        txn = txw.begin_txn()
        txn.write_event(f"aborted:{i}", routing_key=f"k{i}")
        txn.abort()
    txn = txw.begin_txn()
    for i in range(4):
        txn.write_event(f"kept:{i}", routing_key=f"k{i}")
    txn.commit()
    reader = m.create_reader_group("rg", "race", "st").create_reader("r1")
    events = run_reads(_drain([reader], 4))
    return {"events": sorted(e.decode() for e in events)}


def reads_between_blocking_calls(uri: str, rounds: str) -> dict[str, Any]:
    """Rounds of: write an event and flush, write one more with a new writer
    (a ``SetupAppend`` on a pooled connection), read a slice. Without
    ``read_slice``'s settling, some rounds stall for the client's 30 s
    request timeout (see the module doc); the parent checks that none does
    and that every event is read once."""
    m = _manager(uri)
    m.create_scope("mix")
    m.create_stream("mix", "st", 2)
    writer = m.create_writer("mix", "st")
    reader = m.create_reader_group("rg", "mix", "st").create_reader("r1")
    slowest = 0.0

    async def go() -> list[bytes]:
        nonlocal slowest
        got: list[bytes] = []
        for i in range(int(rounds)):
            started = time.monotonic()
            writer.write_event(f"k{i % 3}:{i}", routing_key=f"k{i % 3}")
            writer.flush()
            fresh = m.create_writer("mix", "st")
            fresh.write_event(f"new:{i}", routing_key="new")
            fresh.flush()
            got += await read_slice(reader)
            slowest = max(slowest, time.monotonic() - started)
        return got + await _drain([reader], None)

    events = run_reads(go())
    return {
        "events": len(events),
        "distinct": len(set(events)),
        "slowest_round_s": slowest,
    }


def sealed(uri: str) -> dict[str, Any]:
    """After sealing, a reader that was at the tail gets no more events (end of
    segment, no successors) and later writes fail."""
    m = _manager(uri)
    m.create_scope("seal")
    m.create_stream("seal", "st", 2)
    writer = m.create_writer("seal", "st")
    for i in range(10):
        writer.write_event(f"k{i % 4}:{i}", routing_key=f"k{i % 4}")
    writer.flush()
    reader = m.create_reader_group("rg", "seal", "st").create_reader("r1")
    events = run_reads(_drain([reader], 10))
    r: dict[str, Any] = {"before": len(events), "seal": m.seal_stream("seal", "st")}
    r["after"] = len(run_reads(_drain([reader], None)))
    r["late_write"] = _outcome(
        lambda: (writer.write_event("late", routing_key="k1"), writer.flush())
    )
    return r


# --------------------------------------------------------------------------- auth and TLS

LARGE_EVENT_BYTES: Final = 9 * 1024 * 1024
"""Over the client's 8 MiB append limit: the large-event path (pravega.md#large-events)."""


def auth_write_read(uri: str, scope: str, count: str) -> dict[str, Any]:
    """With ``auth_enabled`` (credentials in the client's environment
    variables): create scope/stream, write ``count`` events and read them back
    in a reader group, then one large event."""
    n = int(count)
    m = _manager(uri, auth=True)
    created = [m.create_scope(scope), m.create_stream(scope, "st", 2)]
    writer = m.create_writer(scope, "st")
    for i in range(n):
        writer.write_event(f"e{i}", routing_key=f"k{i % 7}")
    writer.flush()
    got = _read_group(m, scope, "st", "rg", n)
    # Over 8 MiB: CreateTransientSegment, appends to it and MergeSegments, each with the token.
    m.create_stream(scope, "big", 1)
    large = m.create_writer(scope, "big")
    large.write_event_bytes(b"L" * LARGE_EVENT_BYTES)
    large.flush()
    big = m.create_reader_group("rgbig", scope, "big").create_reader("r")
    return {
        "created": created,
        "read": sorted(got, key=lambda e: int(e[1:])),
        "large": [len(e) for e in run_reads(_drain([big], 1))],
    }


def auth_read_only(uri: str, scope: str, count: str) -> dict[str, Any]:
    """Read ``count`` events of scope/st in a new reader group, then try to
    create a stream (which a reader may not)."""
    m = _manager(uri, auth=True)
    got = _read_group(m, scope, "st", "rg2", int(count))
    started = time.monotonic()
    try:
        m.create_stream(scope, "other", 1)
        refusal = ""
    except Exception as exc:  # the binding raises ValueError with the gRPC status
        refusal = f"{type(exc).__name__}: {exc}"
    return {
        "read": len(got),
        "create_stream_refusal": refusal,
        "refused_after_s": time.monotonic() - started,
    }


def auth_outlive_token(uri: str, scope: str, wait_s: str) -> dict[str, Any]:
    """Write and read, wait ``wait_s`` (longer than the server's token TTL),
    then write with the same and a new writer and read on: the client must
    refresh its tokens by itself."""
    m = _manager(uri, auth=True)
    m.create_scope(scope)
    m.create_stream(scope, "st", 1)
    writer = m.create_writer(scope, "st")
    writer.write_event("before")
    writer.flush()
    reader = m.create_reader_group("rg", scope, "st").create_reader("r1")
    first = [e.decode() for e in run_reads(_drain([reader], 1))]
    time.sleep(float(wait_s))  # let every token the client holds expire (the point of the test)
    writer.write_event("after-same-writer")
    writer.flush()
    fresh = m.create_writer(scope, "st")
    fresh.write_event("after-new-writer")
    fresh.flush()
    return {"first": first, "later": [e.decode() for e in run_reads(_drain([reader], 2))]}


TLS_EVENTS: Final = (b"tls-0", b"tls-1", b"tls-2")


def tls_write_read(uri: str, scope: str, verify: str) -> dict[str, Any]:
    """Over TLS: ``verify`` checks the server's certificate against the CAs in
    the directory named by ``pravega_client_tls_cert_path``; ``no-verify``
    sets ``disable_cert_verification``. Creates ``SCOPE/tls``, writes three
    events and reads them back through a reader group."""
    m = pc.StreamManager(uri, False, True, verify == "no-verify")
    result: dict[str, Any] = {
        "scope_created": m.create_scope(scope),
        "stream_created": m.create_stream(scope, "tls", 1),
    }
    writer = m.create_writer(scope, "tls")
    for event in TLS_EVENTS:
        writer.write_event_bytes(event)
    writer.flush()
    result["read"] = _read_group(m, scope, "tls", "tlsgroup", len(TLS_EVENTS))
    return result


# --------------------------------------------------------------------------- the fault suite's load

BATCH: Final = 50
"""Events per flush of ``write``: each flush is one acknowledgement the parent counts."""
KEYS: Final = 8
LARGE_EVENT_SIZES: Final = (10 * 1024, 64 * 1024, 300 * 1024)
"""``write_large``: sizes cycle through these. The client sends events in
blocks, each block one store append, and a block with a 300 KiB event passes
``REF_APPEND_BYTES``, so it is written once, to the data file, and logged by
reference."""
LARGE_BATCH: Final = 6
"""Events per flush of ``write_large``: two of each size, about 750 KiB per acknowledgement."""
LARGE_INFLIGHT: Final = 100
LARGE_KEYS: Final = 4


def _stdin_closed() -> bool:
    readable, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(readable) and sys.stdin.buffer.read1(1) == b""


def _fault_stream(uri: str, scope: str, stream: str) -> Any:
    m = _manager(uri)
    m.create_scope(scope)
    m.create_stream(scope, stream, 2)
    return m


def _write_batch(writer: Any, n: int, batch: int, keys: int, event: Callable[[int], bytes]) -> int:
    """Write events ``n`` .. ``n + batch - 1`` and flush (acknowledged); the next ``n``."""
    for i in range(n, n + batch):
        writer.write_event_bytes(event(i), routing_key=f"k{i % keys}")
    writer.flush()
    return n + batch


def _write_until_stdin_closes(
    uri: str,
    scope: str,
    stream: str,
    event: Callable[[int], bytes],
    *,
    batch: int,
    inflight: int,
    keys: int,
) -> None:
    manager = _fault_stream(uri, scope, stream)  # kept: its runtime serves the writer
    writer = manager.create_writer(scope, stream, inflight)
    n = 0
    print("R", flush=True)
    while not _stdin_closed():
        n = _write_batch(writer, n, batch, keys, event)
        print(f"A {n}", flush=True)


def write(uri: str, scope: str, stream: str, tag: str) -> None:
    """Events ``<tag>:<n>`` in batches of ``BATCH``; ``A <n>`` after each
    ``flush()`` returned."""

    def event(i: int) -> bytes:
        return f"{tag}:{i}".encode()

    _write_until_stdin_closes(uri, scope, stream, event, batch=BATCH, inflight=INFLIGHT, keys=KEYS)


def event_filler(tag: str, n: int) -> bytes:
    """The bytes after a ``write_large`` event's ``<tag>:<n>|`` prefix: derived
    from both, so a stored event whose bytes were mixed up with another's does
    not check."""
    size = LARGE_EVENT_SIZES[n % len(LARGE_EVENT_SIZES)]
    block = hashlib.blake2b(f"{tag}:{n}".encode(), digest_size=64).digest()
    return (block * (size // len(block) + 1))[:size]


def write_large(uri: str, scope: str, stream: str, tag: str) -> None:
    """``write`` with events ``<tag>:<n>|`` followed by ``event_filler(tag, n)``."""
    _write_until_stdin_closes(
        uri,
        scope,
        stream,
        lambda i: f"{tag}:{i}|".encode() + event_filler(tag, i),
        batch=LARGE_BATCH,
        inflight=LARGE_INFLIGHT,
        keys=LARGE_KEYS,
    )


def load(uri: str, scope: str, stream: str, tag: str) -> dict[str, Any]:
    """``write``'s batches, and after each a reader of a reader group reads
    what is there, until stdin reaches end of file; what was written, read,
    and read twice."""
    m = _fault_stream(uri, scope, stream)
    writer = m.create_writer(scope, stream, INFLIGHT)
    reader = m.create_reader_group(f"rg{tag}", scope, stream).create_reader("r1")

    async def go() -> dict[str, Any]:
        seen: set[bytes] = set()
        duplicates = 0
        n = 0
        while not _stdin_closed():
            n = _write_batch(writer, n, BATCH, KEYS, lambda i: f"{tag}:{i}".encode())
            for data in await read_slice(reader):
                duplicates += data in seen
                seen.add(data)
        return {"written": n, "read": len(seen), "duplicates": duplicates}

    return run_reads(go())


# --------------------------------------------------------------------------- the child's entry

SCENARIOS: Final[dict[str, Callable[..., dict[str, Any]]]] = {
    f.__name__: f
    for f in (
        scopes_and_streams,
        policies,
        bad_requests,
        transaction_states,
        many_scopes,
        restart_write,
        restart_read,
        events_and_transactions,
        scale_while_writing,
        rolling_transaction,
        byte_stream_head,
        auto_scale,
        retention_by_size,
        many_events,
        write_only,
        write_through_restart,
        write_more,
        read_all,
        round_trip,
        write_keyed,
        read_group,
        from_tail,
        sizes,
        byte_stream,
        transactions,
        abort_right_after_write,
        reads_between_blocking_calls,
        sealed,
        auth_write_read,
        auth_read_only,
        auth_outlive_token,
        tls_write_read,
        load,
    )
}
"""Scenarios that print one JSON object."""

STREAMING: Final[dict[str, Callable[..., None]]] = {"write": write, "write_large": write_large}
"""Scenarios that print progress lines until their stdin reaches end of file."""


def main(argv: list[str]) -> None:
    global pc
    import pravega_client

    pc = pravega_client
    name, uri, *args = argv
    try:
        if name in STREAMING:
            STREAMING[name](uri, *args)
        else:
            print(json.dumps(SCENARIOS[name](uri, *args)), flush=True)
    except BaseException as exc:  # the parent reports what the client raised
        traceback.print_exc()
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        print("E " + text.replace("\n", " | "), flush=True)
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)  # no interpreter teardown under the client's threads (see the module doc)


if __name__ == "__main__":
    main(sys.argv[1:])
