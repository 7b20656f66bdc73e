"""Copying a container's records from its leader to its followers (``docs/replication.md``).

Theory of operation. The leader of a replicated container
(``ContainerLeader``) sets a ``CommitGate`` on its container in the disk
store: every record the container issues is shipped here, kept in a bounded
backlog, and sent to each follower that subscribed over the leader's
replication door (``ReplicationDoor``, an internal port like the transfer
door, asking for a node token signed with the cluster secret). A follower
(``ContainerFollower``) writes the records into its own copy of the
container (``DiskStore.replicate``: the same WAL, data files and recovery as
any container), waits until they are durable under its own fsync policy,
and acknowledges its durable end. The leader's commit point is the lowest
durable end among the in-sync set, its own included, and only while that
set has at least ``min_in_sync`` members (``replication_rules.commit_point``);
the gate acknowledges to the doors up to it, so every door gets the rule at
once.

Fencing: a follower knows the newest epoch of the container (from its
ZooKeeper record) and refuses a leader of an older one, at subscription and
on every batch, so a deposed leader gets no acknowledgement and can commit
nothing. Divergence: a follower subscribes with its epoch history; the
leader answers the last record the follower keeps
(``replication_rules.truncation_point``) and sends from the next one.

All the decisions are the pure rules of ``replication_rules``; this module
only moves bytes and counts acknowledgements.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Final

from headrace.cluster.replication_rules import (
    EpochHistory,
    EpochStart,
    FollowerProgress,
    begin_epoch,
    commit_point,
    extend_history,
    in_sync_after,
    truncate_history,
    truncation_point,
)
from headrace.controller.auth import TokenIssuer
from headrace.errors import OwnerUnavailable, ProtocolError, StoreError
from headrace.protocols.pravega.auth import Permission, TokenError, decode_token
from headrace.protocols.replication import (
    MAX_BATCH_BYTES,
    Ack,
    Command,
    FrameReader,
    Records,
    Refuse,
    RefuseCode,
    Start,
    Subscribe,
    encode,
)
from headrace.store.disk import DiskStore
from headrace.store.disk.format import encode_record
from headrace.store.disk.replicated import CommitGate

__all__ = [
    "DEFAULT_MIN_IN_SYNC",
    "DEFAULT_REPLICA_LAG_MAX_S",
    "MAX_BACKLOG_BYTES",
    "MAX_REPLICATION_CONNECTIONS",
    "REPLICATION_DOOR",
    "REPLICATION_IDLE_TIMEOUT_S",
    "ContainerFollower",
    "ContainerLeader",
    "ReplicationDoor",
    "ReplicationRefused",
]

log = logging.getLogger(__name__)

REPLICATION_DOOR: Final = "replication"
"""The door name of the replication port in ``/nodes/<id>``."""

MAX_BACKLOG_BYTES: Final = 64 * 1024 * 1024
"""Record bytes a leader keeps in memory for followers that are behind: a
follower further behind than this is refused (``CATCH_UP_TOO_FAR``)."""

MAX_REPLICATION_CONNECTIONS: Final = 1024
"""Follower connections one node serves at once: one per container it leads
and follower (1024 containers at most, a handful of copies each)."""

REPLICATION_IDLE_TIMEOUT_S: Final = 30.0
"""How long a subscription may take to arrive, and a connection may wait on a
peer that reads nothing."""

DEFAULT_MIN_IN_SYNC: Final = 2
"""In-sync copies a container needs to acknowledge (``--min-insync``, capped
by the factor): one more than the leader, so one disk lost loses nothing."""

DEFAULT_REPLICA_LAG_MAX_S: Final = 10.0
"""How long an in-sync follower may stay behind the leader's end before it
leaves the in-sync set (``--replica-lag-max-s``), as Kafka's default."""

NODE_TOKEN_TTL_S: Final = 300
"""Life of the node token a follower signs for one subscription."""

_frames = FrameReader()


class ReplicationRefused(Exception):
    """The other side refused or broke the replication connection."""

    def __init__(self, code: RefuseCode, reason: str) -> None:
        super().__init__(f"{code.name}: {reason}")
        self.code = code
        self.reason = reason


async def _read(reader: asyncio.StreamReader) -> Command:
    kind, size = _frames.body_size(await reader.readexactly(_frames.header_size))
    return _frames.decode(kind, await reader.readexactly(size))


def _send(writer: asyncio.StreamWriter, command: Command) -> None:
    writer.writelines(encode(command))


# --------------------------------------------------------------------------- leader


@dataclass
class _Follower:
    node: str
    next_seq: int
    position: int
    caught_up_at: float
    sent: collections.deque[tuple[int, float]] = field(default_factory=collections.deque)
    """(last record of a batch, when it was sent), not acknowledged yet."""


class ContainerLeader:
    """This node leads ``container`` at ``epoch``: ship, count acks, commit.

    Args:
        store: the node's disk store, holding the container (not followed).
        container: the container.
        epoch: the epoch ZooKeeper gave this leadership.
        node_id: this node.
        in_sync: the in-sync set of the container's record (this node included).
        min_in_sync: copies that must hold a record before it is acknowledged.
        write_in_sync: writes a new in-sync set to ZooKeeper (conditional on
            the record this leadership read); True if it was written. The
            leader acts on a new set only once it is written.
        lag_max_s: ``--replica-lag-max-s``.
        live: the nodes with a ZooKeeper session now: a member whose session
            ended leaves the in-sync set at the next look, without waiting
            out the lag bound.
    """

    def __init__(
        self,
        store: DiskStore,
        container: int,
        *,
        epoch: int,
        node_id: str,
        in_sync: frozenset[str],
        min_in_sync: int,
        write_in_sync: Callable[[frozenset[str]], Awaitable[bool]] | None = None,
        lag_max_s: float = DEFAULT_REPLICA_LAG_MAX_S,
        live: Callable[[], Collection[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.container = container
        self.epoch = epoch
        self.node_id = node_id
        self.in_sync = frozenset(in_sync | {node_id})
        self.min_in_sync = min_in_sync
        self.lag_max_s = lag_max_s
        self._write_in_sync = write_in_sync
        self._live = live
        self._clock = clock
        self._began_at = clock()
        end = store.replica_end(container)
        self.history: EpochHistory = ()
        """This node's epoch history of the container, its own epoch last (``start``)."""
        self.epoch_start = end + 1
        self._backlog: collections.deque[tuple[int, list[bytes | memoryview], int]] = (
            collections.deque()
        )
        self._backlog_bytes = 0
        self._backlog_base = end
        """The last record not in the backlog (it holds records after it)."""
        self.positions: dict[str, int] = {}
        self.followers: dict[str, _Follower] = {}
        self._grown = asyncio.Event()
        self.gate = CommitGate(container, end, self._ship)
        self.gate.on_local = self._local
        self.stopped = False
        self._task: asyncio.Task[None] | None = None
        self.replicated_bytes = 0
        """Record bytes sent to followers (for the throughput metric)."""

    # ------------------------------------------------------------------ life

    async def start(self) -> None:
        """Begin the epoch in the saved history, then set the gate: from now on the
        container acknowledges at commit."""
        saved = await self.store.replica_epochs(self.container)
        history = tuple(EpochStart(e, s) for e, s in saved)
        self.history = begin_epoch(history, self.epoch, self.epoch_start - 1)
        await self.store.save_replica_epochs(
            self.container, tuple((e.epoch, e.start_seq) for e in self.history)
        )
        end = self.epoch_start - 1
        for seq, record in await self.store.read_log(self.container, 0, MAX_BACKLOG_BYTES // 2):
            self._ship(seq, encode_record(seq, record))  # for followers a little behind
        if self._backlog:
            self._backlog_base = self._backlog[0][0] - 1
        assert not self._backlog or self._backlog[-1][0] == end
        self._refuse_if_short()
        await self.store.lead(self.container, self.gate)
        self._task = asyncio.create_task(
            self._watch_in_sync(), name=f"headrace-isr-{self.container}"
        )

    def stop(self) -> None:
        """Stop leading (lost the record, the session or the lease): every append
        waiting for commit gets ``OwnerUnavailable``; followers are cut off."""
        if self.stopped:
            return
        self.stopped = True
        self.gate.fail(OwnerUnavailable(f"container {self.container}", "its leader changed; retry"))
        self._grown.set()
        if self._task is not None:
            self._task.cancel()

    @property
    def commit(self) -> int:
        return self.gate.committed_seq

    @property
    def end(self) -> int:
        return self.store.replica_end(self.container)

    # ------------------------------------------------------------------ records

    def _ship(self, seq: int, frame: list[bytes | memoryview]) -> None:
        size = sum(len(b) for b in frame)
        self._backlog.append((seq, frame, size))
        self._backlog_bytes += size
        while self._backlog_bytes > MAX_BACKLOG_BYTES and len(self._backlog) > 1:
            dropped, _, dropped_size = self._backlog.popleft()
            self._backlog_bytes -= dropped_size
            self._backlog_base = dropped
        self._grown.set()

    def _local(self, seq: int) -> None:
        self.positions[self.node_id] = seq
        self._recommit()

    def _recommit(self) -> None:
        point = commit_point(self.positions, self.in_sync, self.min_in_sync)
        if point is not None:
            self.gate.advance(point)

    def _refuse_if_short(self) -> None:
        if len(self.in_sync) < self.min_in_sync:
            self.gate.refusal = (
                f"{len(self.in_sync)} in-sync copies, {self.min_in_sync} needed; retry"
            )
        else:
            self.gate.refusal = None

    def _batch(self, first: int) -> tuple[int, list[bytes | memoryview], int] | None:
        """Records from ``first`` (up to ``MAX_BATCH_BYTES``), or None if none yet."""
        backlog = self._backlog
        if not backlog or first > backlog[-1][0]:
            return None
        index = first - backlog[0][0]
        buffers: list[bytes | memoryview] = []
        size = count = 0
        for i in range(index, len(backlog)):
            _, frame, frame_size = backlog[i]
            if count and size + frame_size > MAX_BATCH_BYTES:
                break
            buffers += frame
            size += frame_size
            count += 1
        return count, buffers, size

    # ------------------------------------------------------------------ followers

    async def serve(
        self, sub: Subscribe, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Serve one follower's subscription until it or this leadership ends."""
        history = tuple(EpochStart(e, s) for e, s in sub.history)
        keep = truncation_point(self.history, self.end, history, sub.end)
        if sub.node in self.in_sync and keep < self.commit:
            # A member back without every committed record (restarted on a
            # wiped or older disk): it must not stay electable until it caught up.
            await self._write_and_use(self.in_sync - {sub.node})
        _send(writer, Start(self.epoch, keep, self.commit))
        if keep < self._backlog_base:
            _send(
                writer,
                Refuse(
                    RefuseCode.CATCH_UP_TOO_FAR,
                    f"records after {keep} are no longer held in memory",
                ),
            )
            await writer.drain()
            return
        old = self.followers.get(sub.node)
        follower = _Follower(
            sub.node, keep + 1, keep, old.caught_up_at if old is not None else self._began_at
        )
        self.followers[sub.node] = follower
        self.positions[sub.node] = keep
        acks = asyncio.create_task(self._read_acks(follower, reader))
        try:
            await self._send_records(follower, writer, acks)
        finally:
            acks.cancel()
            with contextlib.suppress(BaseException):
                await acks

    async def _send_records(
        self, follower: _Follower, writer: asyncio.StreamWriter, acks: asyncio.Task[None]
    ) -> None:
        while not self.stopped and not acks.done():
            if follower.next_seq <= self._backlog_base:
                _send(writer, Refuse(RefuseCode.CATCH_UP_TOO_FAR, "fell behind the backlog"))
                await writer.drain()
                return
            batch = self._batch(follower.next_seq)
            if batch is None:
                self._grown.clear()
                waiter = asyncio.ensure_future(self._grown.wait())
                await asyncio.wait([waiter, acks], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                continue
            count, buffers, size = batch
            first = follower.next_seq
            _send(writer, Records(self.epoch, first, self.commit, count, b"".join(buffers)))
            follower.next_seq = first + count
            follower.sent.append((first + count - 1, self._clock()))
            self.replicated_bytes += size
            async with asyncio.timeout(REPLICATION_IDLE_TIMEOUT_S):
                await writer.drain()
        if self.stopped:
            _send(writer, Refuse(RefuseCode.NOT_LEADER, f"no longer leads at epoch {self.epoch}"))
            with contextlib.suppress(Exception):
                await writer.drain()
        elif acks.done() and not acks.cancelled():
            acks.result()

    async def _read_acks(self, follower: _Follower, reader: asyncio.StreamReader) -> None:
        while True:
            command = await _read(reader)
            if isinstance(command, Refuse):
                raise ReplicationRefused(command.code, command.reason)
            if not isinstance(command, Ack) or command.durable >= follower.next_seq:
                raise ReplicationRefused(RefuseCode.BAD_REQUEST, f"unexpected {command!r}")
            if command.durable < follower.position:
                continue
            follower.position = command.durable
            sent = follower.sent
            while sent and sent[0][0] <= command.durable:
                follower.caught_up_at = sent.popleft()[1]
            if not sent and command.durable >= self.end:
                follower.caught_up_at = self._clock()
            self.positions[follower.node] = command.durable
            self._recommit()

    async def _watch_in_sync(self) -> None:
        """Shrink and grow the in-sync set (written to ZooKeeper first)."""
        interval = max(0.05, self.lag_max_s / 4)
        while not self.stopped:
            await asyncio.sleep(interval)
            await self.check_in_sync()

    async def check_in_sync(self) -> None:
        """One look at the followers: write the in-sync set if it should change."""
        now = self._clock()
        end = self.end
        for follower in self.followers.values():
            if follower.position >= end and not follower.sent:
                follower.caught_up_at = now  # holds everything: caught up, traffic or not
        progress = {
            node: FollowerProgress(f.position, f.caught_up_at) for node, f in self.followers.items()
        }
        for node in self.in_sync - progress.keys() - {self.node_id}:
            # not heard from in this epoch: as if caught up when the epoch began
            progress[node] = FollowerProgress(self.positions.get(node, 0), self._began_at)
        if self._live is not None:
            live = self._live()
            for node in list(progress):
                if node not in live:
                    progress[node] = FollowerProgress(progress[node].position, -float("inf"))
        wanted = in_sync_after(
            now=now,
            leader=self.node_id,
            in_sync=self.in_sync,
            progress=progress,
            commit=self.commit,
            epoch_start=self.epoch_start,
            lag_max_s=self.lag_max_s,
        )
        if wanted != self.in_sync:
            await self._write_and_use(wanted)

    async def _write_and_use(self, wanted: frozenset[str]) -> None:
        """Write the in-sync set ``wanted`` to ZooKeeper, then act on it."""
        if self._write_in_sync is not None and not await self._write_in_sync(wanted):
            return  # the record changed: this leadership is over or about to be
        log.info(
            "container %d: in-sync copies %s -> %s",
            self.container,
            ",".join(sorted(self.in_sync)),
            ",".join(sorted(wanted)),
        )
        self.in_sync = wanted
        self._refuse_if_short()
        self._recommit()


# --------------------------------------------------------------------------- the door


class ReplicationDoor:
    """A node's replication port: followers subscribe here to containers it leads.

    Args:
        node_key: the key node tokens are checked with; None: none needed (tests).
    """

    def __init__(self, node_key: bytes | None) -> None:
        self._node_key = node_key
        self.leaders: dict[int, ContainerLeader] = {}
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self, host: str, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._serve, host, port)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _refusal(self, sub: Subscribe) -> Refuse | None:
        if self._node_key is not None:
            try:
                claims = decode_token(self._node_key, sub.token, now_s=time.time())
            except TokenError as exc:
                return Refuse(RefuseCode.NOT_AUTHORIZED, f"not a node token: {exc}")
            if not claims.node:
                return Refuse(RefuseCode.NOT_AUTHORIZED, "not a node token")
        leader = self.leaders.get(sub.container)
        if leader is None or leader.stopped:
            return Refuse(RefuseCode.NOT_LEADER, f"container {sub.container} is not led here")
        if sub.epoch > leader.epoch:
            return Refuse(RefuseCode.STALE_EPOCH, f"epoch {leader.epoch} is older than {sub.epoch}")
        if sub.node == leader.node_id:
            return Refuse(RefuseCode.BAD_REQUEST, "a leader does not follow itself")
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= MAX_REPLICATION_CONNECTIONS:
            log.warning(
                "replication: %d connections already; closing one more", len(self._connections)
            )
            writer.close()
            return
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        try:
            async with asyncio.timeout(REPLICATION_IDLE_TIMEOUT_S):
                sub = await _read(reader)
            if not isinstance(sub, Subscribe):
                raise ReplicationRefused(RefuseCode.BAD_REQUEST, "expected SUBSCRIBE")
            refused = self._refusal(sub)
            if refused is not None:
                log.warning("replication: refused %s: %s", peer, refused.reason)
                _send(writer, refused)
                await writer.drain()
                return
            leader = self.leaders[sub.container]
            log.info("container %d: follower %s subscribed", sub.container, sub.node)
            await leader.serve(sub, reader, writer)
        except ReplicationRefused as exc:
            log.warning("replication: %s: %s", peer, exc)
            with contextlib.suppress(Exception):
                _send(writer, Refuse(exc.code, exc.reason))
        except (ProtocolError, OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.warning("replication: %s: %s", peer, exc or type(exc).__name__)
        except asyncio.CancelledError:
            pass  # the door closes (``aclose``): the task ends here, as the connection
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


# --------------------------------------------------------------------------- follower


class ContainerFollower:
    """This node follows ``container``: copy the leader's records into its own copy.

    ``run`` subscribes to the leader's replication door and writes what it
    sends until the connection ends, then raises ``ReplicationRefused`` (or
    an OS error); the caller reconnects to whichever node ZooKeeper names.

    Args:
        epoch: the newest epoch of the container this node knows; raise it
            with ``fence`` when ZooKeeper shows a newer one.
    The follower's epoch history is the one saved with its copy
    (``DiskStore.replica_epochs``), extended and saved again before the
    first record of each new epoch is written.
    """

    def __init__(
        self,
        store: DiskStore,
        container: int,
        *,
        node_id: str,
        epoch: int,
        node_key: bytes | None,
    ) -> None:
        self.store = store
        self.container = container
        self.node_id = node_id
        self.epoch = epoch
        self.history: EpochHistory = ()
        self._node_key = node_key
        self.commit = 0
        """The leader's commit point, as last heard."""
        self.durable = store.replica_end(container)
        self.replicated_bytes = 0

    def fence(self, epoch: int) -> None:
        """ZooKeeper shows ``epoch``: refuse records of any older one from now on."""
        self.epoch = max(self.epoch, epoch)

    async def run(self, host: str, port: int) -> None:
        """Follow the leader at ``host:port`` until the connection ends."""
        self.store.follow(self.container)
        token = ""
        if self._node_key is not None:
            issuer = TokenIssuer(self._node_key, NODE_TOKEN_TTL_S)
            token = issuer.issue(self.node_id, "prn::/*", Permission.READ_UPDATE, node=True)
        saved = await self.store.replica_epochs(self.container)
        self.history = tuple(EpochStart(e, s) for e, s in saved)
        async with asyncio.timeout(REPLICATION_IDLE_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port)
        try:
            end = self.store.replica_end(self.container)
            history = tuple((e.epoch, e.start_seq) for e in self.history)
            _send(writer, Subscribe(self.container, self.epoch, end, history, self.node_id, token))
            await writer.drain()
            start = await _read(reader)
            if isinstance(start, Refuse):
                raise ReplicationRefused(start.code, start.reason)
            if not isinstance(start, Start):
                raise ReplicationRefused(RefuseCode.BAD_REQUEST, f"expected START, got {start!r}")
            self._check_epoch(start.epoch, writer)
            if start.keep < end:
                if not await self.store.rewind(self.container, start.keep):
                    refusal = Refuse(
                        RefuseCode.DIVERGED,
                        f"holds records {start.keep + 1}..{end} the leader does not, "
                        "checkpointed: the copy must be replaced whole",
                    )
                    _send(writer, refusal)
                    raise ReplicationRefused(refusal.code, refusal.reason)
                self.history = truncate_history(self.history, start.keep)
                await self.store.save_replica_epochs(
                    self.container, tuple((e.epoch, e.start_seq) for e in self.history)
                )
                self.durable = start.keep
            await self._copy(reader, writer)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _check_epoch(self, epoch: int, writer: asyncio.StreamWriter) -> None:
        if epoch < self.epoch:
            refusal = Refuse(RefuseCode.STALE_EPOCH, f"epoch {epoch} is older than {self.epoch}")
            _send(writer, refusal)
            raise ReplicationRefused(refusal.code, refusal.reason)
        self.epoch = epoch

    async def _copy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        written: asyncio.Queue[int] = asyncio.Queue()
        acks = asyncio.create_task(self._ack(written, writer))
        read: asyncio.Future[Command] | None = None
        try:
            while True:
                read = asyncio.ensure_future(_read(reader))
                done, _ = await asyncio.wait([read, acks], return_when=asyncio.FIRST_COMPLETED)
                if read not in done:
                    read.cancel()
                    acks.result()
                command = read.result()
                if isinstance(command, Refuse):
                    raise ReplicationRefused(command.code, command.reason)
                if not isinstance(command, Records):
                    raise ReplicationRefused(RefuseCode.BAD_REQUEST, f"unexpected {command!r}")
                self._check_epoch(command.epoch, writer)
                self.commit = max(self.commit, command.commit)
                if command.count == 0:
                    continue
                try:
                    history = extend_history(self.history, command.epoch, command.first)
                    if history != self.history:  # saved before any record of the epoch
                        await self.store.save_replica_epochs(
                            self.container, tuple((e.epoch, e.start_seq) for e in history)
                        )
                        self.history = history
                    last = self.store.replicate(self.container, command.first, command.frames)
                except (ValueError, StoreError) as exc:
                    refusal = Refuse(RefuseCode.BAD_REQUEST, str(exc))
                    _send(writer, refusal)
                    raise ReplicationRefused(refusal.code, refusal.reason) from None
                self.replicated_bytes += len(command.frames)
                written.put_nowait(last)
        finally:
            if read is not None and not read.done():
                read.cancel()
            elif read is not None and not read.cancelled():
                read.exception()  # seen: the connection ends either way
            acks.cancel()
            with contextlib.suppress(BaseException):
                await acks

    async def _ack(self, written: asyncio.Queue[int], writer: asyncio.StreamWriter) -> None:
        while True:
            seq = await written.get()
            while not written.empty():
                seq = written.get_nowait()
            await self.store.replica_durable(self.container, seq)
            self.durable = seq
            _send(writer, Ack(seq))
            await writer.drain()
