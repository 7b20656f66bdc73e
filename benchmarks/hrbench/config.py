"""What the suite measures and how much: sizes, rates, counts and the targets."""

from __future__ import annotations

from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
BENCHMARKS: Final = ROOT / "benchmarks"
WORKERS: Final = BENCHMARKS / "suite_workers.py"
FLOOR_SERVER: Final = BENCHMARKS / "floor_server.py"

SMALL: Final = 100
LARGE: Final = 10 * 1024
HUGE: Final = 1024 * 1024

OFFERED_RATE: Final = 10_000
"""Events/s offered in the latency shapes."""

PRODUCERS: Final = 4
"""Producer processes of the multi-producer shapes."""

CONNECTION_BLOCK_EVENTS: Final = 100
"""100-byte events per append block of each connection in the connections shape."""

MAX_CONNECTION_PROCESSES: Final = 4
"""Client processes sharing the connections of the connections shape."""

RSS_SAMPLE_S: Final = 0.1
"""How often the connections shape samples the server's RSS."""

CATCHUP_DEPTH: Final = 4
"""``ReadSegment``s the catch-up reader process keeps ahead of the reply it is
receiving: as many 2 MiB replies as the server queues for one connection
(``MAX_UNSENT_REPLY_BYTES``, 8 MiB), as Pravega's own readers keep reads
outstanding. ``catchup.py --depths 1,2,4`` measures the choice."""

CATCHUP_MIN_BYTES: Final = 1_000_000_000
"""The catch-up reader process reads the stored stream as many whole times as
it takes to read at least this much, so its figure is a second or so of
reading, not a tenth (the quick run's stream is 51 MB)."""

GROUP_TIMEOUT_S: Final = 600.0
"""Bound on one group of worker processes, set-up included."""

E2E_LATENCY_SAMPLES: Final = 10_000
"""Events stamped with their send time in an end-to-end shape (about; one in
``events // E2E_LATENCY_SAMPLES``): the consumer's delivery p50/p99 come from
them."""

READ_BATCH_BYTES: Final = 32 * 1024 * 1024
"""The most a peer's consumer asks for in one fetch: 1,000 entries, fewer of large
events (1,000 of 1 MiB would be a 1 GB reply, past nats-py's 64 MiB of pending
bytes per subscription)."""

LARGE_BUNDLE_MESSAGES: Final = 64
"""10 KiB messages per TANK bundle in the large shape (640 KiB bundles: 8,192 of
them, the 100 B shape's bundle, would be 80 MiB, over TANK's frame limit)."""

LARGE_TANK_IN_FLIGHT: Final = 4
"""Produce requests a TANK producer keeps in flight in the large shape."""

LARGE_DISTINCT_BUNDLES: Final = 16
"""Distinct 640 KiB bundles the large TANK producer sends in turn (a gigabyte of
distinct bundles would only measure the suite's memory)."""

SHAPE_CHOICES: Final = (
    "produce",
    "producers4",
    "large",
    "consume",
    "e2e",
    "latency",
    "segments",
    "connections",
    "memory",
)
"""``--only`` values: each runs that shape alone (with the machine limits)."""

SHAPES: Final = (
    ("produce_100b", "Producer only, 100-byte events, one producer"),
    ("produce_100b_4", f"Producer only, 100-byte events, {PRODUCERS} producer processes"),
    ("produce_10k", "Producer only, 10 KiB events, one producer"),
    ("produce_10k_4", f"Producer only, 10 KiB events, {PRODUCERS} producer processes"),
    ("produce_1mib", "Producer only, 1 MiB events, one producer"),
    ("produce_1mib_4", f"Producer only, 1 MiB events, {PRODUCERS} producer processes"),
    ("consume_100b", "Consumer only, 100-byte events stored by the producer shape"),
    ("catchup", "Consumer only, 10 KiB events (catch-up of a stored stream)"),
    ("consume_1mib", "Consumer only, 1 MiB events (catch-up of the stored stream)"),
    ("e2e_100b", "End to end, 100-byte events: one producer and one consumer process at once"),
    ("e2e_10k", "End to end, 10 KiB events: one producer and one consumer process"),
    ("e2e_1mib", "End to end, 1 MiB events: one producer and one consumer process"),
    ("e2e_100b_4", f"End to end, 100-byte events: {PRODUCERS} producer processes, one consumer"),
    ("e2e_10k_4", f"End to end, 10 KiB events: {PRODUCERS} producer processes, one consumer"),
    ("e2e_1mib_4", f"End to end, 1 MiB events: {PRODUCERS} producer processes, one consumer"),
    ("latency", f"Latency at an offered {OFFERED_RATE:,} events/s of 100 bytes"),
    ("scaling", "Throughput over segments (100-byte events, one writer)"),
    ("connections", "Throughput over connections (100-byte events, each connection writing)"),
)
"""Every result shape (the ``shape`` of a row) and its table's title, in table order."""

RESULT_SHAPES: Final = tuple(key for key, _ in SHAPES)

TARGETS: Final = {
    "produce_100b_events_per_s": 300_000,
    "produce_100b_vs_nats_always": 60.0,
    "produce_100b_vs_redis_everysec": 1.3,
    "produce_10k_vs_fsynced_write": 0.5,
    "produce_10k_nofsync_vs_tcp": 0.5,
    "catchup_vs_tcp": 0.66,
    "ack_p99_never_ms": 0.5,
    "ack_p99_always_vs_fsync_p99": 2.0,
    "delivery_p99_ms": 5.0,
    "server_cpu_us_per_event": 1.0,
    "idle_connections_mib": 1024,
}
"""The project's performance targets, each judged on one run's own figures."""


class Sizes:
    """How much each shape moves; ``--quick`` divides."""

    def __init__(self, quick: bool, flush_ms: float = 1.0) -> None:
        self.quick = quick
        self.flush_s = str(flush_ms / 1000)
        self.small_events = 200_000 if quick else 1_000_000
        # The same 10 KiB and 1 MiB counts for every system and policy: on a VM that
        # hands free memory back to its host, a row that writes less fills only warm
        # page-cache pages and looks faster (docs/benchmarks.md#vm).
        self.large_events = 5_000 if quick else 100_000
        self.huge_events = 100 if quick else 1_000
        self.peer_small_events = 50_000 if quick else 200_000
        self.nats_always_events = 2_000 if quick else 10_000
        self.latency_s = 2.0 if quick else 8.0
        self.tcp_s = 2 if quick else 5
        self.write_mib = 128 if quick else 512
        self.fsync_ops = 500 if quick else 3000
        self.rust_events = 50_000 if quick else 200_000
        self.lumberjack_windows = 4 if quick else 16
        self.segment_counts = (1, 16) if quick else (1, 16, 256)
        self.scaling_events = 100_000 if quick else 400_000
        self.idle_connections = 200 if quick else 2000
        self.parked_readers = 100 if quick else 1000
        self.e2e_events = 50_000 if quick else 200_000
        self.peer_e2e_events = 20_000 if quick else 50_000
        self.rsio_events = 50_000 if quick else 200_000
        self.connection_counts = (1, 64) if quick else (1, 64, 512)
        self.connection_s = 2.0 if quick else 5.0

    def producers4_large(self) -> tuple[tuple[str, str, int, int], ...]:
        """The ``producers4`` shapes beyond 100 B: (result shape, stream, event size,
        events in all, split over ``PRODUCERS`` processes)."""
        return (
            ("produce_10k_4", "p10kx4", LARGE, self.large_events),
            ("produce_1mib_4", "p1mx4", HUGE, self.huge_events),
        )

    def e2e_shapes(self, small_events: int) -> tuple[tuple[str, str, int, int, int], ...]:
        """The ``e2e`` shapes: (result shape, stream, event size, events in all,
        producer processes); ``small_events``, the system's own 100 B count."""
        return (
            ("e2e_100b", "e2e", SMALL, small_events, 1),
            ("e2e_10k", "e2e10k", LARGE, self.large_events, 1),
            ("e2e_1mib", "e2e1m", HUGE, self.huge_events, 1),
            ("e2e_100b_4", "e2e100x4", SMALL, small_events, PRODUCERS),
            ("e2e_10k_4", "e2e10kx4", LARGE, self.large_events, PRODUCERS),
            ("e2e_1mib_4", "e2e1mx4", HUGE, self.huge_events, PRODUCERS),
        )


def stamp_every(events: int) -> str:
    """One event in how many carries its send time, as a worker argument."""
    return str(max(1, events // E2E_LATENCY_SAMPLES))


def read_batch(size: int) -> int:
    """Entries a peer's consumer fetches at once for events of ``size`` bytes."""
    return max(1, min(1000, READ_BATCH_BYTES // size))


def producers_label(label: str, producers: int) -> str:
    return label if producers == 1 else f"{label}, {producers} producer processes"


def times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"
