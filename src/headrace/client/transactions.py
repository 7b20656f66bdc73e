"""Transactions: events that become visible all at once, or never.

``createTransaction`` gives a transaction id and the stream's open segments;
the controller has created one transaction segment per open segment
(``<segment>#transaction.<32 hex id>``, pravega-controller.md#naming). A
:class:`Transaction` is an :class:`~headrace.client.writer.EventWriter`
whose segment writers append to those transaction segments (same routing,
batching, event numbers and reconnect logic). ``commit()`` flushes, then asks
the controller to merge every transaction segment into its parent;
``abort()`` asks it to discard them (sealed at once, deleted later). While
open, a task pings the lease every third of it so the controller does not
abort the transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from headrace.errors import ClientError

from ._conn import ConnectionPool
from .controller import DEFAULT_TXN_LEASE_MS, ControllerClient, Segment, TxnId, TxnState
from .writer import EventWriter, _SegmentWriter

__all__ = ["Transaction", "TransactionClosedError"]

log = logging.getLogger(__name__)


class TransactionClosedError(ClientError):
    """The transaction was committed, aborted, or its segments are gone."""


class Transaction(EventWriter):
    """An open transaction on one stream. Build with :meth:`begin`."""

    def __init__(
        self,
        controller: ControllerClient,
        pool: ConnectionPool,
        scope: str,
        stream: str,
        txn_id: TxnId,
        lease_ms: int,
    ) -> None:
        super().__init__(controller, pool, scope, stream)
        self.txn_id = txn_id
        self.lease_ms = lease_ms
        self._pinger: asyncio.Task[None] | None = None

    @classmethod
    async def begin(
        cls,
        controller: ControllerClient,
        pool: ConnectionPool,
        scope: str,
        stream: str,
        *,
        lease_ms: int = DEFAULT_TXN_LEASE_MS,
    ) -> Transaction:
        """Open a transaction on ``scope/stream``."""
        txn_id, ranges = await controller.create_transaction(scope, stream, lease_ms)
        txn = cls(controller, pool, scope, stream, txn_id, lease_ms)
        txn._install(ranges)
        txn._pinger = asyncio.create_task(txn._ping(), name=f"txn ping {txn_id.hex}")
        return txn

    def _append_target(self, segment: Segment) -> str:
        return self.txn_id.segment_name(segment)

    def _segment_sealed(self, sealed: _SegmentWriter) -> None:
        # A transaction segment never moves: sealed or missing means finished.
        self._abandon(sealed, TransactionClosedError(f"transaction {self.txn_id.hex} is closed"))

    async def _ping(self) -> None:
        interval_s = self.lease_ms / 3000
        while True:
            await asyncio.sleep(interval_s)  # a lease timer, not synchronisation
            try:
                status = await self._controller.ping_transaction(
                    self.scope, self.stream, self.txn_id, self.lease_ms
                )
            except ClientError as exc:
                log.warning("pinging transaction %s failed: %s", self.txn_id.hex, exc)
                continue
            if status != "OK":
                return

    async def state(self) -> TxnState:
        return await self._controller.transaction_state(self.scope, self.stream, self.txn_id)

    async def _stop(self) -> None:
        if self._pinger is not None:
            self._pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pinger
        for w in list(self._writers.values()):
            await w.aclose()
        self._closed = True

    async def detach(self) -> TxnId:
        """Wait for every event to be stored, then let go of the transaction, open.

        Stops the lease pings and closes the segment writers without
        committing or aborting, and returns the id. Whoever holds the id (another
        process, e.g. the Spark driver committing what its tasks wrote) commits
        or aborts it through ``ControllerClient.commit_transaction`` /
        ``abort_transaction``; if nobody does, the controller aborts it once the
        lease runs out. This object accepts no more events.

        Raises:
            ClientError: an event failed (the transaction is left open: abort it).
        """
        await self.flush()
        await self._stop()
        return self.txn_id

    async def commit(self) -> None:
        """Wait for every event to be stored, then make them all visible.

        Raises:
            ClientError: an event failed (nothing is committed then: abort),
                or the controller refused.
        """
        await self.flush()
        await self._stop()
        await self._controller.commit_transaction(self.scope, self.stream, self.txn_id)

    async def abort(self) -> None:
        """Drop the transaction's events."""
        await self._stop()
        await self._controller.abort_transaction(self.scope, self.stream, self.txn_id)

    async def aclose(self) -> None:
        """Abort unless committed (``async with`` commits only if you call ``commit``)."""
        if not self._closed:
            await self.abort()
