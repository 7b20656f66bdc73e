"""Metrics of one server, in Prometheus form (served at ``/metrics`` on the HTTP port).

``ServerMetrics`` owns a private ``CollectorRegistry`` (two apps in one
process never share counters). What is counted where:

* connections, requests and bytes per protocol: the connection loop reports
  to a ``ListenerMetrics`` (a ``ConnectionObserver``) per TCP listener;
* errors by kind: connections closed for a fault (protocol error, a limit,
  a handler failure, refused at ``max_connections``, a failed TLS handshake);
* append and fsync latency: ``MeteredDiskStore`` times each stream append
  from the call to its acknowledgement, and ``TimedFileOps`` each WAL sync;
* stored bytes, segments, streams, parked readers, listeners up, the bytes
  held against the server's buffer budget and the reads it paused: read when
  scraped (``_StateCollector``), from the store, the controller model and the
  app's ``MemoryBudget``;
* reader-group lag: ``GroupLag`` walks the reader groups' state tables (the
  client's layout, ``client/reader.py``) in the background when scraped, at
  most every ``GROUP_LAG_MIN_INTERVAL_S``, and reports what the last walk found;
* garbage-collector pauses by generation: ``GcPauses``, a ``gc.callbacks``
  hook installed while the app runs (``ServerMetrics.watch_gc``), because a
  collection stops every thread of the process and so shows up directly in
  the append latency tail;
* events and bytes appended per stream: ``StreamTally``, fed by
  ``MeteredDiskStore`` after each acknowledged append. An event is one frame
  of the Pravega event framing every front door stores (a TANK bundle is one
  event); a byte stream's appends count bytes and no events. The labels stay
  bounded: the first ``--metrics-streams`` streams appended to get their own
  ``stream`` label, every later one is summed under ``stream="_other"``, so
  each series only ever grows, as a counter must;
* the process (memory, CPU, open files, start time: prometheus-client's
  process collector, from ``/proc``), the Python build, and
  ``headrace_build_info{version}``.

``METRIC_DOCS`` lists every metric for ``docs/configuration.md``.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import gc
import json
import logging
import platform
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from headrace import __version__
from headrace.controller.model import MAX_SCOPES, MAX_STREAMS
from headrace.controller.naming import INTERNAL_PREFIX
from headrace.errors import HeadraceError, SegmentNotFound
from headrace.protocols.pravega.codec import EVENT_HEADER
from headrace.server._loop import ERROR_REASONS
from headrace.store.disk import DiskStore
from headrace.store.disk.log import FileOps
from headrace.types import AppendResult, SegmentKind, WriterAppend

if TYPE_CHECKING:
    from headrace.server.app import ServerApp
    from headrace.store.api import SegmentStore

__all__ = [
    "CONTENT_TYPE",
    "GC_PAUSE_BUCKETS_S",
    "GROUP_LAG_MIN_INTERVAL_S",
    "LATENCY_BUCKETS_S",
    "MAX_GROUP_SEGMENTS",
    "MAX_LAG_GROUPS",
    "METRICS_STREAMS",
    "METRIC_DOCS",
    "OTHER_STREAMS",
    "GcPauses",
    "GroupLag",
    "ListenerMetrics",
    "MeteredDiskStore",
    "ServerMetrics",
    "StreamTally",
    "TimedFileOps",
    "count_events",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""From 100 µs (an append under fsync=never) to 10 s (a disk in trouble)."""

GC_PAUSE_BUCKETS_S = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
"""From 50 µs (a young collection) to 1 s (a full collection of a large heap)."""

MAX_LAG_GROUPS: Final = 100
"""Reader groups ``headrace_reader_group_lag_bytes`` reports (one series each, the
first by name): the label's values stay bounded whatever clients create."""

MAX_GROUP_SEGMENTS: Final = 1000
"""Segment entries read from one group's table per walk; a group past it is
reported with the lag of those only."""

GROUP_LAG_MIN_INTERVAL_S: Final = 2.0
"""Least time between two walks of the groups' tables: a scrape within it gets
the last walk's figures, so scraping fast cannot make the server walk fast."""

GROUP_TABLE_SUFFIX: Final = "_hrgroup/0.#epoch.0"
"""How the table of a reader group's state ends (the client's ``group_table_name``)."""

log = logging.getLogger(__name__)

GC_GENERATIONS = 3
"""CPython's collector has generations 0, 1 and 2 (``gc.get_count()``)."""

METRICS_STREAMS: Final = 50
"""Streams with their own ``stream`` label in the per-stream metrics (the default
of ``--metrics-streams``): each labelled stream adds series to every scrape, and
a Prometheus server slows down with many series, so the rest share one label."""

MAX_TALLIED_STREAMS: Final = MAX_STREAMS
"""Streams whose appends are tallied apart (for the console); later ones are
summed into ``OTHER_STREAMS``. As many as the controller holds, so every stream
it lists has its count, while segments created around the controller (the
segment store door creates any name it is given) cannot grow the tally."""

OTHER_STREAMS: Final = "_other"
"""The ``stream`` label of every stream past ``--metrics-streams`` (a user's
stream name is ``scope/stream`` and never starts with ``_``)."""

EVENT_TYPE: Final = 0
"""The type field of a stored event's frame header (``WireCommandType.EVENT``)."""

METRIC_DOCS: tuple[tuple[str, str, str, str], ...] = (
    ("headrace_connections_total", "counter", "protocol", "Connections accepted."),
    ("headrace_connections_open", "gauge", "protocol", "Connections open now."),
    (
        "headrace_requests_total",
        "counter",
        "protocol",
        "Requests (protocol events; controller: gRPC calls) received.",
    ),
    ("headrace_received_bytes_total", "counter", "protocol", "Bytes received from clients."),
    ("headrace_sent_bytes_total", "counter", "protocol", "Bytes sent to clients."),
    (
        "headrace_errors_total",
        "counter",
        "protocol, kind",
        "Connections closed for a fault; kind: " + ", ".join(sorted(ERROR_REASONS)) + ".",
    ),
    (
        "headrace_websocket_refused_total",
        "counter",
        "reason",
        "WebSocket upgrades refused with 403; reason: origin (a page of a site not "
        "allowed by --http-allowed-origins).",
    ),
    (
        "headrace_append_seconds",
        "histogram",
        "—",
        "Stream appends, from the call to the acknowledgement (durable under fsync=always).",
    ),
    ("headrace_fsync_seconds", "histogram", "—", "Write-ahead log syncs (fdatasync)."),
    (
        "headrace_gc_pause_seconds",
        "histogram",
        "generation",
        "Garbage collections of the server process, each a pause of every thread.",
    ),
    ("headrace_stored_bytes", "gauge", "—", "Bytes held by segments (start offset to length)."),
    ("headrace_segments", "gauge", "—", "Segments, table segments included."),
    ("headrace_streams", "gauge", "—", "Streams known to the controller."),
    ("headrace_parked_readers", "gauge", "—", "Reads waiting at a segment's tail (long-poll)."),
    ("headrace_listener_up", "gauge", "listener", "1 when a configured listener is serving."),
    (
        "headrace_buffered_bytes",
        "gauge",
        "—",
        "Bytes all connections hold now (frames arriving, replies not taken), "
        "against --max-total-buffered-bytes.",
    ),
    (
        "headrace_buffered_bytes_limit",
        "gauge",
        "—",
        "The budget of buffered bytes (--max-total-buffered-bytes).",
    ),
    (
        "headrace_read_pauses_total",
        "counter",
        "—",
        "Connections that stopped reading because the budget of buffered bytes was spent.",
    ),
    (
        "headrace_cluster_containers_owned",
        "gauge",
        "—",
        "With --cluster: containers this node serves now (0 while fenced).",
    ),
    ("headrace_cluster_leader", "gauge", "—", "With --cluster: 1 while this node leads."),
    ("headrace_cluster_nodes", "gauge", "—", "With --cluster: live nodes this node sees."),
    (
        "headrace_auth_refusals_total",
        "counter",
        "protocol, reason",
        "Requests, logins and connections refused by auth; reason: bad_credentials, "
        "permission_denied, rate_limited, unidentified.",
    ),
    (
        "headrace_stream_events_total",
        "counter",
        "stream",
        "Events appended to a stream (scope/stream), counted once acknowledged; a TANK "
        "bundle is one event. The first --metrics-streams streams appended to are "
        "labelled, the rest are summed under stream=_other.",
    ),
    (
        "headrace_stream_appended_bytes_total",
        "counter",
        "stream",
        "Bytes appended to a stream, with the same labels as headrace_stream_events_total.",
    ),
    (
        "headrace_build_info",
        "gauge",
        "version, python",
        "Always 1; the labels say which headrace and Python the server runs.",
    ),
    (
        "process_resident_memory_bytes",
        "gauge",
        "—",
        "Resident memory of the server process (also process_virtual_memory_bytes).",
    ),
    (
        "process_cpu_seconds_total",
        "counter",
        "—",
        "CPU time of the server process, user and system.",
    ),
    (
        "process_open_fds",
        "gauge",
        "—",
        "Open file descriptors (process_max_fds: the limit in force).",
    ),
    (
        "process_start_time_seconds",
        "gauge",
        "—",
        "When the server process started, in seconds since the Unix epoch.",
    ),
    (
        "headrace_skipped_events_total",
        "counter",
        "reader",
        "Stored events of a TANK topic a reader skipped because they are not bundles "
        "(each time one is skipped); reader: tank, rsio.",
    ),
    (
        "headrace_reader_group_lag_bytes",
        "gauge",
        "group",
        "Bytes a reader group (scope/name) has not read yet in the segments it has "
        "reached, as of the last walk of the groups' tables (at most every "
        f"{GROUP_LAG_MIN_INTERVAL_S:g} s, started by a scrape); the first "
        f"{MAX_LAG_GROUPS} groups by name.",
    ),
    ("headrace_reader_groups", "gauge", "—", "Reader groups found by the last walk."),
)


class ListenerMetrics:
    """The counters of one listener (a ``ConnectionObserver`` for the connection loop)."""

    def __init__(self, metrics: ServerMetrics, protocol: str) -> None:
        self._opened = metrics.connections.labels(protocol)
        self._open = metrics.connections_open.labels(protocol)
        self._requests = metrics.requests.labels(protocol)
        self._received = metrics.received_bytes.labels(protocol)
        self._sent = metrics.sent_bytes.labels(protocol)
        self._errors = metrics.errors
        self._protocol = protocol
        self.accepted = 0
        """Connections accepted (as ``headrace_connections_total``), for the console."""
        self.open_now = 0
        """Connections open now (as ``headrace_connections_open``), for the console."""
        self.requests = 0
        self.received = 0
        self.sent = 0

    def connection_opened(self) -> None:
        self._opened.inc()
        self._open.inc()
        self.accepted += 1
        self.open_now += 1

    def connection_closed(self, reason: str) -> None:
        self._open.dec()
        self.open_now -= 1
        if reason in ERROR_REASONS:
            self._errors.labels(self._protocol, reason).inc()

    def connection_refused(self) -> None:
        self._errors.labels(self._protocol, "refused").inc()

    def bytes_received(self, count: int) -> None:
        self._received.inc(count)
        self.received += count

    def bytes_sent(self, count: int) -> None:
        self._sent.inc(count)
        self.sent += count

    def request_received(self) -> None:
        self._requests.inc()
        self.requests += 1


class ServerMetrics:
    """Every metric of one ``ServerApp``."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series: they double the output for nothing
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.connections = Counter(
            "headrace_connections", "Connections accepted.", ["protocol"], registry=r
        )
        self.connections_open = Gauge(
            "headrace_connections_open", "Connections open now.", ["protocol"], registry=r
        )
        self.requests = Counter(
            "headrace_requests", "Requests (protocol events) received.", ["protocol"], registry=r
        )
        self.received_bytes = Counter(
            "headrace_received_bytes", "Bytes received from clients.", ["protocol"], registry=r
        )
        self.sent_bytes = Counter(
            "headrace_sent_bytes", "Bytes sent to clients.", ["protocol"], registry=r
        )
        self.errors = Counter(
            "headrace_errors", "Connections closed for a fault.", ["protocol", "kind"], registry=r
        )
        self.websocket_refused = Counter(
            "headrace_websocket_refused",
            "WebSocket upgrades refused with 403.",
            ["reason"],
            registry=r,
        )
        self.append_seconds = Histogram(
            "headrace_append_seconds",
            "Stream appends, from the call to the acknowledgement.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.fsync_seconds = Histogram(
            "headrace_fsync_seconds",
            "Write-ahead log syncs.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.auth_refusals = Counter(
            "headrace_auth_refusals",
            "Requests, logins and connections refused by auth.",
            ["protocol", "reason"],
            registry=r,
        )
        self.skipped_events = Counter(
            "headrace_skipped_events",
            "Stored events of a TANK topic a reader skipped because they are not bundles.",
            ["reader"],
            registry=r,
        )
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        Info(
            "headrace_build",
            "Which headrace and Python the server runs.",
            registry=r,
        ).info({"version": __version__, "python": platform.python_version()})
        self.started_s = time.time()
        """When the server's metrics began: its start, for the console's uptime."""
        self.streams = StreamTally()
        """Events and bytes appended per stream (``MeteredDiskStore`` adds to it)."""
        self.labelled_streams = METRICS_STREAMS
        """Streams with their own label (``--metrics-streams``, set by ``attach``)."""
        self.parked_readers = 0
        self.gc_pauses = GcPauses()
        r.register(self.gc_pauses)
        self.group_lag = GroupLag()
        self._listeners: dict[str, ListenerMetrics] = {}
        self._app: ServerApp | None = None

    def attach(self, app: ServerApp) -> None:
        """Report the state of ``app`` (store, controller, listeners) when scraped."""
        if self._app is None:
            self.registry.register(_StateCollector(self, app))
            self.registry.register(self.group_lag)
        self._app = app
        self.group_lag.app = app
        self.labelled_streams = app.config.metrics_streams

    def watch_gc(self) -> None:
        """Start timing the process's garbage collections (the app calls it at start)."""
        self.gc_pauses.install()

    def unwatch_gc(self) -> None:
        """Stop timing them (at close: a stopped app keeps no hook in the process)."""
        self.gc_pauses.uninstall()

    def listeners(self) -> dict[str, ListenerMetrics]:
        """Every listener's observer so far, by name (for the console)."""
        return dict(self._listeners)

    def listener(self, name: str) -> ListenerMetrics:
        """The observer for listener ``name`` (one per name)."""
        if name not in self._listeners:
            self._listeners[name] = ListenerMetrics(self, name)
        return self._listeners[name]

    def auth_refused(self, protocol: str, reason: str) -> None:
        """Count one refusal by auth on ``protocol``'s listener (``server/authz.py``)."""
        self.auth_refusals.labels(protocol, reason).inc()

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """Gauges read from the running server when scraped."""

    def __init__(self, metrics: ServerMetrics, app: ServerApp) -> None:
        self._metrics = metrics
        self._app = app

    def collect(self) -> Iterator[Metric]:
        app = self._app
        up = GaugeMetricFamily(
            "headrace_listener_up", "1 when a configured listener is serving.", labels=["listener"]
        )
        running = app.ports
        for name in app.config.enabled_listeners():
            up.add_metric([name], 1.0 if name in running else 0.0)
        yield up
        store = app.store_or_none
        if isinstance(store, MeteredDiskStore):
            segments, stored = store.usage()
            yield GaugeMetricFamily("headrace_segments", "Segments.", value=segments)
            yield GaugeMetricFamily(
                "headrace_stored_bytes", "Bytes held by segments.", value=stored
            )
        model = app.controller_or_none
        if model is not None:
            streams = sum(
                len(model.list_streams(scope, limit=MAX_STREAMS))
                for scope in model.list_scopes(limit=MAX_SCOPES)
            )
            yield GaugeMetricFamily("headrace_streams", "Streams.", value=streams)
        yield from self._streams()
        yield GaugeMetricFamily(
            "headrace_parked_readers",
            "Reads waiting at a segment's tail.",
            value=self._metrics.parked_readers,
        )
        budget = app.budget
        yield GaugeMetricFamily(
            "headrace_buffered_bytes",
            "Bytes all connections hold now (frames arriving, replies not taken).",
            value=budget.in_use_bytes,
        )
        yield GaugeMetricFamily(
            "headrace_buffered_bytes_limit",
            "The budget of buffered bytes.",
            value=budget.capacity_bytes,
        )
        yield CounterMetricFamily(
            "headrace_read_pauses",
            "Connections that stopped reading because the budget of buffered bytes was spent.",
            value=budget.pauses,
        )
        cluster = app.cluster
        member = None if cluster is None else cluster.member
        if member is not None:
            yield GaugeMetricFamily(
                "headrace_cluster_containers_owned",
                "Containers this node serves now (0 while fenced).",
                value=len(member.owned()),
            )
            yield GaugeMetricFamily(
                "headrace_cluster_leader",
                "1 while this node is the cluster leader.",
                value=1.0 if member.is_leader else 0.0,
            )
            yield GaugeMetricFamily(
                "headrace_cluster_nodes", "Live nodes this node sees.", value=len(member.nodes())
            )

    def _streams(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "headrace_stream_events", "Events appended to a stream.", labels=["stream"]
        )
        appended = CounterMetricFamily(
            "headrace_stream_appended_bytes", "Bytes appended to a stream.", labels=["stream"]
        )
        for stream, (count, size) in self._metrics.streams.labelled(self._metrics.labelled_streams):
            events.add_metric([stream], count)
            appended.add_metric([stream], size)
        yield events
        yield appended


STREAM_OF_CACHE: Final = 4096
"""Segment names whose stream ``stream_of`` remembers: every append asks for its
segment's, and the active segments of a busy server fit."""


def count_events(data: bytes | memoryview) -> int:
    """The events in ``data``: whole frames of the Pravega event framing (an
    8-byte header, type 0 and length, then the event); 0 for anything else (a
    byte stream's bytes, or a part of an event)."""
    size = len(data)
    position = count = 0
    unpack = EVENT_HEADER.unpack_from
    header = EVENT_HEADER.size
    while position + header <= size:
        kind, length = unpack(data, position)
        if kind != EVENT_TYPE or length < 0:
            return 0
        position += header + length
        count += 1
    return count if position == size else 0


@functools.lru_cache(maxsize=STREAM_OF_CACHE)
def stream_of(segment: str) -> str | None:
    """``scope/stream`` of a stream's segment (transaction segments included);
    None for the server's own segments and names of no stream."""
    if segment.startswith(INTERNAL_PREFIX):
        return None
    scope, sep, rest = segment.partition("/")
    stream, sep2, _ = rest.partition("/")
    if not (sep and sep2 and scope and stream):
        return None
    return f"{scope}/{stream}"


class StreamTally:
    """Events and bytes appended per stream since the server started.

    Streams are kept in the order of their first append, at most
    ``limit`` of them; appends to later streams are summed under
    ``OTHER_STREAMS``. A stream keeps its place once it has one (a deleted
    stream's count stays), so every labelled series only grows.
    """

    def __init__(self, limit: int = MAX_TALLIED_STREAMS) -> None:
        self._limit = limit
        self._counts: dict[str, list[int]] = {}
        self._other = [0, 0]

    def add(self, segment: str, data: bytes | memoryview, events: int | None = None) -> None:
        """Count one acknowledged append of ``data`` to ``segment``: ``events``
        of them, or as many as ``data`` frames when the caller does not say."""
        stream = stream_of(segment)
        if stream is None:
            return
        counts = self._counts.get(stream)
        if counts is None:
            if len(self._counts) < self._limit:
                counts = self._counts[stream] = [0, 0]
            else:
                counts = self._other
        counts[0] += count_events(data) if events is None else events
        counts[1] += len(data)

    def get(self, stream: str) -> tuple[int, int] | None:
        """(events, bytes) appended to ``stream`` (``scope/stream``); None if not tallied."""
        counts = self._counts.get(stream)
        return None if counts is None else (counts[0], counts[1])

    def labelled(self, labels: int) -> list[tuple[str, tuple[int, int]]]:
        """The first ``labels`` streams with their (events, bytes), then
        ``OTHER_STREAMS`` with the sum of every other one."""
        out: list[tuple[str, tuple[int, int]]] = []
        other_events, other_bytes = self._other
        for index, (stream, (events, size)) in enumerate(self._counts.items()):
            if index < labels:
                out.append((stream, (events, size)))
            else:
                other_events += events
                other_bytes += size
        out.append((OTHER_STREAMS, (other_events, other_bytes)))
        return out


class GroupLag(Collector):
    """``headrace_reader_group_lag_bytes``: per reader group, the bytes between its
    stored position in each unfinished segment and that segment's length.

    Reading the tables takes the store's (async) calls, which a scrape cannot
    wait for: a scrape starts a walk in the background when the last one is
    older than ``GROUP_LAG_MIN_INTERVAL_S`` and reports what the last finished
    walk found. A group's table is ``S/G_hrgroup/0.#epoch.0``; its
    ``segment/<name>`` entries hold ``{"offset", "owner", "done"}`` (client/reader.py).
    """

    def __init__(self) -> None:
        self.app: ServerApp | None = None
        self.lag: dict[str, int] = {}
        self.groups = 0
        self._walked = -GROUP_LAG_MIN_INTERVAL_S
        self._task: asyncio.Task[None] | None = None

    def collect(self) -> Iterator[Metric]:
        self._maybe_walk()
        family = GaugeMetricFamily(
            "headrace_reader_group_lag_bytes",
            "Bytes a reader group has not read yet in the segments it has reached.",
            labels=["group"],
        )
        for name, value in sorted(self.lag.items()):
            family.add_metric([name], value)
        yield family
        yield GaugeMetricFamily(
            "headrace_reader_groups", "Reader groups found by the last walk.", value=self.groups
        )

    def _maybe_walk(self) -> None:
        if self.app is None or self.app.store_or_none is None:
            return
        if self._task is not None and not self._task.done():
            return
        if time.monotonic() - self._walked < GROUP_LAG_MIN_INTERVAL_S:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # scraped outside the server's loop (a test): nothing to start
        self._walked = time.monotonic()
        self._task = loop.create_task(self.walk(), name="reader group lag")

    async def walk(self) -> None:
        """Read every group's table once and replace the figures."""
        store = self.app.store_or_none if self.app is not None else None
        if store is None:
            return
        try:
            tables = [n for n in await store.list_segments() if n.endswith(GROUP_TABLE_SUFFIX)]
        except HeadraceError:
            return
        lag: dict[str, int] = {}
        for table in tables[:MAX_LAG_GROUPS]:
            group = table.removesuffix(GROUP_TABLE_SUFFIX)
            try:
                lag[group] = await _group_lag_bytes(store, table)
            except (HeadraceError, ValueError, KeyError, TypeError) as exc:
                log.debug("reader group %s: no lag (%s)", group, exc)
        self.lag = lag
        self.groups = len(tables)
        self._walked = time.monotonic()


async def _group_lag_bytes(store: SegmentStore, table: str) -> int:
    page = await store.iterate_table_entries(table, max_count=MAX_GROUP_SEGMENTS + 2)
    behind = 0
    for entry in page.items:
        if not entry.key.startswith(b"segment/"):
            continue
        state = json.loads(entry.value)
        if state["done"]:
            continue
        try:
            info = await store.info(entry.key.removeprefix(b"segment/").decode())
        except HeadraceError:
            continue  # deleted (the stream is gone): nothing left to read
        behind += max(0, info.length - max(int(state["offset"]), info.start_offset))
    return behind


class GcPauses(Collector):
    """``headrace_gc_pause_seconds``: each garbage collection timed, by generation.

    A ``gc.callbacks`` hook notes the clock at a collection's ``start`` and
    counts the pause at its ``stop`` into plain per-generation lists, read
    when scraped. It does not call a prometheus-client ``Histogram``: the
    hook runs inside whatever allocation triggered the collection, which may
    be inside that histogram's own (non-reentrant) lock, and would deadlock.
    Collections never overlap (CPython runs one at a time), so the lists need
    no lock; a scrape may see a count one ahead of its sum, no worse.
    """

    def __init__(self) -> None:
        # Per generation: one count per bucket (the last is +Inf), then sum.
        self._buckets = [[0] * (len(GC_PAUSE_BUCKETS_S) + 1) for _ in range(GC_GENERATIONS)]
        self._sums = [0.0] * GC_GENERATIONS
        self._started = 0.0
        self._installed = False

    def install(self) -> None:
        """Add the hook to ``gc.callbacks`` (once)."""
        if not self._installed:
            gc.callbacks.append(self._on_gc)
            self._installed = True

    def uninstall(self) -> None:
        """Take the hook out of ``gc.callbacks`` (idempotent)."""
        if self._installed:
            gc.callbacks.remove(self._on_gc)
            self._installed = False

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        generation = min(info["generation"], GC_GENERATIONS - 1)
        self._buckets[generation][bisect.bisect_left(GC_PAUSE_BUCKETS_S, pause)] += 1
        self._sums[generation] += pause

    def counts(self) -> list[int]:
        """Collections timed so far, per generation."""
        return [sum(buckets) for buckets in self._buckets]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "headrace_gc_pause_seconds",
            "Garbage collections of the server process, each a pause of every thread.",
            labels=["generation"],
        )
        bounds = [*(str(bound) for bound in GC_PAUSE_BUCKETS_S), "+Inf"]
        for generation in range(GC_GENERATIONS):
            running = 0
            cumulative = []
            for bound, count in zip(bounds, list(self._buckets[generation]), strict=True):
                running += count
                cumulative.append((bound, float(running)))
            family.add_metric([str(generation)], cumulative, self._sums[generation])
        yield family


class TimedFileOps(FileOps):
    """The store's syscall layer, timing each WAL sync into ``observe``."""

    def __init__(self, observe: Callable[[float], None]) -> None:
        super().__init__()
        self._observe = observe

    def sync_wal(self, fd: int) -> None:
        started = time.perf_counter()
        try:
            super().sync_wal(fd)
        finally:
            self._observe(time.perf_counter() - started)


class MeteredDiskStore(DiskStore):
    """The disk store, timing appends and counting parked reads for ``metrics``.

    Open it with ``await MeteredDiskStore.open(...)``, then set ``metrics``.
    """

    metrics: ServerMetrics | None = None

    async def append(
        self,
        name: str,
        data: bytes | memoryview,
        *,
        expected_offset: int | None = None,
        writer: WriterAppend | None = None,
    ) -> AppendResult:
        started = time.perf_counter()
        result = await super().append(name, data, expected_offset=expected_offset, writer=writer)
        metrics = self.metrics
        if metrics is not None:
            metrics.append_seconds.observe(time.perf_counter() - started)
            if not result.duplicate:
                # The door's own count when it has one: no walk over the payload.
                known = 0 if writer is None else writer.event_count
                metrics.streams.add(name, data, known or None)
        return result

    async def wait_for_data(self, name: str, offset: int, timeout_s: float) -> bool:
        metrics = self.metrics
        if metrics is None:
            return await super().wait_for_data(name, offset, timeout_s)
        metrics.parked_readers += 1
        try:
            return await super().wait_for_data(name, offset, timeout_s)
        finally:
            metrics.parked_readers -= 1

    def usage(self) -> tuple[int, int]:
        """(segments, bytes they hold) from memory: cheap enough for every scrape."""
        count = stored = 0
        for container in self._containers:
            for segment in container.state.by_name.values():
                if not segment.hidden:
                    count += 1
                    stored += segment.length - segment.start_offset
        return count, stored

    def segment_size(self, name: str) -> tuple[int, bool] | None:
        """(bytes held, sealed) of segment ``name`` from memory; None if there is none."""
        try:
            state = self._state(name)
        except SegmentNotFound:
            return None
        return state.length - state.start_offset, state.sealed

    def segment_length(self, name: str) -> int | None:
        """Segment ``name``'s length (its end offset) from memory; None if there is none."""
        try:
            return self._state(name).length
        except SegmentNotFound:
            return None

    def table_names(self, suffix: str, limit: int) -> list[str]:
        """Up to ``limit`` table segments whose names contain ``suffix``, in name order."""
        names: list[str] = []
        for container in self._containers:
            for name, segment in container.state.by_name.items():
                if suffix in name and segment.kind is SegmentKind.TABLE and not segment.hidden:
                    names.append(name)
        names.sort()
        return names[:limit]

    def cached_table(self, name: str, limit: int) -> list[tuple[bytes, bytes]] | None:
        """Up to ``limit`` (key, value) entries of table ``name`` from the index its
        last use left in memory; None when no index is held or it is behind the
        segment (reading it afresh would take disk reads; the next use brings it up
        to date)."""
        table = self._tables.get(name)
        index = None if table is None else table.index
        if index is None:
            return None
        try:
            state = self._state(name)
        except SegmentNotFound:
            return None
        if index.length != state.length:
            return None
        out: list[tuple[bytes, bytes]] = []
        for key, (_, value) in index.entries.items():
            if len(out) >= limit:
                break
            out.append((key, value))
        return out
