"""headrace's own Pravega client: asyncio, pure Python, on the sans-I/O codec.

Layout (STYLE.md, aiokafka ``conn.py`` pattern):

* ``_conn``: one segment-store connection with request-id correlation,
  ``map_exceptions``, retry policy, connection pool;
* ``controller``: the controller gRPC client (scopes, streams, segments,
  transactions);
* ``errors``: the client's reply errors;
* ``segments``: request/reply segment calls (info, reads, table segments);
* ``writer``: ``EventWriter``;
* ``pravega``: ``PravegaClient``, the entry point sharing one controller client
  and one connection pool.
"""

from __future__ import annotations

from ._conn import ConnectionPool, RetryPolicy, SegmentStoreConnection, map_exceptions
from .controller import (
    ControllerClient,
    RetentionPolicy,
    ScalingPolicy,
    Segment,
    SegmentRange,
    StreamConfig,
    TxnId,
    TxnState,
)
from .pravega import PravegaClient
from .segments import SegmentClient
from .writer import EventWriter, StreamSealedError, WriterClosedError

__all__ = [
    "ConnectionPool",
    "ControllerClient",
    "EventWriter",
    "PravegaClient",
    "RetentionPolicy",
    "RetryPolicy",
    "ScalingPolicy",
    "Segment",
    "SegmentClient",
    "SegmentRange",
    "SegmentStoreConnection",
    "StreamConfig",
    "StreamSealedError",
    "TxnId",
    "TxnState",
    "WriterClosedError",
    "map_exceptions",
]
