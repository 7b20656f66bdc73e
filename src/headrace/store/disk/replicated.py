"""The commit gate: a replicated container acknowledges only what its replicas hold.

A container led by this node in a replicated cluster has a ``CommitGate``
(``DiskStore.lead``). Every record the container issues is handed to the
gate (``issued``: the replication side ships it to the followers), and every
wait for durability (``Container.durable`` and ``barrier``, through which
every door's append, create, seal, truncate and attribute update passes)
waits for two things: the record is durable here under the fsync policy, and
the gate has been told it is committed (``advance``: every in-sync replica
holds it durably, ``docs/replication.md``). The effects that make a record
visible (a segment's readable length, a seal) run only at commit, in record
order, so reads never return data above the committed point and tail reads
wake on commit.

The gate knows nothing of the network or of ZooKeeper: the replication side
(``headrace.cluster.replication``) feeds it. Without a gate (one copy, or a
single node) a container takes today's path, at no extra cost.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

from headrace.errors import OwnerUnavailable
from headrace.store.disk.format import Record, encode_record

__all__ = ["CommitGate"]


class CommitGate:
    """Holds back the acknowledgements of one container until commit.

    Args:
        container_id: for errors.
        committed: the last record already committed when the gate is set.
        ship: called synchronously, in record order, with each issued
            record's number and WAL frame (the append's data included, never
            a reference into a data file).
    """

    def __init__(
        self,
        container_id: int,
        committed: int,
        ship: Callable[[int, list[bytes | memoryview]], None],
    ) -> None:
        self.container_id = container_id
        self.committed_seq = committed
        self.local_seq = committed
        """The last record durable on this node's own disk."""
        self._ship = ship
        self._effects: list[tuple[int, int, Callable[[], None]]] = []
        self._tie = itertools.count()
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self.refusal: str | None = None
        """Why new records are refused right now (fewer than min in-sync copies)."""
        self.failure: BaseException | None = None
        self.on_local: Callable[[int], None] | None = None
        """Told each time ``local_seq`` grows (the leader's own position counts)."""

    # ------------------------------------------------------------------ issuing

    def check_writable(self) -> None:
        """Raise a retriable error if records are refused now."""
        if self.failure is not None:
            raise self.failure
        if self.refusal is not None:
            raise OwnerUnavailable(f"container {self.container_id}", self.refusal)

    def issued(self, seq: int, record: Record) -> None:
        """Record ``seq`` was issued: ship it (its full frame, data included)."""
        self._ship(seq, encode_record(seq, record))

    def local_durable(self, seq: int) -> None:
        """Records up to ``seq`` are durable on this node."""
        if seq > self.local_seq:
            self.local_seq = seq
            if self.on_local is not None:
                self.on_local(seq)

    # ------------------------------------------------------------------ committing

    def on_commit(self, seq: int, effect: Callable[[], None]) -> None:
        """Run ``effect`` once record ``seq`` is committed (at once if it is)."""
        if seq <= self.committed_seq:
            effect()
        else:
            heapq.heappush(self._effects, (seq, next(self._tie), effect))

    async def wait(self, seq: int) -> None:
        """Return once record ``seq`` is committed.

        Raises:
            OwnerUnavailable (or the gate's failure): this node stopped leading
                before the record was committed; it may or may not be kept.
        """
        if seq <= self.committed_seq:
            return
        if self.failure is not None:
            raise self.failure
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (seq, next(self._tie), future))
        await future

    def advance(self, seq: int) -> None:
        """Records up to ``seq`` are committed: run their effects, wake their waiters."""
        if seq <= self.committed_seq or self.failure is not None:
            return
        self.committed_seq = seq
        effects, waiters = self._effects, self._waiters
        while effects and effects[0][0] <= seq:
            heapq.heappop(effects)[2]()
        while waiters and waiters[0][0] <= seq:
            future = heapq.heappop(waiters)[2]
            if not future.done():
                future.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """This node stopped leading: every waiter and every later record gets ``exc``."""
        if self.failure is not None:
            return
        self.failure = exc
        self._effects.clear()
        waiters, self._waiters = self._waiters, []
        for _, _, future in waiters:
            if not future.done():
                future.set_exception(exc)
