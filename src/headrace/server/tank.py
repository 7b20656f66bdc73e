"""The TANK broker front door: TANK requests in, storage-model calls, TANK responses out.

Protocol, and what headrace does where TANK leaves room:
``docs/protocols/tank.md`` (``tank.md#...`` below names its anchors). The
connection loop (``_loop.py``) runs each request as its own task; this module
adds what a front door may add (``docs/architecture.md#front-doors``):
``TankHandler`` (the sans-I/O ``TankConnection``), one dispatch table
(``DISPATCH``, request type -> handler), one error table (``ERROR_CODES``,
what the model or the store raised -> TANK's code) and ``start_tank``,
the ``tank`` listener's starter. Topics, partitions, sequence numbers and
parked consumes are the storage model's, ``tank_broker.TankBroker``, which
every connection of a server shares.

Acknowledgement (``docs/architecture.md#invariant-durable-acks``): a produce
is answered after the model's append returned, i.e. once the bundle is
durable. Consume (tank.md#consume): a consume finding every partition at its
end parks (woken by appends until ``min_bytes`` arrived, bounded by the
request's ``max_wait_ms``, at most one hour). Only error codes TANK defines
are sent.

Auth (``server/authz.py``): with auth on, a client is the user its TLS
certificate names, and each request needs that user's grant on the topic's
stream. TANK has no "not allowed" code, so a refusal is the nearest the
protocol has: produce without READ_UPDATE gets the topic-level ``READ_ONLY``
(0xfe), create topic without READ_UPDATE on the scope gets ``READ_ONLY`` (5),
and consume, discover partitions and reload conf without READ answer as for
an unknown topic (a topic the client may not read is not shown to exist);
discover topics and status list only readable topics.

A connection's consume responses in the making, queued and with its writer
add up to at most ``MAX_QUEUED_CHUNK_BYTES``: room is taken before the store is
read, so a client that does not read gets nothing more read for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from headrace.controller.errors import ControllerError, StreamExists, TooMany
from headrace.controller.naming import is_valid_name
from headrace.errors import (
    ConfigError,
    HeadraceError,
    OwnerUnavailable,
    RemoteProtocolError,
    StoreError,
)
from headrace.protocols import tank as t
from headrace.protocols.pravega.auth import Permission, scope_resource, stream_resource
from headrace.server._context import Listener, ListenerContext
from headrace.server._inline import step_now
from headrace.server._listen import start_tcp_listener
from headrace.server._loop import ConnectionHandler, OutputPiece
from headrace.server.authz import ConnectionAccess, DoorAuth
from headrace.server.tank_broker import (
    Chunk,
    InvalidBundle,
    InvalidSeqNums,
    InvalidTopic,
    InvalidTopicConfig,
    OutOfRange,
    Partition,
    TankBroker,
    Waiter,
    stream_name,
    stream_of,
)
from headrace.types import FileRegion

__all__ = [
    "DISPATCH",
    "ERROR_CODES",
    "HEARTBEAT_INTERVAL_S",
    "MAX_CONSUME_READS_PER_CONNECTION",
    "MAX_QUEUED_CHUNK_BYTES",
    "MAX_RESPONSE_CHUNK_BYTES",
    "MIN_CONSUME_ROOM_BYTES",
    "TankHandler",
    "start_tank",
]

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 30.0
"""A Ping goes to every connection this often. TANK v4 sends none after the greeting,
but every client skips Pings (tank.md#greeting), and a periodic frame lets a client (and any
NAT or proxy on the way) see that an idle connection is alive."""

MAX_RESPONSE_CHUNK_BYTES = 64 * 1024 * 1024
"""Chunk bytes in one consume response, all partitions together: one partition's
largest fetch (tank.md#consume), a quarter of the 256 MiB frame limit. Partitions past it
(or past the connection's room, ``MAX_QUEUED_CHUNK_BYTES``) get an empty chunk and
the client asks again; a partition reached within it gets at least one bundle, so
a response overshoots by one bundle at most."""

MAX_CONSUME_READS_PER_CONNECTION = 2
"""Consume responses one connection may have in the making at once (parked
consumes do not count), however many it pipelines."""

MAX_QUEUED_CHUNK_BYTES = 8 * 1024 * 1024
"""Chunk bytes of one connection's consume responses in the making, queued, or
taken by its writer and maybe not yet sent (its last two takes: the writer takes
more only once the socket drained). A consume takes its budget from this room
before it reads the store and waits while there is none, so a client that does
not read holds at most this (plus one bundle) however many consumes it
pipelines. Eight times the usual fetch (4 MiB) keeps a pipelining consumer
busy; a larger fetch is answered in steps of at most this."""

CLUSTER_START_RETRY_S: Final = 0.5
"""Wait between attempts at creating the TANK scope and reading its seq-num
table when the cluster cannot answer yet (no leader, its owner moving)."""

MIN_CONSUME_ROOM_BYTES: Final = 1024 * 1024
"""Least room a consume response gets when the server's budget of buffered
bytes (``--max-total-buffered-bytes``) is nearly spent: many consumers then
read in small steps instead of each taking ``MAX_QUEUED_CHUNK_BYTES``."""

BROKER_VERSION = 400
"""What Status reports: the TANK version whose protocol we speak (4.0, tank.md#status)."""


@dataclass(frozen=True, slots=True)
class _PartsResult(t.ConsumePartitionResult):
    """A partition result whose chunk is ``parts`` (``chunk`` stays empty): the
    handler sends them as they are (``TankConnection.send_split``)."""

    parts: tuple[bytes | bytearray | memoryview, ...] = ()
    size_bytes: int = 0


def _chunk_size(result: t.ConsumePartitionResult) -> int:
    return result.size_bytes if isinstance(result, _PartsResult) else len(result.chunk)


# --------------------------------------------------------------------------- connections


Handler = Callable[["TankHandler", t.Request], Awaitable[t.Response]]


class TankHandler(ConnectionHandler):
    """One TANK connection: a server ``TankConnection`` in front of the broker."""

    name = "tank"

    def __init__(
        self,
        broker: TankBroker,
        *,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
        auth: DoorAuth | None = None,
        listener: str = "tank",
    ):
        self.name = listener
        self._broker = broker
        self._auth = auth
        self._access: ConnectionAccess | None = None
        self._conn = t.TankConnection(t.Role.SERVER)  # queues the greeting Ping
        self._heartbeat_interval_s = heartbeat_interval_s
        self._heartbeat: asyncio.Task[None] | None = None
        self._parked: set[Waiter] = set()
        # Bounded memory for consume responses: few built at once, and each
        # takes its room under MAX_QUEUED_CHUNK_BYTES before it reads.
        self._reading = asyncio.Semaphore(MAX_CONSUME_READS_PER_CONNECTION)
        self._reserved_bytes = 0  # budgets of the responses in the making
        self._queued_bytes = 0  # chunk bytes of responses queued, not yet taken
        self._taken_bytes: deque[int] = deque([0, 0], maxlen=2)  # the writer's last two takes
        self._taken = asyncio.Event()
        self._out: list[OutputPiece] = []
        """Consume responses sent as pieces, in order ahead of what the connection
        has queued since."""
        self._turns = 0  # requests other than consumes, in wire order
        self._answered = 0  # those of them answered (or given up)
        self._held: dict[int, t.Response | None] = {}
        """Replies ready before the ones ahead of them (``_answer_in_order``)."""
        self._issuing: asyncio.Future[None] | None = None
        """Resolved once the last produce that had to wait before issuing its
        appends (a topic to look up) has issued them (``produce``)."""

    # ------------------------------------------------------------------ loop interface

    def feed(self, data: bytes) -> Iterator[object]:
        try:
            self._conn.receive_data(data)
        except RemoteProtocolError:
            yield from self._conn.events()  # frames before the bad one are still served
            raise
        for event in self._conn.events():
            if isinstance(event, t.ConnectionClosed):
                self._release_parked()
            yield event

    def partial_frame_bytes(self) -> int:
        return self._conn.buffered_bytes

    def sequential(self, event: object) -> bool:
        # Produces (and topic creation) keep wire order; consumes may park, so
        # they run beside everything else.
        return not isinstance(event, t.Consume)

    def pipelined(self, event: object) -> bool:
        # A produce issues its appends in its first step, or makes the produces
        # behind it wait until it has (``_issuing``): they need not wait for
        # its sync.
        return type(event) in _INLINE_REQUESTS

    def inline(self, event: object) -> bool:
        # A produce issues its store append in its first step (the partition's
        # lock is free unless a produce to it is in flight) and, under fsync
        # never, is often answered without suspending: no task, no loop round.
        # Nothing before its first suspension uses ``current_task`` or a timeout.
        # Consumes may park and read: they keep their own task. Not once the
        # peer broke the protocol further on in what was received: those
        # requests go the way of tasks, which the closing connection cancels
        # before they store anything.
        return type(event) in _INLINE_REQUESTS and self._conn.state is not t.ConnectionState.ERROR

    async def handle(self, event: object) -> None:
        handler = DISPATCH.get(type(event))
        if handler is None:  # Ping (ignored, tank.md#message-ids), ConnectionClosed
            return
        assert isinstance(event, t.Request)
        if not isinstance(event, t.Consume):
            await self._answer_in_order(handler, event)
            return
        response = await handler(self, event)
        if self._conn.state is t.ConnectionState.ERROR:
            return
        if not isinstance(response, t.ConsumeResponse):
            self._conn.send(response)
            return
        parts: dict[tuple[int, int], tuple[bytes | bytearray | memoryview, ...]] = {}
        for ti, topic in enumerate(response.topics):
            if isinstance(topic, t.ConsumeTopicResult):
                for pi, partition in enumerate(topic.partitions):
                    if isinstance(partition, _PartsResult):
                        parts[(ti, pi)] = partition.parts
        if parts:
            pieces = self._conn.send_split(response, parts)
            queued = self._conn.data_to_send()  # responses before this one go first
            if queued:
                self._out.append(queued)
            self._out += pieces
        else:
            self._conn.send(response)
        self._queued_bytes += _chunk_bytes(response)

    async def _answer_in_order(self, handler: Handler, request: t.Request) -> None:
        """Answer a request that is not a consume after every such request before it.

        Pipelined produces finish out of order (one that had to load its
        partition first finishes after a later one to a loaded partition), and
        a reply that is ready early is held until the ones before it went.
        One that raised gives up its turn, so the ones after it still go.
        """
        turn = self._turns
        self._turns += 1
        response: t.Response | None = None
        try:
            response = await handler(self, request)
        finally:
            held = self._held
            held[turn] = response
            while self._answered in held:
                ready = held.pop(self._answered)
                self._answered += 1
                if ready is not None and self._conn.state is not t.ConnectionState.ERROR:
                    self._conn.send(ready)

    def _hold_issuing(self) -> asyncio.Future[None]:
        """Make the produces that arrive from now on wait until ``_let_go``."""
        issued = self._issuing = asyncio.get_running_loop().create_future()
        return issued

    def _let_go(self, issued: asyncio.Future[None]) -> None:
        if self._issuing is issued:
            self._issuing = None
        if not issued.done():
            issued.set_result(None)

    def output(self) -> list[OutputPiece]:
        self._taken_bytes.append(self._queued_bytes)
        self._queued_bytes = 0
        self._taken.set()
        pieces, self._out = self._out, []
        queued = self._conn.data_to_send()
        if queued:
            pieces.append(queued)
        return pieces

    def data_to_send(self) -> bytes:
        return b"".join(p for p in self.output() if not isinstance(p, FileRegion))

    def _unsent_chunk_bytes(self) -> int:
        """Chunk bytes of this connection that may still be in memory: responses in
        the making (their budgets), queued, or among the writer's last two takes (it
        takes more only after draining the socket, so the one before may be unsent)."""
        return self._reserved_bytes + self._queued_bytes + sum(self._taken_bytes)

    async def _take_room(self) -> int:
        """Wait for room under ``MAX_QUEUED_CHUNK_BYTES``, then reserve a response's
        budget from it (release it with ``_give_back``). A client that does not read
        gets nothing more read from the store for it."""
        while True:
            if self._unsent_chunk_bytes() >= MAX_QUEUED_CHUNK_BYTES:
                self._taken.clear()
                self.wake_writer()  # it takes again (and we count again) once it drained
                await self._taken.wait()
            elif self._server_budget_spent():
                await self._server_budget_freed()
            else:
                break
        budget = min(MAX_RESPONSE_CHUNK_BYTES, MAX_QUEUED_CHUNK_BYTES - self._unsent_chunk_bytes())
        server = self.budget
        if server is not None:  # what the whole server has left, but always a little
            free = server.capacity_bytes - server.in_use_bytes
            budget = min(budget, max(free, MIN_CONSUME_ROOM_BYTES))
        self._reserved_bytes += budget
        return budget

    def _server_budget_spent(self) -> bool:
        """Whether the server's budget of buffered bytes is spent while this
        connection still holds chunk bytes: then it waits for others (or its own
        client) to free some before it reads more. A connection holding nothing
        may always read a little, so every consumer makes progress."""
        server = self.budget
        return server is not None and server.spent and self._unsent_chunk_bytes() > 0

    async def _server_budget_freed(self) -> None:
        assert self.budget is not None
        freed = asyncio.Event()
        self.budget.wait(self, freed.set)
        self._taken.clear()
        self.wake_writer()
        # Either the server's total falls, or this connection's writer takes bytes.
        waits = {asyncio.ensure_future(freed.wait()), asyncio.ensure_future(self._taken.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
            self.budget.forget(self)  # no longer waiting, whichever came first

    def queued_bytes(self) -> int:
        # Responses built and queued, not yet taken by the writer (what it took
        # is the transport's, which the loop counts itself).
        return self._queued_bytes

    def _give_back(self, budget: int) -> None:
        """A response is built (``handle`` queues its bytes next) or given up."""
        self._reserved_bytes -= budget

    def on_protocol_error(self, exc: RemoteProtocolError) -> None:
        # TANK has no error reply for a malformed request: the broker closes (tank.md#framing).
        self._release_parked()

    def on_start(self) -> None:
        self._heartbeat = asyncio.create_task(self._beat(), name="tank-heartbeat")

    async def on_close(self) -> None:
        self._release_parked()
        if self.budget is not None:
            self.budget.forget(self)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat

    async def _beat(self) -> None:
        beating = (t.ConnectionState.AWAITING_REQUEST, t.ConnectionState.OPEN)
        while True:
            await asyncio.sleep(self._heartbeat_interval_s)
            if self._conn.state not in beating:
                return
            self._conn.send(t.Ping())
            self.wake_writer()

    def _release_parked(self) -> None:
        """The peer is gone: parked consumes answer now instead of holding the connection."""
        for waiter in self._parked:
            waiter.close()

    # ------------------------------------------------------------------ auth

    @property
    def access(self) -> ConnectionAccess:
        """What the client may do (``server/authz.py``), known once the connection started."""
        if self._access is None:
            self._access = ConnectionAccess.of(self._auth, self.name, self.peer, self.peer_cert)
        return self._access

    def _allowed(self, topic: str | None, needed: Permission) -> bool:
        """Whether the client holds ``needed`` on ``topic``'s stream (None: on the
        TANK scope); a refusal is counted and logged. Free with auth off."""
        if self._auth is None:
            return True
        refusal = self.access.check(self._resource(topic), needed)
        if refusal is not None:
            self.access.note_refusal(refusal)
        return refusal is None

    def _resource(self, topic: str | None) -> str:
        scope = self._broker.scope
        if topic is None:
            return scope_resource(scope)
        named = stream_of(topic)  # SCOPE.STREAM: any stream (docs/interop.md#tank)
        if named is not None:
            return stream_resource(*named)
        return stream_resource(scope, stream_name(topic))

    def _readable_topics(self) -> list[tuple[str, int, bool]]:
        """The broker's topics that the client may read (all with auth off)."""
        topics = self._broker.topics()
        if self._auth is None:
            return topics
        access = self.access
        return [e for e in topics if access.may(self._resource(e[0]), Permission.READ)]

    # ------------------------------------------------------------------ produce

    async def produce(self, request: t.Request) -> t.Response:
        """Issue the request's appends in order with the produces before it, then
        answer once they are durable.

        The common case issues them in this coroutine's first step (every topic
        known, no produce before it still waiting to issue). A produce that must
        wait first (a topic to look up, or a produce before it that waits) holds
        the connection's ``_issuing`` future until it has issued: the produces
        behind it wait for that (not for its sync), so none overtakes it.
        """
        assert isinstance(request, t.Produce | t.ProduceWithSeqnum)
        broker = self._broker
        issued: asyncio.Future[None] | None = None
        try:
            before = self._issuing
            if before is not None:
                issued = self._hold_issuing()
                await asyncio.shield(before)
            topics: list[t.ProduceTopicResult] = []
            counts: list[int] = []
            jobs: list[Coroutine[Any, None, None]] = []
            for topic in request.topics:
                if not self._allowed(topic.name, Permission.READ_UPDATE):
                    topics.append(t.ProduceTopicResult(topic.name, (), t.ProduceError.READ_ONLY))
                    counts.append(0)
                    continue
                count = broker.partitions_count(topic.name)
                if count is None:  # a miss only: the hot path makes no coroutine
                    if issued is None:
                        issued = self._hold_issuing()
                    count = await broker.known_partitions(topic.name)
                if count is None or broker.is_read_only(topic.name):
                    error = (
                        t.ProduceError.UNKNOWN_TOPIC if count is None else t.ProduceError.READ_ONLY
                    )
                    topics.append(t.ProduceTopicResult(topic.name, (), error))
                    counts.append(0)
                    continue
                topics.append(t.ProduceTopicResult(topic.name, ()))
                counts.append(count)
                for p in topic.partitions:
                    if p.partition_id < count:
                        bundle, first = p.bundle, p.first_seq_num
                        jobs.append(broker.append(topic.name, p.partition_id, bundle, first))
            # One partition (the common case) is awaited as it is: no task. Several
            # are issued now, in order, and append side by side (one sync for all).
            waits: Sequence[Awaitable[None]] = jobs
            if len(jobs) > 1 or issued is not None:
                waits = [step_now(job) for job in jobs]
        finally:
            if issued is not None:
                self._let_go(issued)
        outcomes: list[BaseException | None] = []
        for wait in waits:
            try:
                await wait
                outcomes.append(None)
            except _FAILURES as exc:
                outcomes.append(exc)
        failures = iter(outcomes)
        results = []
        for topic, result, count in zip(request.topics, topics, counts, strict=True):
            if result.error is not t.ProduceError.OK:
                results.append(result)
                continue
            partitions = []
            for p in topic.partitions:
                if p.partition_id >= count:
                    error = t.ProduceError.UNKNOWN_PARTITION
                elif (failure := next(failures)) is None:
                    error = t.ProduceError.OK
                else:
                    where = f"producing to {topic.name}/{p.partition_id}"
                    error = _wire_code(failure, t.ProduceError, where)
                partitions.append(t.ProducePartitionResult(p.partition_id, error))
            results.append(t.ProduceTopicResult(topic.name, tuple(partitions)))
        return t.ProduceResponse(request.request_id, tuple(results))

    # ------------------------------------------------------------------ consume

    async def consume(self, request: t.Request) -> t.Response:
        assert isinstance(request, t.Consume)
        async with self._reading:
            room = await self._take_room()
            try:
                outcome = await self._consume_now(request, room)
            finally:
                self._give_back(room)
        if isinstance(outcome, t.ConsumeResponse):
            return outcome
        return await self._park(request, outcome)  # parks before its first pause

    async def _consume_now(
        self, request: t.Consume, room: int
    ) -> t.ConsumeResponse | dict[tuple[int, int], tuple[Partition, int, int]]:
        """The response if it can be answered now, else the partitions to park on;
        its chunks add up to ``room`` at most (but one bundle)."""
        broker = self._broker
        while True:
            budget = room
            topics: list[t.ConsumeTopicResult | t.ConsumeUnknownTopic] = []
            at_end: dict[tuple[int, int], tuple[Partition, int, int]] = {}
            answer_now = request.max_wait_ms == 0
            for ti, topic in enumerate(request.topics):
                readable = self._allowed(topic.name, Permission.READ)
                count = broker.partitions_count(topic.name) if readable else None
                if count is None and readable:
                    count = await broker.known_partitions(topic.name)
                if count is None:
                    topics.append(t.ConsumeUnknownTopic(topic.name, len(topic.partitions)))
                    answer_now = True
                    continue
                partitions: list[t.ConsumePartitionResult] = []
                for pi, wanted in enumerate(topic.partitions):
                    pid = wanted.partition_id
                    if pid >= count:
                        partitions.append(
                            t.ConsumePartitionResult(pid, t.ConsumeError.UNKNOWN_PARTITION)
                        )
                        answer_now = True
                        continue
                    fetch_size = min(wanted.fetch_size, t.MAX_FETCH_SIZE_BYTES)
                    try:
                        part, outcome = await broker.read(
                            topic.name, pid, wanted.seq_num, fetch_size, budget
                        )
                    except _FAILURES as exc:
                        error = _wire_code(exc, t.ConsumeError, f"reading {topic.name}/{pid}")
                        result = t.ConsumePartitionResult(pid, error)
                        answer_now = True
                    else:
                        if outcome is None:  # at the end: an empty entry unless it parks
                            at_end[(ti, pi)] = (part, part.length, part.hwm)
                            result = t.ConsumePartitionResult(
                                pid, base_seq_num=part.first_seq, high_water_mark=part.hwm
                            )
                        else:
                            result = _read_result(pid, outcome, part.hwm)
                            budget -= _chunk_size(result)
                            answer_now = True
                    partitions.append(result)
                topics.append(t.ConsumeTopicResult(topic.name, tuple(partitions)))
            if answer_now or not at_end:
                return t.ConsumeResponse(request.request_id, tuple(topics))
            # Every partition is at its end. Nothing may have arrived while we
            # looked at the others; if something did, look again.
            if any(part.length != length for part, length, _ in at_end.values()):
                continue
            return at_end

    async def _park(
        self,
        request: t.Consume,
        at_end: dict[tuple[int, int], tuple[Partition, int, int]],
    ) -> t.ConsumeResponse:
        loop = asyncio.get_running_loop()
        waiter = Waiter(min(request.min_bytes, t.MAX_MIN_BYTES))
        # Each partition with the segment offset up to which its bytes are known.
        ends = [(part, length) for part, length, _ in at_end.values()]
        self._parked.add(waiter)
        timer = loop.call_later(min(request.max_wait_ms, t.MAX_WAIT_MS) / 1000, waiter.expire)
        try:
            await self._broker.wait_for_appends(waiter, ends)
        finally:
            timer.cancel()
            self._parked.discard(waiter)
        # every partition empty, base 0 (tank.md#long-polling)
        if waiter.closed or not waiter.satisfied:
            return await self._woken_response(request, at_end, empty=True, room=0)
        async with self._reading:
            room = await self._take_room()
            try:
                return await self._woken_response(request, at_end, empty=False, room=room)
            finally:
                self._give_back(room)

    async def _woken_response(
        self,
        request: t.Consume,
        at_end: dict[tuple[int, int], tuple[Partition, int, int]],
        empty: bool,
        room: int,
    ) -> t.ConsumeResponse:
        budget = room
        topics: list[t.ConsumeTopicResult | t.ConsumeUnknownTopic] = []
        for ti, topic in enumerate(request.topics):
            partitions = []
            for pi, wanted in enumerate(topic.partitions):
                part, length, hwm = at_end[(ti, pi)]
                chunk = None
                if not empty:
                    fetch_size = min(wanted.fetch_size, t.MAX_FETCH_SIZE_BYTES)
                    try:
                        chunk = await self._broker.read_new(part, length, hwm, fetch_size, budget)
                    except _FAILURES as exc:  # no code after a wait: the client asks again
                        _note_failure(exc, f"reading {part.segment}")
                if chunk is None:
                    partitions.append(
                        t.ConsumePartitionResult(wanted.partition_id, high_water_mark=part.hwm)
                    )
                else:
                    budget -= chunk.size_bytes
                    partitions.append(_chunk_result(wanted.partition_id, chunk, part.hwm))
            topics.append(t.ConsumeTopicResult(topic.name, tuple(partitions)))
        return t.ConsumeResponse(request.request_id, tuple(topics))

    # ------------------------------------------------------------------ administration

    async def create_topic(self, request: t.Request) -> t.Response:
        assert isinstance(request, t.CreateTopic)
        if not self._allowed(None, Permission.READ_UPDATE):
            result = t.CreateTopicResult.READ_ONLY
            return t.CreateTopicResponse(request.request_id, request.topic, result)
        try:
            await self._broker.create_topic(request.topic, request.partitions_count, request.config)
        except _FAILURES as exc:
            result = _wire_code(exc, t.CreateTopicResult, f"creating topic {request.topic}")
        else:
            result = t.CreateTopicResult.CREATED
        return t.CreateTopicResponse(request.request_id, request.topic, result)

    async def discover_partitions(self, request: t.Request) -> t.Response:
        assert isinstance(request, t.DiscoverPartitions)
        broker = self._broker
        readable = self._allowed(request.topic, Permission.READ)
        count = broker.partitions_count(request.topic) if readable else None
        if count is None and readable:
            count = await broker.known_partitions(request.topic)
        if count is None:
            return t.DiscoverPartitionsResponse(request.request_id, request.topic, ())
        ids = request.partition_ids or tuple(range(count))
        entries = []
        for pid in ids:
            if pid >= count:  # only in the explicit-list form
                entries.append(t.PartitionSeqNums(error=t.DiscoverPartitionsError.SYSTEM_ERROR))
                continue
            try:
                part = await broker.partition(request.topic, pid)
            except _FAILURES as exc:
                error = _wire_code(exc, t.DiscoverPartitionsError, f"loading {request.topic}/{pid}")
                entries.append(t.PartitionSeqNums(error=error))
                continue
            entries.append(t.PartitionSeqNums(part.first_seq, part.hwm))
        return t.DiscoverPartitionsResponse(request.request_id, request.topic, tuple(entries))

    async def reload_conf(self, request: t.Request) -> t.Response:
        assert isinstance(request, t.ReloadConf)
        readable = self._allowed(request.topic, Permission.READ)
        count = self._broker.partitions_count(request.topic) if readable else None
        if count is None:
            result = t.ReloadConfResult.UNKNOWN_TOPIC
        elif request.partition_id >= count:
            result = t.ReloadConfResult.UNKNOWN_PARTITION
        else:
            result = t.ReloadConfResult.RELOADED  # there are no config files to re-read
        return t.ReloadConfResponse(request.request_id, request.topic, request.partition_id, result)

    async def status(self, request: t.Request) -> t.Response:
        assert isinstance(request, t.Status)
        broker = self._broker
        topics = self._readable_topics()
        details = t.StatusDetails(
            open_partitions=broker.open_partitions,
            open_partitions_time_us=min(broker.open_time_us, 2**32 - 1),
            startup_ts_s=broker.started_s,
            version=BROKER_VERSION,
        )
        return t.StatusResponse(
            request.request_id,
            topics_count=len(topics),
            partitions_count=sum(count for _, count, _ in topics),
            details=details,
        )

    async def discover_topics(self, request: t.Request) -> t.Response:
        assert isinstance(request, t.DiscoverTopics)
        infos = tuple(
            t.TopicInfo(name, enabled, count) for name, count, enabled in self._readable_topics()
        )
        return t.DiscoverTopicsResponse(request.request_id, infos)

    async def discover_topology(self, request: t.Request) -> t.Response:
        assert isinstance(request, t.DiscoverTopology)
        # standalone (tank.md#discover-topology)
        return t.DiscoverTopologyResponse(request.request_id)


def _chunk_bytes(response: t.ConsumeResponse) -> int:
    return sum(
        _chunk_size(p)
        for topic in response.topics
        if isinstance(topic, t.ConsumeTopicResult)
        for p in topic.partitions
    )


def _read_result(partition_id: int, read: Chunk | OutOfRange, hwm: int) -> t.ConsumePartitionResult:
    """A partition's entry for what ``TankBroker.read`` found (not at its end)."""
    if isinstance(read, OutOfRange):
        return t.ConsumePartitionResult(
            partition_id,
            t.ConsumeError.BOUNDARY_CHECK,
            high_water_mark=read.last,
            first_available_seq_num=read.first,
        )
    if not read.size_bytes:  # the response is full: the client asks again from base
        return t.ConsumePartitionResult(partition_id, base_seq_num=read.base, high_water_mark=hwm)
    return _chunk_result(partition_id, read, hwm)


def _chunk_result(partition_id: int, chunk: Chunk, hwm: int) -> t.ConsumePartitionResult:
    if chunk.sparse:  # the first bundle carries its own seq nums (tank.md#consume)
        return _PartsResult(
            partition_id,
            t.ConsumeError.SPARSE_BUNDLE,
            high_water_mark=hwm,
            parts=tuple(chunk.parts),
            size_bytes=chunk.size_bytes,
        )
    return _PartsResult(
        partition_id,
        base_seq_num=chunk.base,
        high_water_mark=hwm,
        parts=tuple(chunk.parts),
        size_bytes=chunk.size_bytes,
    )


_WireCode = t.ProduceError | t.ConsumeError | t.CreateTopicResult | t.DiscoverPartitionsError
"""A code a TANK response carries for one part of a request."""

_Code = TypeVar(
    "_Code", t.ProduceError, t.ConsumeError, t.CreateTopicResult, t.DiscoverPartitionsError
)

ERROR_CODES: Final[tuple[tuple[type[HeadraceError], _WireCode], ...]] = (
    # what the model refuses (tank.md#broker-produce, tank.md#broker-admin)
    (InvalidBundle, t.ProduceError.INVALID_SEQ_NUMS),  # the C++ client's "invalid request"
    (InvalidSeqNums, t.ProduceError.INVALID_SEQ_NUMS),
    (InvalidTopic, t.CreateTopicResult.INVALID_REQUEST),
    (InvalidTopicConfig, t.CreateTopicResult.INVALID_CONFIG),
    # what the controller refuses when a topic is created
    (StreamExists, t.CreateTopicResult.ALREADY_EXISTS),
    (TooMany, t.CreateTopicResult.SYSTEM_ERROR),
    (ControllerError, t.CreateTopicResult.INVALID_REQUEST),  # InvalidArgument: partitions
    # a partition whose owner (another node) cannot be reached now has no leader:
    # the cluster code a client retries on
    (OwnerUnavailable, t.ProduceError.NO_LEADER),
    (OwnerUnavailable, t.ConsumeError.NO_LEADER),
    (OwnerUnavailable, t.DiscoverPartitionsError.NO_LEADER),
    # what the store fails with (logged; the client may try again)
    (StoreError, t.ProduceError.IO_FAULT),
    (StoreError, t.ConsumeError.SYSTEM_ERROR),
    (StoreError, t.CreateTopicResult.SYSTEM_ERROR),
    (StoreError, t.DiscoverPartitionsError.SYSTEM_ERROR),
)
"""Error -> the TANK code that answers the part of a request it failed (a
partition of a produce or consume, a topic to create, a partition to
discover): the first row whose error class matches and whose code is of the
response's kind. Only codes TANK defines; anything else raised is a bug and
propagates. A consume woken from its wait answers a failed read with an empty
entry instead (``_woken_response``)."""

_FAILURES: Final = tuple({error: None for error, _ in ERROR_CODES})
"""The error classes ``ERROR_CODES`` answers, for ``except``."""


def _note_failure(exc: BaseException, what: str) -> None:
    """Log a store failure (``what`` failed); re-raise what ``ERROR_CODES`` does not name."""
    if not isinstance(exc, _FAILURES):
        raise exc
    if isinstance(exc, StoreError):
        log.warning("tank: %s failed: %s", what, exc)


def _wire_code(exc: BaseException, kind: type[_Code], what: str) -> _Code:
    """The code of ``kind`` that ``ERROR_CODES`` gives ``exc``; a store failure
    is logged. Raises ``exc`` if no row answers it with a code of ``kind``."""
    _note_failure(exc, what)
    for error, code in ERROR_CODES:
        if isinstance(exc, error) and isinstance(code, kind):
            return code
    raise exc


DISPATCH: dict[type, Handler] = {
    t.Produce: TankHandler.produce,
    t.ProduceWithSeqnum: TankHandler.produce,
    t.Consume: TankHandler.consume,
    t.CreateTopic: TankHandler.create_topic,
    t.DiscoverPartitions: TankHandler.discover_partitions,
    t.ReloadConf: TankHandler.reload_conf,
    t.Status: TankHandler.status,
    t.DiscoverTopics: TankHandler.discover_topics,
    t.DiscoverTopology: TankHandler.discover_topology,
}
"""Request type -> the coroutine that answers it. Ping gets no reply (tank.md#message-ids)."""

_INLINE_REQUESTS: frozenset[type] = frozenset({t.Produce, t.ProduceWithSeqnum})
"""Requests whose handling starts in the read loop (``TankHandler.inline``)."""


async def start_tank(ctx: ListenerContext, host: str, port: int) -> Listener:
    """Serve the TANK protocol on (host, port) over ``ctx.store``, over TLS when a
    certificate is configured (TANK has no credentials: with auth on, the
    client certificate says who the client is).

    Raises:
        OSError: the address could not be bound.
    """
    scope = ctx.config.tank_scope
    if not is_valid_name(scope):
        raise ConfigError(f"--tank-scope {scope!r} is not a valid scope name")
    name = ctx.listener_name("tank")
    shared = ctx.door_state.get("tank")
    if isinstance(shared, TankBroker):
        # Another listener of the door started the broker: one set of partitions
        # and sequence numbers, whichever listener a client came in on.
        return await _listen(ctx, shared, name, host, port)
    broker = TankBroker(ctx.store, ctx.controller, scope)
    broker.skipped = ctx.metrics.skipped_events.labels("tank").inc
    ctx.door_state["tank"] = broker
    starting: asyncio.Task[None] | None = None
    if ctx.cluster is None:
        await broker.start()
    else:
        # The scope and the seq-num table are reachable once this node joined
        # and a leader serves the metadata, after every door is bound.
        starting = asyncio.create_task(_start_in_cluster(broker), name="tank broker start")
    listener = await _listen(ctx, broker, name, host, port)
    if starting is None:
        return listener

    async def aclose() -> None:
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        await listener.aclose()

    return Listener(listener.name, listener.port, aclose)


async def _listen(
    ctx: ListenerContext, broker: TankBroker, name: str, host: str, port: int
) -> Listener:
    """One TANK listener in front of ``broker``."""
    return await start_tcp_listener(
        name,
        host,
        port,
        lambda: TankHandler(broker, auth=ctx.door_auth, listener=name),
        settings=ctx.settings,
        first_request_timeout_s=ctx.config.tank_first_request_timeout_s,
        ssl_context=ctx.ssl_context(),
    )


async def _start_in_cluster(broker: TankBroker) -> None:
    """``broker.start`` retried until the cluster answers (its first failure logged)."""
    failure = ""
    while True:
        try:
            await broker.start()
        except (OwnerUnavailable, ControllerError) as exc:
            if str(exc) != failure:
                log.info("tank: waiting for the cluster to create scope %s: %s", broker.scope, exc)
                failure = str(exc)
            await asyncio.sleep(CLUSTER_START_RETRY_S)
        else:
            return
