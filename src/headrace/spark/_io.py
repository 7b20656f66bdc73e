"""The data source's I/O, without pyspark: planning, range reads, transactions.

Everything here is a blocking function built on the asyncio client
(``asyncio.run`` on a fresh :class:`PravegaClient` per call): Spark calls the
data source from plain threads and short-lived Python workers, so nothing is
kept open between calls.

Positions
---------
A *position* is ``{"scope/stream": {"<segment id>": offset}}``: the offset of
the next event to read in each segment of each stream (string keys, because
Spark stores offsets as JSON). Offsets are Pravega byte offsets, always on
event boundaries. A segment that is sealed and read to its end is replaced by
its successors once all of their predecessors are read (per-key order holds
across scaling); a range ``[start, end)`` of one segment is what a Spark
partition reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import socket
import ssl
import struct
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from headrace.client import PravegaClient, ScalingPolicy, Segment, StreamConfig, TxnId
from headrace.client.errors import (
    ControllerError,
    NoSuchSegmentError,
    SegmentIsTruncatedError,
    TableKeyVersionError,
)
from headrace.client.kvtable import NOT_EXISTS, KeyValueTable
from headrace.client.records import records_from_events
from headrace.client.transactions import Transaction
from headrace.errors import ConfigError, HeadraceError, RemoteProtocolError, ServerError

from .options import COMMITS_TO_RETAIN, Connection, OptionError

if TYPE_CHECKING:
    import pyarrow as pa

    from .options import ReadOptions, WriteOptions

__all__ = [
    "COMMIT_TABLE",
    "DataLossError",
    "Position",
    "Range",
    "Target",
    "TxnRef",
    "abort_txns",
    "check_connection",
    "commit_batch",
    "earliest",
    "latest",
    "plan_ranges",
    "prune_commits",
    "read_range",
    "resolve",
    "split_range",
    "starting_position",
    "write_txns",
]

Position = dict[str, dict[str, int]]
"""``{"scope/stream": {"<segment id>": offset}}`` (module docstring)."""

COMMIT_TABLE = "spark-commits"
"""Key-value table (in the target stream's scope) holding each committed
``(writer id, batch id)`` with the transactions it committed."""

EVENT_HEADER = struct.Struct(">ii")
"""Pravega event framing: int32 type (0), int32 payload length."""

SCAN_READ_BYTES = 1024 * 1024
"""Bytes per read while walking event headers on the driver (``minPartitions``,
``maxEventsPerTrigger``, ``maxBytesPerTrigger``)."""

TLS_CHECK_TIMEOUT_S = 10.0
"""Bound on the TLS handshake :func:`check_connection` makes at planning time."""

AUTH_REFUSALS = frozenset({"UNAUTHENTICATED", "PERMISSION_DENIED"})
"""Controller status codes (``ServerError.code``) meaning the credentials were refused."""

Target = str | Connection
"""Where a function's clients connect: a plain controller URI, or a
:class:`Connection` (TLS and credentials, from the options)."""

T = TypeVar("T")


class DataLossError(HeadraceError):
    """Data the query needs is gone (truncated by retention, or deleted)."""


@dataclass(frozen=True, slots=True)
class Range:
    """Events of one segment whose offsets lie in ``[start, end)``."""

    scope: str
    stream: str
    segment_id: int
    start: int
    end: int

    @property
    def segment(self) -> Segment:
        return Segment(self.scope, self.stream, self.segment_id)


@dataclass(frozen=True, slots=True)
class TxnRef:
    """An open transaction prepared by a task; the driver commits or aborts it."""

    scope: str
    stream: str
    high_bits: int
    low_bits: int

    @property
    def txn_id(self) -> TxnId:
        return TxnId(self.high_bits, self.low_bits)

    def to_json(self) -> list[Any]:
        return [self.scope, self.stream, self.high_bits, self.low_bits]


def _client(target: Target) -> PravegaClient:
    """A client of ``target``, built on the running loop (grpc.aio binds to it).

    The credentials are read here, on the node that connects (``Connection.credentials``).
    """
    if isinstance(target, str):
        return PravegaClient(target)
    credentials = target.credentials()
    try:
        return PravegaClient(target.uri, tls=target.tls, credentials=credentials)
    except ConfigError as exc:  # a TLS file missing or bad on this node
        raise OptionError(
            f"options 'caFile'/'clientCert'/'clientKey' on host {os.uname().nodename}: {exc} "
            "(the files must be readable at that path on the driver and on every executor)"
        ) from None


def _run(uri: Target, work: Callable[[PravegaClient], Awaitable[T]]) -> T:
    async def main() -> T:
        async with _client(uri) as client:
            return await work(client)

    return asyncio.run(main())


def check_connection(conn: Connection, stream: str | None = None) -> None:
    """Fail fast, at planning time, on a controller certificate this node cannot
    verify, and (with ``stream`` and credentials) on credentials the server refuses.

    The controller client (gRPC) reports a failed TLS handshake like a server
    that is down, and retries it for about 20 s; one handshake here, with the
    same TLS settings and a bounded wait, tells the two apart. Does nothing
    without TLS. An unreachable controller is left to the clients (their
    retries cover a server restart).

    Raises:
        TlsCertificateError: the controller's certificate did not verify
            (names the ``caFile`` option).
        OptionError: the TLS files cannot be loaded.
        HeadraceError: the server refused the credentials for ``stream``
            (``UNAUTHENTICATED``: a wrong user or password; ``PERMISSION_DENIED``).
    """
    _check_tls(conn)
    if stream is not None and conn.credentials() is not None:
        scope, name = _split_name(stream)

        async def work(client: PravegaClient) -> None:
            try:
                await client.controller.delegation_token(scope, name)
            except ServerError as exc:
                if exc.code not in AUTH_REFUSALS:
                    raise
                raise HeadraceError(
                    f"the server refused the credentials of user {conn.credentials_user()!r} "
                    f"for {stream} (options 'user'/'passwordFile' or the "
                    f"pravega_client_auth_* environment variables): {exc}"
                ) from exc

        _run(conn, work)


def _check_tls(conn: Connection) -> None:
    from headrace.client.controller import parse_controller_uri
    from headrace.client.errors import TlsCertificateError

    if conn.tls is None:
        return
    try:
        context = conn.tls.ssl_context()
    except HeadraceError as exc:
        raise OptionError(f"options 'caFile'/'clientCert'/'clientKey': {exc}") from None
    context.set_alpn_protocols(["h2"])  # what the gRPC client offers
    host, _, port = parse_controller_uri(conn.uri).rpartition(":")
    try:
        with (
            socket.create_connection((host, int(port)), timeout=TLS_CHECK_TIMEOUT_S) as sock,
            context.wrap_socket(sock, server_hostname=host),
        ):
            pass
    except ssl.SSLCertVerificationError as exc:
        where = f"the CAs of {conn.tls.ca_file}" if conn.tls.ca_file else "the system's CAs"
        raise TlsCertificateError(
            f"controller {host}:{port}: its TLS certificate does not verify against {where}: "
            f"{exc.verify_message or exc}. Set option 'caFile' to the CA that signed it "
            "(the controller URI's host must be a name on the certificate)"
        ) from None
    except (OSError, ssl.SSLError):
        return  # not a certificate problem: the clients report it after their retries


def _split_name(name: str) -> tuple[str, str]:
    scope, _, stream = name.partition("/")
    return scope, stream


# --------------------------------------------------------------------------- positions


async def _earliest(client: PravegaClient, streams: Sequence[str]) -> Position:
    out: Position = {}
    for name in streams:
        heads = await client.controller.get_head_segments(*_split_name(name))
        out[name] = {str(s.segment_id): off for s, off in heads.items()}
    return out


async def _latest(client: PravegaClient, streams: Sequence[str]) -> Position:
    """Every segment with data still to come, at its current length.

    Open segments are what writers append to; segments of a sealed stream are
    its last epoch (their length: nothing more will come).
    """
    out: Position = {}
    for name in streams:
        scope, stream = _split_name(name)
        ranges = await client.controller.get_current_segments(scope, stream)
        segments = [r.segment for r in ranges]
        if not segments:  # sealed stream: walk to its last segments
            segments = [s for s, _ in await _all_segments(client, scope, stream)]
            segments = [s for s in segments if not await _successors(client, s)]
        cur: dict[str, int] = {}
        for seg in segments:
            stat = await client.segments.stat(seg)
            cur[str(seg.segment_id)] = stat.length
        out[name] = cur
    return out


def earliest(uri: Target, streams: Sequence[str]) -> Position:
    return _run(uri, lambda c: _earliest(c, streams))


def latest(uri: Target, streams: Sequence[str]) -> Position:
    return _run(uri, lambda c: _latest(c, streams))


def resolve(uri: Target, spec: str, streams: Sequence[str], default: str) -> Position:
    """A starting or ending position from an option value.

    ``earliest``, ``latest``, or JSON ``{"scope/stream": {"<segment id>": offset}}``
    where -2 means the segment's start and -1 its current length; streams left
    out of the JSON take ``default``.
    """
    if spec == "earliest":
        return earliest(uri, streams)
    if spec == "latest":
        return latest(uri, streams)
    given = json.loads(spec)

    async def work(client: PravegaClient) -> Position:
        fallback = await (_earliest if default == "earliest" else _latest)(client, streams)
        out: Position = {}
        for name in streams:
            if name not in given:
                out[name] = fallback[name]
                continue
            scope, stream = _split_name(name)
            cur: dict[str, int] = {}
            for seg_id, off in given[name].items():
                if off < 0:
                    stat = await client.segments.stat(Segment(scope, stream, int(seg_id)))
                    off = stat.start_offset if off == -2 else stat.length
                cur[str(int(seg_id))] = int(off)
            out[name] = cur
        return out

    return _run(uri, work)


async def _at_time(client: PravegaClient, name: str, ms: int, *, tank: bool) -> dict[str, int]:
    """Where a stream's rows with a timestamp >= ``ms`` begin, at or before them.

    TANK topics (messages carry their producer's timestamps, in any order):
    every head segment from its start; the reader drops the earlier rows.
    Other streams (events carry no timestamp; time is append time): the
    segments open at ``ms`` (the controller's epoch at that time: a segment
    sealed before it received nothing since), each from its start, except
    that a segment not modified since before ``ms`` starts at its end.
    Nothing appended at or after ``ms`` is left out; earlier events of a
    segment that was appended to across ``ms`` are included.
    """
    scope, stream = _split_name(name)
    if tank:
        heads = await client.controller.get_head_segments(scope, stream)
        return {str(s.segment_id): off for s, off in heads.items()}
    out: dict[str, int] = {}
    for seg, off in (await client.controller.get_segments_at(scope, stream, ms)).items():
        stat = await client.segments.stat(seg)
        quiet = stat.last_modified_ms < ms  # nothing appended, merged or sealed since
        out[str(seg.segment_id)] = stat.length if quiet else max(off, stat.start_offset)
    return out


def starting_position(opts: ReadOptions, default: str) -> Position:
    """The starting position of a read: ``startingTimestamp`` /
    ``startingOffsetsByTimestamp`` for the streams they name
    (:func:`_at_time`), ``startingOffsets`` (or ``default``) for the others."""
    others = [n for n in opts.streams if n not in opts.starting_times]
    pos = resolve(opts.connection, opts.starting, others, default) if others else {}
    if opts.starting_times:

        async def work(client: PravegaClient) -> Position:
            return {
                name: await _at_time(client, name, ms, tank=_split_name(name)[0] == opts.tank_scope)
                for name, ms in opts.starting_times.items()
            }

        pos.update(_run(opts.connection, work))
    return pos


async def _successors(client: PravegaClient, seg: Segment) -> dict[Segment, list[int]]:
    found = await client.controller.get_successors(seg)
    return {rng.segment: preds for rng, preds in found.items()}


async def _all_segments(
    client: PravegaClient, scope: str, stream: str
) -> list[tuple[Segment, int]]:
    """Every readable segment of a stream (heads, then successors), with its start."""
    heads = await client.controller.get_head_segments(scope, stream)
    seen: dict[Segment, int] = dict(heads)
    todo = list(heads)
    while todo:
        seg = todo.pop()
        for nxt in await _successors(client, seg):
            if nxt not in seen:
                seen[nxt] = 0
                todo.append(nxt)
    return sorted(seen.items())


def advance(uri: Target, start: Position, opts: ReadOptions) -> Position:
    """The end of the next micro-batch from ``start``: every segment's current
    length, segments that finished replaced by their successors, within the
    trigger limits of ``opts``.

    Raises:
        DataLossError: a start lies before a segment's start (``failOnDataLoss``).
    """

    async def work(client: PravegaClient) -> Position:
        end: Position = {}
        for name in opts.streams:
            scope, stream = _split_name(name)
            cur = dict(start.get(name, {}))
            if not cur:
                cur = (await _earliest(client, [name]))[name]
            out: dict[str, int] = {}
            finished: set[int] = set()
            candidates: dict[Segment, list[int]] = {}
            for seg_id, off in cur.items():
                seg = Segment(scope, stream, int(seg_id))
                try:
                    stat = await client.segments.stat(seg)
                except NoSuchSegmentError:
                    _lost(opts, f"segment {seg.name} no longer exists")
                    finished.add(seg.segment_id)
                    continue
                if off < stat.start_offset:
                    _lost(
                        opts,
                        f"{seg.name} was truncated to offset {stat.start_offset}; "
                        f"the query was at {off}",
                    )
                    off = cur[seg_id] = stat.start_offset  # skipping: limits count from here
                out[seg_id] = max(stat.length, off)
                if stat.sealed and off >= stat.length:
                    finished.add(seg.segment_id)
                    for nxt, preds in (await _successors(client, seg)).items():
                        candidates[nxt] = preds
            for nxt, preds in candidates.items():
                key = str(nxt.segment_id)
                known = [p for p in preds if str(p) in cur]
                if key not in out and all(p in finished for p in known):
                    out[key] = (await client.segments.stat(nxt)).length
                    cur[key] = 0
            # Segments read to the end whose successors are all in: no longer needed.
            for seg_id in list(out):
                if int(seg_id) in finished:
                    succ = await _successors(client, Segment(scope, stream, int(seg_id)))
                    if all(str(s.segment_id) in out for s in succ):
                        del out[seg_id]
                        cur.pop(seg_id, None)
            start_here = {k: cur.get(k, 0) for k in out}
            if opts.max_events is not None or opts.max_bytes is not None:
                out = await _limit(client, scope, stream, start_here, out, opts)
            end[name] = out
        return end

    return _run(opts.connection, work)


def _lost(opts: ReadOptions, what: str) -> None:
    if opts.fail_on_data_loss:
        raise DataLossError(
            f"data loss: {what}. Set failOnDataLoss=false to skip to the oldest data kept."
        )


async def _limit(
    client: PravegaClient,
    scope: str,
    stream: str,
    start: dict[str, int],
    end: dict[str, int],
    opts: ReadOptions,
) -> dict[str, int]:
    """Cut each segment's range so the batch holds at most ``max_events`` events
    and ``max_bytes`` bytes, shared in proportion to each segment's backlog."""
    lag = {k: end[k] - start[k] for k in end}
    total = sum(lag.values())
    if total == 0:
        return end
    out = dict(end)
    streams_count = len(opts.streams)
    for seg_id, backlog in lag.items():
        if backlog == 0:
            continue
        share = backlog / total / streams_count
        max_events = None if opts.max_events is None else max(1, int(opts.max_events * share))
        max_bytes = None if opts.max_bytes is None else max(1, int(opts.max_bytes * share))
        seg = Segment(scope, stream, int(seg_id))
        out[seg_id] = await _walk(client, seg, start[seg_id], end[seg_id], max_events, max_bytes)
    return out


async def _walk(
    client: PravegaClient,
    seg: Segment,
    start: int,
    end: int,
    max_events: int | None,
    max_bytes: int | None,
) -> int:
    """The offset after at most ``max_events`` events / ``max_bytes`` bytes from
    ``start`` (at least one event), not beyond ``end``; reads the event headers."""
    offset = start  # always the offset of an event header
    count = 0
    while offset < end:
        got = await client.segments.read(seg, offset, suggested_bytes=SCAN_READ_BYTES)
        data = got.data
        if len(data) < EVENT_HEADER.size:
            break  # nothing more to read below ``end``
        pos = 0
        while pos + EVENT_HEADER.size <= len(data):
            _, length = EVENT_HEADER.unpack_from(data, pos)
            nxt = offset + pos + EVENT_HEADER.size + length
            if nxt > end:
                return offset + pos
            if count > 0 and (
                (max_events is not None and count >= max_events)
                or (max_bytes is not None and nxt - start > max_bytes)
            ):
                return offset + pos
            count += 1
            pos += EVENT_HEADER.size + length
        offset += pos  # the next header, maybe past this read (a long event)
    return min(offset, end)


# --------------------------------------------------------------------------- planning


def plan_ranges(uri: Target, start: Position, end: Position, min_partitions: int) -> list[Range]:
    """The ranges between two positions, split so there are at least
    ``min_partitions`` (splits fall on event boundaries)."""
    ranges: list[Range] = []
    for name, segs in end.items():
        scope, stream = _split_name(name)
        begin = start.get(name, {})
        for seg_id, stop in sorted(segs.items(), key=lambda kv: int(kv[0])):
            lo = begin.get(seg_id, 0)
            if stop > lo:
                ranges.append(Range(scope, stream, int(seg_id), lo, stop))
    if 0 < len(ranges) < min_partitions:
        ranges = _split_all(uri, ranges, min_partitions)
    return ranges


def batch_plan(opts: ReadOptions) -> list[Range]:
    """Every range a batch read covers: each segment from its start to its end
    (the ``startingOffsets``/``endingOffsets`` options, successors followed)."""

    async def work(client: PravegaClient) -> list[Range]:
        out: list[Range] = []
        for name in opts.streams:
            scope, stream = _split_name(name)
            for seg, _ in await _all_segments(client, scope, stream):
                try:
                    stat = await client.segments.stat(seg)
                except NoSuchSegmentError:
                    continue
                out.append(Range(scope, stream, seg.segment_id, stat.start_offset, stat.length))
        return out

    ranges = _run(opts.connection, work)
    if opts.starting_times:
        ranges = _from_time(opts, ranges)
    if opts.starting != "earliest" or opts.starting_times:
        lo = starting_position(opts, "earliest")
        for r in ranges:
            off = lo.get(f"{r.scope}/{r.stream}", {}).get(str(r.segment_id))
            if off is not None and off < r.start:
                what = f"{r.segment.name} was truncated to offset {r.start}; asked for {off}"
                _lost(opts, what)
        ranges = [_clip(r, lo, lower=True) for r in ranges]
    if opts.ending != "latest":
        hi = resolve(opts.connection, opts.ending, opts.streams, "latest")
        ranges = [_clip(r, hi, lower=False) for r in ranges]
    ranges = [r for r in ranges if r.end > r.start]
    if 0 < len(ranges) < opts.min_partitions:
        ranges = _split_all(opts.connection, ranges, opts.min_partitions)
    return ranges


def _from_time(opts: ReadOptions, ranges: list[Range]) -> list[Range]:
    """Drop the ranges of segments a time start skips: those sealed before the
    time (not in the epoch open then, nor after it)."""
    pos = starting_position(opts, "earliest")

    async def work(client: PravegaClient) -> set[tuple[str, int]]:
        keep: set[tuple[str, int]] = set()
        for name in opts.starting_times:
            scope, stream = _split_name(name)
            todo = [Segment(scope, stream, int(k)) for k in pos[name]]
            while todo:
                seg = todo.pop()
                if (name, seg.segment_id) not in keep:
                    keep.add((name, seg.segment_id))
                    todo.extend(await _successors(client, seg))
        return keep

    keep = _run(opts.connection, work)
    return [
        r
        for r in ranges
        if f"{r.scope}/{r.stream}" not in opts.starting_times
        or (f"{r.scope}/{r.stream}", r.segment_id) in keep
    ]


def _clip(r: Range, pos: Position, *, lower: bool) -> Range:
    off = pos.get(f"{r.scope}/{r.stream}", {}).get(str(r.segment_id))
    if off is None:
        return r
    if lower:
        return Range(r.scope, r.stream, r.segment_id, max(r.start, off), r.end)
    return Range(r.scope, r.stream, r.segment_id, r.start, min(r.end, off))


def _split_all(uri: Target, ranges: list[Range], min_partitions: int) -> list[Range]:
    total = sum(r.end - r.start for r in ranges)

    async def work(client: PravegaClient) -> list[Range]:
        out: list[Range] = []
        for r in ranges:
            parts = max(1, round(min_partitions * (r.end - r.start) / total))
            out.extend(await _split(client, r, parts))
        return out

    return _run(uri, work)


async def _split(client: PravegaClient, r: Range, parts: int) -> list[Range]:
    if parts <= 1:
        return [r]
    step = (r.end - r.start) // parts
    cuts = [r.start]
    offset = r.start
    for _ in range(parts - 1):
        # The first event boundary at or after offset + step.
        offset = await _walk(client, r.segment, offset, r.end, None, max(1, step))
        if offset >= r.end or offset <= cuts[-1]:
            break
        cuts.append(offset)
    cuts.append(r.end)
    return [
        Range(r.scope, r.stream, r.segment_id, a, b) for a, b in itertools.pairwise(cuts) if b > a
    ]


def split_range(uri: Target, r: Range, parts: int) -> list[Range]:
    return _run(uri, lambda c: _split(c, r, parts))


# --------------------------------------------------------------------------- reading


Columns = tuple["pa.Array", "pa.Array", "pa.Array", "pa.Array"]
"""Records of one read reply as Arrow arrays: keys (binary), values (binary),
offsets (int64), timestamps (``timestamp[us, UTC]``)."""

SLICE_STOP = 2**31 - 1
"""``binary_slice`` stop meaning "to the end of each element"."""

UNIFORM_RUN = 8
"""Consecutive events of one size after which the frame walk checks the rest
of the buffer for that stride at once (Arrow compute) instead of one header
at a time in Python."""


def read_range(
    uri: Target, r: Range, *, tank_scope: str, fail_on_data_loss: bool
) -> Iterator[Columns]:
    """The records of ``r`` as :data:`Columns`, one per read reply (up to 2 MiB).

    Runs its own event loop, driven one reply at a time, so a range of any
    size is read with bounded memory.

    Raises:
        DataLossError: part of the range was truncated away (and
            ``fail_on_data_loss``).
    """
    loop = asyncio.new_event_loop()
    client: PravegaClient | None = None
    try:
        client = loop.run_until_complete(_make_client(uri))  # reads credentials here
        batches = _read_batches(client, r, tank_scope == r.scope, fail_on_data_loss)
        while True:
            try:
                yield loop.run_until_complete(anext(batches))
            except StopAsyncIteration:
                return
    finally:
        if client is not None:
            loop.run_until_complete(client.aclose())
        loop.close()


async def _make_client(uri: Target) -> PravegaClient:
    return _client(uri)  # built on the loop that uses it (grpc.aio binds to it)


def _frame_starts(buf: bytes) -> tuple[list[pa.Array], int]:
    """Where each whole event frame of ``buf`` starts, and where the last one ends.

    Walks the headers in Python, except along runs of equal-sized events
    (fixed-size records): after ``UNIFORM_RUN`` of them it predicts the rest
    of the buffer at that stride and checks every predicted header at once
    with Arrow compute, keeping the run up to the first mismatch.

    Raises:
        RemoteProtocolError: something else than an event frame.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    unpack = EVENT_HEADER.unpack_from
    header_size = EVENT_HEADER.size
    pieces: list[pa.Array] = []
    walked: list[int] = []
    pos = 0
    end = len(buf)
    same = 0
    last = -1
    data = pa.py_buffer(buf)
    while end - pos >= header_size:
        kind, length = unpack(buf, pos)
        if kind != 0 or length < 0:
            raise RemoteProtocolError(f"not an event at buffer position {pos}: type {kind}")
        stride = header_size + length
        if pos + stride > end:
            break
        same = same + 1 if length == last else 0
        last = length
        if same < UNIFORM_RUN or (end - pos) // stride < 2 * UNIFORM_RUN:
            walked.append(pos)
            pos += stride
            continue
        # A run of equal sizes: predict the rest, check the predicted headers at once.
        count = (end - pos) // stride
        starts = pa.array(range(pos, pos + (count + 1) * stride, stride), pa.int32())
        frames = pa.BinaryArray.from_buffers(pa.binary(), count, [None, starts.buffers()[1], data])
        header = pa.scalar(EVENT_HEADER.pack(0, length), pa.binary())
        good = pc.equal(pc.binary_slice(frames, 0, header_size), header)
        bad = pc.index(good, False).as_py()
        run = count if bad < 0 else bad
        if walked:
            pieces.append(pa.array(walked, pa.int32()))
            walked = []
        pieces.append(starts.slice(0, run))
        pos += run * stride
        same = 0
    if walked:
        pieces.append(pa.array(walked, pa.int32()))
    return pieces, pos


def _split_frames(buf: bytes) -> tuple[pa.Array, pa.Array, int]:
    """The payloads (binary) and start positions (int32) of the whole event
    frames of ``buf``, and the bytes they take.

    The frames are one binary array over ``buf`` as is (offsets = frame
    starts); the payloads are that array without each element's 8-byte
    header, cut in one Arrow kernel, so no per-event Python object is made.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    pieces, used = _frame_starts(buf)
    starts = pa.concat_arrays(pieces) if pieces else pa.array([], pa.int32())
    n = len(starts)
    bounds = pa.concat_arrays([starts, pa.array([used], pa.int32())])
    frames = pa.BinaryArray.from_buffers(
        pa.binary(), n, [None, bounds.buffers()[1], pa.py_buffer(buf)]
    )
    # An explicit stop: pyarrow 26 miscomputes the output size without one.
    values = pc.binary_slice(frames, EVENT_HEADER.size, SLICE_STOP)
    return values, starts, used


async def _read_batches(
    client: PravegaClient, r: Range, tank: bool, fail_on_data_loss: bool
) -> AsyncIterator[Columns]:
    import pyarrow as pa
    import pyarrow.compute as pc

    seg = r.segment
    name = f"{r.scope}/{r.stream}"
    stamp_type = pa.timestamp("us", tz="UTC")
    offset = r.start  # next byte to read
    buf = b""  # bytes from buf_offset not yet decoded (an event cut by a reply)
    buf_offset = offset
    while offset < r.end:
        try:
            got = await client.segments.read(seg, offset)
        except (SegmentIsTruncatedError, NoSuchSegmentError) as exc:
            if fail_on_data_loss:
                raise DataLossError(
                    f"data loss: {seg.name} lost the events from offset {offset} ({exc}). "
                    "Set failOnDataLoss=false to skip them."
                ) from exc
            if isinstance(exc, NoSuchSegmentError):
                return
            offset = buf_offset = max(offset, exc.start_offset)
            buf = b""
            continue
        data = got.data
        if not data:
            if got.end_of_segment:
                return
            continue
        if offset + len(data) > r.end:
            data = data[: r.end - offset]
        offset += len(data)
        buf = buf + data if buf else data
        values, starts, used = _split_frames(buf)
        n = len(values)
        base = buf_offset
        buf = buf[used:]
        buf_offset += used
        if n == 0:
            continue
        offsets = pc.add(starts.cast(pa.int64()), pa.scalar(base, pa.int64()))
        if not tank:
            yield pa.nulls(n, pa.binary()), values, offsets, pa.nulls(n, stamp_type)
            continue
        keys: list[bytes | None] = []
        tvalues: list[bytes] = []
        toffsets: list[int] = []
        stamps: list[int | None] = []
        events = zip(offsets.to_pylist(), values.to_pylist(), strict=True)
        for rec in records_from_events(name, seg.name, events, tank=True):
            keys.append(rec.key)
            tvalues.append(rec.value)
            toffsets.append(rec.offset)
            stamps.append(None if rec.timestamp_ms is None else rec.timestamp_ms * 1000)
        yield (
            pa.array(keys, pa.binary()),
            pa.array(tvalues, pa.binary()),
            pa.array(toffsets, pa.int64()),
            pa.array(stamps, pa.int64()).cast(stamp_type),
        )


# --------------------------------------------------------------------------- writing


def _encode(value: object) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"column 'value' must be string or binary, got {type(value).__name__}")


def _routing_key(key: object) -> str | None:
    if key is None:
        return None
    if isinstance(key, str):
        return key
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key).decode("utf-8", "replace")
    raise TypeError(f"column 'key' must be string or binary, got {type(key).__name__}")


def write_txns(
    opts: WriteOptions, rows: Iterator[tuple[str, object, object]]
) -> tuple[list[TxnRef], int]:
    """Write ``(scope/stream, key, value)`` rows into one new transaction per
    target stream and leave them open (stored, lease no longer renewed) for
    the driver.

    Every transaction opened is aborted if anything fails; returns them (in
    the order the streams first appeared) and the row count. No rows, no
    transaction.
    """

    async def work(client: PravegaClient) -> tuple[list[TxnRef], int]:
        txns: dict[str, Transaction] = {}
        count = 0
        try:
            for name, key, value in rows:
                txn = txns.get(name)
                if txn is None:
                    txn = txns[name] = await _begin(client, name, opts.lease_ms)
                await txn.write(_encode(value), _routing_key(key))
                count += 1
            for txn in txns.values():
                await txn.detach()  # stored, left open: the driver commits or aborts it
        except BaseException:
            for txn in txns.values():
                with contextlib.suppress(Exception):
                    await txn.abort()
            raise
        refs = [
            TxnRef(t.scope, t.stream, t.txn_id.high_bits, t.txn_id.low_bits) for t in txns.values()
        ]
        return refs, count

    return _run(opts.connection, work)


async def _begin(client: PravegaClient, name: str, lease_ms: int) -> Transaction:
    scope, stream = _split_name(name)
    try:
        return await client.begin_transaction(scope, stream, lease_ms=lease_ms)
    except ControllerError as exc:
        raise HeadraceError(
            f"the headrace sink cannot write to {name} (it must exist): {exc}"
        ) from exc


async def _abort(client: PravegaClient, refs: Sequence[TxnRef]) -> None:
    for ref in refs:
        # Already gone (lease expired) or committed by an earlier attempt: fine.
        with contextlib.suppress(ControllerError):
            await client.controller.abort_transaction(ref.scope, ref.stream, ref.txn_id)


def abort_txns(uri: Target, refs: Sequence[TxnRef]) -> None:
    """Abort transactions of tasks whose batch failed."""
    _run(uri, lambda c: _abort(c, refs))


def commit_batch(
    uri: Target,
    scope: str,
    writer_id: str,
    batch_id: int | None,
    refs: Sequence[TxnRef],
    *,
    retain: int = COMMITS_TO_RETAIN,
) -> list[TxnRef]:
    """Commit the transactions of one batch exactly once per ``(writer_id, batch_id)``.

    The transaction list (any number of streams) is first recorded under
    that key in the ``COMMIT_TABLE`` key-value table of ``scope`` (a
    conditional insert), then each transaction is committed. If the key is
    already there, an earlier attempt of this batch got that far: its
    transactions are committed (committing a committed transaction succeeds)
    and the new ones are aborted. A replayed batch therefore adds nothing
    twice. Then the writer's records of batches ``<= batch_id - retain`` are
    deleted (:func:`prune_commits`), so the table keeps the last ``retain``
    per writer. ``batch_id`` None (a one-shot batch write) skips the record.

    Returns the transactions that now hold the batch's data.
    """

    async def work(client: PravegaClient) -> list[TxnRef]:
        chosen = list(refs)
        if batch_id is None:
            for ref in chosen:
                await client.controller.commit_transaction(ref.scope, ref.stream, ref.txn_id)
            return chosen
        table = await client.kv_table(scope, COMMIT_TABLE)
        key = _commit_key(writer_id, batch_id)
        record = json.dumps([r.to_json() for r in refs]).encode()
        try:
            await table.put(key, record, version=NOT_EXISTS)
        except TableKeyVersionError:
            found = await table.get(key)
            assert found is not None
            chosen = [TxnRef(*item) for item in json.loads(found[0])]
            await _abort(client, [r for r in refs if r not in chosen])
        for ref in chosen:
            await client.controller.commit_transaction(ref.scope, ref.stream, ref.txn_id)
        await _prune(table, writer_id, batch_id - retain)
        return chosen

    return _run(uri, work)


def _commit_key(writer_id: str, batch_id: int) -> bytes:
    return f"{writer_id}/{batch_id}".encode()


async def _prune(table: KeyValueTable, writer_id: str, up_to: int) -> int:
    """Delete ``writer_id``'s records of batches ``<= up_to``; returns how many.

    Scans the table (it holds about ``retain`` records per writer of the
    scope), so records left by a driver that died before pruning go too.
    """
    if up_to < 0:
        return 0
    gone = 0
    for key, _, _ in await table.items():
        who, _, batch = key.decode("utf-8", "replace").rpartition("/")
        if who == writer_id and batch.isdigit() and int(batch) <= up_to:
            await table.remove(key)
            gone += 1
    return gone


def prune_commits(uri: Target, scope: str, writer_id: str, up_to: int) -> int:
    """Delete ``writer_id``'s exactly-once records of batches ``<= up_to``."""

    async def work(client: PravegaClient) -> int:
        return await _prune(await client.kv_table(scope, COMMIT_TABLE), writer_id, up_to)

    return _run(uri, work)


def ensure_stream(uri: Target, name: str, segments: int) -> None:
    """Create ``scope/stream`` (and its scope) with ``segments`` fixed segments if missing."""
    scope, stream = _split_name(name)

    async def work(client: PravegaClient) -> None:
        await client.controller.create_scope(scope)
        config = StreamConfig(ScalingPolicy.fixed(segments))
        await client.controller.create_stream(scope, stream, config)

    _run(uri, work)


def new_writer_id() -> str:
    return uuid.uuid4().hex


def positions_json(pos: Mapping[str, Mapping[str, int]]) -> str:
    return json.dumps(pos, sort_keys=True)
