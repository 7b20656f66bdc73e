"""The sink's transactions: written by tasks, committed once per batch by the driver."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headrace.client import PravegaClient, TxnId
from headrace.client.errors import ControllerError, TableKeyVersionError
from headrace.client.kvtable import NOT_EXISTS, KeyValueTable
from headrace.client.transactions import Transaction
from headrace.errors import HeadraceError

from ._connect import Target, run, split_name
from .options import COMMITS_TO_RETAIN

if TYPE_CHECKING:
    from .options import WriteOptions

__all__ = [
    "COMMIT_TABLE",
    "TxnRef",
    "abort_txns",
    "commit_batch",
    "new_writer_id",
    "prune_commits",
    "write_batch",
    "write_txns",
]

COMMIT_TABLE = "spark-commits"
"""Key-value table (in the target stream's scope) holding each committed
``(writer id, batch id)`` with the transactions it committed."""


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
    return run(opts.connection, lambda c: _write(c, opts, rows))


async def _write(
    client: PravegaClient, opts: WriteOptions, rows: Iterator[tuple[str, object, object]]
) -> tuple[list[TxnRef], int]:
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
    refs = [TxnRef(t.scope, t.stream, t.txn_id.high_bits, t.txn_id.low_bits) for t in txns.values()]
    return refs, count


def write_batch(opts: WriteOptions, rows: Iterator[tuple[str, object, object]]) -> int:
    """Write rows held by the driver as batch ``(opts.writer_id, opts.batch_id)``,
    exactly once: :func:`write_txns` then :func:`commit_batch`, on one client.

    For a ``foreachBatch`` function whose output is small enough to collect:
    it saves the Spark job, the Python workers and the second connection of a
    ``write.format("headrace")``, with the same guarantee. If the commit fails,
    the transactions are left to their lease (the replayed batch finds the
    record, if it was made). Returns the row count.
    """
    if opts.writer_id is None or opts.batch_id is None:
        raise ValueError("write_batch needs the options writerId and batchId")
    writer_id, batch_id = opts.writer_id, opts.batch_id

    async def work(client: PravegaClient) -> int:
        refs, count = await _write(client, opts, rows)
        await _commit(client, opts.commit_scope, writer_id, batch_id, refs, opts.commits_to_retain)
        return count

    return run(opts.connection, work)


async def _begin(client: PravegaClient, name: str, lease_ms: int) -> Transaction:
    scope, stream = split_name(name)
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
    run(uri, lambda c: _abort(c, refs))


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

    return run(uri, lambda c: _commit(c, scope, writer_id, batch_id, refs, retain))


async def _commit(
    client: PravegaClient,
    scope: str,
    writer_id: str,
    batch_id: int | None,
    refs: Sequence[TxnRef],
    retain: int,
) -> list[TxnRef]:
    chosen = list(refs)
    if batch_id is None:
        await _commit_all(client, chosen)
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
    await _commit_all(client, chosen)
    await _prune(table, writer_id, batch_id - retain)
    return chosen


async def _commit_all(client: PravegaClient, refs: Sequence[TxnRef]) -> None:
    """Commit ``refs`` all at once: the controller commits the transactions of a
    stream that arrive together in one go (one rolling commit for those a scale
    overtook, instead of one each)."""
    await asyncio.gather(
        *(client.controller.commit_transaction(r.scope, r.stream, r.txn_id) for r in refs)
    )


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

    return run(uri, work)


def new_writer_id() -> str:
    return uuid.uuid4().hex
