"""``ClusterModel``: the controller metadata of a cluster, with one writer at a time.

In a cluster the controller's tables (``controller/records.py``) are
segments like any other: they live in the system container, at its owner,
and every node reaches them through its ``RoutedStore``. A
``ControllerModel`` assumes it is the only writer of those tables (every
change is a conditional update against the version its mirror holds), so
exactly one node writes them: the cluster leader. ``ClusterModel`` is the
model every node's front doors share, in one of two modes:

* **Leading**: this node is the leader. The model was loaded from the
  tables when the node became leader (and finished what an earlier leader
  left half-done, as a restart does), and works as a single node's model:
  every change is written here, and the periodic jobs (transaction sweep,
  retention, auto-scaling) run here.
* **Following**: another node leads (or none yet). The mirror is a copy,
  reloaded whenever the tables grew (``FOLLOW_INTERVAL_S``); the changes a
  front door asks for (TANK and Lumberjack create scopes and streams) are
  sent to the leader's controller over gRPC, after which the mirror is
  reloaded, so the door sees what it created. Every other change raises
  ``OwnerUnavailable`` (retriable): on a follower the gRPC controller itself
  forwards every call to the leader (``server/controller_proxy.py``), so only
  the doors ask, and they ask for nothing else. The periodic jobs do nothing.

``run`` switches between the modes as ZooKeeper's election says
(``docs/cluster.md#metadata``). A new leader serves metadata only once it
has loaded the tables: until then a follower's request gets the retriable
answer, and the leader's own gRPC controller answers ``UNAVAILABLE``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final, TypeVar

from headrace.client._conn import RetryPolicy
from headrace.client.controller import ControllerClient
from headrace.client.tls import TlsOptions
from headrace.controller.errors import ScopeExists, StreamExists
from headrace.controller.groups import ReaderGroupRecord
from headrace.controller.model import ControllerModel, SweepResult, wall_clock_ms
from headrace.controller.naming import TxnId
from headrace.controller.records import (
    METADATA_TABLES,
    KeyValueTableConfig,
    SegmentRecord,
    StreamConfig,
    TxnRecord,
    TxnState,
)
from headrace.errors import (
    ConnectionLost,
    OwnerUnavailable,
    RequestTimeout,
    SegmentNotFound,
    ServerError,
    StoreClosed,
    StoreError,
)
from headrace.store.api import SegmentStore

__all__ = [
    "FOLLOW_INTERVAL_S",
    "LEADER_CALL_TIMEOUT_S",
    "MIN_REFRESH_INTERVAL_S",
    "ClusterModel",
    "LeaderAddress",
]

log = logging.getLogger(__name__)

FOLLOW_INTERVAL_S: Final = 0.2
"""How often a follower asks whether the metadata tables grew (four table-info
calls to the system container's owner): how stale a follower's view of
streams created elsewhere may be."""

MIN_REFRESH_INTERVAL_S: Final = 0.05
"""Least time between two reloads a door asks for (``refresh``, on a name it
does not know): a client asking for unknown names cannot make this node read
the tables more than twenty times a second."""

LEADER_CALL_TIMEOUT_S: Final = 10.0
"""Deadline of a change a follower sends to the leader's controller."""

LEADER_CALL_RETRY: Final = RetryPolicy(initial_delay_s=0.05, max_delay_s=0.5, max_attempts=4)
"""Attempts at reaching the leader's controller before the change is refused as
retriable: a leader that just died is not waited for here (the caller retries)."""

RETRY_INTERVAL_S: Final = 0.5
"""Wait before loading the tables again after the system container was
unavailable (a move, its owner restarting)."""

METADATA_NAME: Final = "_system/controller"
"""The name the retriable errors of the metadata carry."""

LeaderAddress = Callable[[], tuple[str, int] | None]
"""The leader's controller ``(host, port)``; None while no other node leads."""

_T = TypeVar("_T")


class ClusterModel(ControllerModel):
    """The controller model of one node of a cluster: leading or following.

    Build it unopened (an empty mirror, following); ``run`` loads it and
    keeps its mode.

    Args:
        store: the node's ``RoutedStore`` (the tables live at their owner).
        leader_controller: where the leader's controller is, for a follower's changes.
        tls: how to reach the leader's controller; None: plaintext.
        authorization: the ``authorization`` value of each call to the leader's
            controller (a node token, with auth on); None: no credentials.
    """

    def __init__(
        self,
        store: SegmentStore,
        *,
        leader_controller: LeaderAddress,
        tls: TlsOptions | None = None,
        authorization: Callable[[], str] | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        super().__init__(store, clock_ms=clock_ms)
        self._leader_controller = leader_controller
        self._tls = tls
        self._authorization = authorization
        self._leading = False
        self._loaded = False
        self._seen: tuple[int, ...] | None = None
        self._wake = asyncio.Event()
        self._client: ControllerClient | None = None
        self._client_target: tuple[str, int] | None = None
        self._failure: str | None = None
        self._refreshing: asyncio.Future[None] | None = None
        self._refreshed_at = -MIN_REFRESH_INTERVAL_S

    # ------------------------------------------------------------------ mode

    @property
    def leading(self) -> bool:
        """True once this node, as leader, has loaded the tables and writes them."""
        return self._leading

    @property
    def loaded(self) -> bool:
        """True once the mirror holds the tables (as leader or follower)."""
        return self._loaded

    def wake(self) -> None:
        """Look at the mode (and the tables) now: the leader changed."""
        self._wake.set()

    async def run(self, is_leader: Callable[[], bool]) -> None:
        """Keep the mode ``is_leader`` says, and a follower's mirror fresh, until
        cancelled or the store closes."""
        while True:
            delay = FOLLOW_INTERVAL_S
            try:
                if is_leader():
                    if not self._leading:
                        await self._promote()
                else:
                    if self._leading:
                        self._leading = False
                        log.info("cluster metadata: no longer the leader; following")
                    await self._follow()
                self._failure = None
            except StoreClosed:
                return
            except StoreError as exc:
                if self._failure != str(exc):
                    log.warning("cluster metadata: cannot load the tables now: %s", exc)
                    self._failure = str(exc)
                delay = RETRY_INTERVAL_S
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    async def aclose(self) -> None:
        """Close the connection to the leader's controller."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _promote(self) -> None:
        """Load the tables as their writer (creating them on a new cluster) and
        finish what a previous leader left half-done, then lead."""
        fresh = ControllerModel(self._store, clock_ms=self._clock_ms)
        await fresh._load()
        await fresh._repair()
        self._adopt(fresh)
        self._leading = self._loaded = True
        self._seen = None
        log.info(
            "cluster metadata: leading (%d scopes, %d streams)",
            len(self._scopes),
            len(self._streams),
        )

    async def refresh(self) -> None:
        """A follower reloads now if the tables grew (concurrent callers share
        one reload); the leader's mirror is current. Failures are the next
        periodic reload's to report."""
        if self._leading:
            return
        pending = self._refreshing
        if pending is None:
            now = asyncio.get_running_loop().time()
            if now - self._refreshed_at < MIN_REFRESH_INTERVAL_S:
                return  # looked a moment ago: clients asking for unknown names cost no more
            self._refreshed_at = now
            pending = self._refreshing = asyncio.ensure_future(self._follow())
            pending.add_done_callback(self._refreshed)
        with contextlib.suppress(StoreError):
            await asyncio.shield(pending)

    def _refreshed(self, done: asyncio.Future[None]) -> None:
        self._refreshing = None
        if not done.cancelled():
            done.exception()  # retrieved: the caller saw it, or did not need it

    async def _follow(self) -> None:
        """Reload the mirror if the tables grew since it was loaded."""
        lengths = await self._lengths()
        if lengths == self._seen:
            return
        fresh = ControllerModel(self._store, clock_ms=self._clock_ms)
        await fresh._load(create=False)
        self._adopt(fresh)
        self._seen = lengths
        self._loaded = True

    async def _lengths(self) -> tuple[int, ...]:
        """Each table's length: a table only grows, so equal lengths mean no change."""
        lengths = []
        for table in METADATA_TABLES:
            try:
                lengths.append((await self._store.table_info(table)).length)
            except SegmentNotFound:
                lengths.append(-1)
        return tuple(lengths)

    # ------------------------------------------------------------------ at the leader

    async def _at_leader(self, call: Callable[[ControllerClient], Awaitable[_T]]) -> _T:
        """Run ``call`` on the leader's controller, then reload the mirror.

        Raises:
            OwnerUnavailable: no leader now, or it could not be reached.
            ControllerError: the leader refused the change.
        """
        target = self._leader_controller()
        if target is None:
            raise OwnerUnavailable(METADATA_NAME, "no node leads the cluster now")
        if self._client is None or self._client_target != target:
            old, self._client = self._client, None
            if old is not None:
                await old.aclose()
            self._client = ControllerClient(
                f"tcp://{target[0]}:{target[1]}",
                timeout_s=LEADER_CALL_TIMEOUT_S,
                retry=LEADER_CALL_RETRY,
                tls=self._tls,
                authorization=self._authorization,
            )
            self._client_target = target
        try:
            result = await call(self._client)
        except (ConnectionLost, RequestTimeout) as exc:
            raise OwnerUnavailable(METADATA_NAME, f"the leader's controller: {exc}") from exc
        except ServerError as exc:
            raise OwnerUnavailable(METADATA_NAME, f"the leader's controller: {exc}") from exc
        await self._follow()
        return result

    def _following(self) -> OwnerUnavailable:
        return OwnerUnavailable(METADATA_NAME, "this node does not lead the cluster now")

    # ------------------------------------------------------------------ changes

    async def create_scope(self, scope: str) -> None:
        """As ``ControllerModel.create_scope``; a follower asks the leader."""
        if self._leading:
            return await super().create_scope(scope)
        if not await self._at_leader(lambda client: client.create_scope(scope)):
            raise ScopeExists(scope)

    async def create_stream(self, scope: str, stream: str, config: StreamConfig) -> None:
        """As ``ControllerModel.create_stream``; a follower asks the leader."""
        if self._leading:
            return await super().create_stream(scope, stream, config)
        if not await self._at_leader(lambda client: client.create_stream(scope, stream, config)):
            raise StreamExists(scope, stream)

    async def delete_scope(self, scope: str) -> None:
        if not self._leading:
            raise self._following()
        await super().delete_scope(scope)

    async def update_stream(self, scope: str, stream: str, config: StreamConfig) -> None:
        if not self._leading:
            raise self._following()
        await super().update_stream(scope, stream, config)

    async def seal_stream(self, scope: str, stream: str) -> None:
        if not self._leading:
            raise self._following()
        await super().seal_stream(scope, stream)

    async def delete_stream(self, scope: str, stream: str) -> None:
        if not self._leading:
            raise self._following()
        await super().delete_stream(scope, stream)

    async def scale(
        self,
        scope: str,
        stream: str,
        sealed: Sequence[int],
        new_ranges: Sequence[tuple[float, float]],
    ) -> tuple[int, list[SegmentRecord]]:
        if not self._leading:
            raise self._following()
        return await super().scale(scope, stream, sealed, new_ranges)

    async def create_txn(
        self, scope: str, stream: str, lease_ms: int
    ) -> tuple[TxnRecord, list[SegmentRecord]]:
        if not self._leading:
            raise self._following()
        return await super().create_txn(scope, stream, lease_ms)

    async def truncate_stream(self, scope: str, stream: str, cut: Mapping[int, int]) -> None:
        if not self._leading:
            raise self._following()
        await super().truncate_stream(scope, stream, cut)

    async def commit_txn(
        self, scope: str, stream: str, txn: TxnId, *, writer_id: str = "", timestamp: int = 0
    ) -> None:
        if not self._leading:
            raise self._following()
        await super().commit_txn(scope, stream, txn, writer_id=writer_id, timestamp=timestamp)

    async def abort_txn(self, scope: str, stream: str, txn: TxnId) -> None:
        if not self._leading:
            raise self._following()
        await super().abort_txn(scope, stream, txn)

    def ping_txn(self, scope: str, stream: str, txn: TxnId, lease_ms: int) -> TxnState:
        if not self._leading:
            raise self._following()
        return super().ping_txn(scope, stream, txn, lease_ms)

    async def create_kvtable(self, scope: str, table: str, config: KeyValueTableConfig) -> None:
        if not self._leading:
            raise self._following()
        await super().create_kvtable(scope, table, config)

    async def delete_kvtable(self, scope: str, table: str) -> None:
        if not self._leading:
            raise self._following()
        await super().delete_kvtable(scope, table)

    async def create_reader_group(self, template: ReaderGroupRecord) -> ReaderGroupRecord:
        if not self._leading:
            raise self._following()
        return await super().create_reader_group(template)

    async def update_reader_group(self, new: ReaderGroupRecord) -> int:
        if not self._leading:
            raise self._following()
        return await super().update_reader_group(new)

    async def delete_reader_group(self, scope: str, group: str, group_id: str) -> None:
        if not self._leading:
            raise self._following()
        await super().delete_reader_group(scope, group, group_id)

    async def update_subscriber_cut(
        self,
        scope: str,
        stream: str,
        subscriber: str,
        group_id: str,
        generation: int,
        cut: Mapping[int, int],
    ) -> None:
        if not self._leading:
            raise self._following()
        await super().update_subscriber_cut(scope, stream, subscriber, group_id, generation, cut)

    # ------------------------------------------------------------------ periodic jobs

    async def sweep(self) -> SweepResult:
        """The leader's sweep; a follower's does nothing."""
        if not self._leading:
            return SweepResult(aborted=0, purged=0)
        return await super().sweep()

    async def enforce_retention(self) -> int:
        if not self._leading:
            return 0
        return await super().enforce_retention()

    async def auto_scale(self) -> int:
        if not self._leading:
            return 0
        return await super().auto_scale()
