"""headrace's own Pravega client: asyncio, pure Python, on the sans-I/O codec.

Start from :class:`PravegaClient` (one controller client and one connection
pool shared by everything made from it). Layout (aiokafka's
``conn.py`` pattern, ``docs/architecture.md#client-layout``):

* ``_conn``: one segment-store connection with request-id correlation,
  ``map_exceptions``, retry policy, connection pool;
* ``controller``: the controller gRPC client (scopes, streams, segments,
  transactions);
* ``segments``: request/reply segment calls (info, reads, table segments);
* ``writer``: :class:`EventWriter` (routing, batching, exactly-once resume);
* ``records``: :class:`RecordReader`, any stream as :class:`Record` s
  (TANK bundles unpacked);
* ``reader``: :class:`ReaderGroup` and :class:`EventReader`;
* ``transactions``, ``bytestream``, ``kvtable``: :class:`Transaction`,
  :class:`ByteStream`, :class:`KeyValueTable`;
* ``sync``: :class:`SyncClient`, a blocking facade (one event-loop thread);
* ``errors``: the client's reply errors.

See ``docs/client.md``.
"""

from __future__ import annotations

from ._conn import ConnectionPool, RetryPolicy, SegmentStoreConnection, map_exceptions
from .bytestream import ByteStream
from .controller import (
    ControllerClient,
    GroupRetention,
    KeyValueTableConfig,
    ReaderGroupConfig,
    RetentionPolicy,
    ScalingPolicy,
    Segment,
    SegmentRange,
    StreamConfig,
    TxnId,
    TxnState,
)
from .kvtable import KeyValueTable
from .pravega import PravegaClient
from .reader import EventRead, EventReader, ReaderGroup
from .records import Record, RecordReader
from .segments import SegmentClient
from .transactions import Transaction, TransactionClosedError
from .writer import EventWriter, StreamSealedError, WriterClosedError

__all__ = [
    "ByteStream",
    "ConnectionPool",
    "ControllerClient",
    "EventRead",
    "EventReader",
    "EventWriter",
    "GroupRetention",
    "KeyValueTable",
    "KeyValueTableConfig",
    "PravegaClient",
    "ReaderGroup",
    "ReaderGroupConfig",
    "Record",
    "RecordReader",
    "RetentionPolicy",
    "RetryPolicy",
    "ScalingPolicy",
    "Segment",
    "SegmentClient",
    "SegmentRange",
    "SegmentStoreConnection",
    "StreamConfig",
    "StreamSealedError",
    "Transaction",
    "TransactionClosedError",
    "TxnId",
    "TxnState",
    "WriterClosedError",
    "map_exceptions",
]
