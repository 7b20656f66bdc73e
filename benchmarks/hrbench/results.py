"""The suite's results as typed records, and their JSON file.

A run writes one JSON file (``--results``) holding the run's machine and
settings, the machine limits, every row, the memory figures, the targets and
the profiles; the tables printed and the block in ``docs/benchmarks.md`` are
rendered from it, so ``suite.py --render FILE`` can write them again without
running anything.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from hrbench.config import PRODUCERS, RESULT_SHAPES

FORMAT: Final = "headrace-suite-results/1"
"""The ``format`` of a results file; a change of its fields changes the number."""


@dataclass(slots=True, kw_only=True)
class Row:
    """One system in one shape: what it moved, how fast, at what cost."""

    shape: str = ""
    """The result shape (``config.SHAPES``): which table the row belongs to."""
    key: str = ""
    """The system's key within the shape (``headrace_always``, ``nats_default``...)."""
    system: str
    size: int
    """Bytes per event, as counted for MB/s."""
    events_per_s: int
    mb_per_s: float
    events: int | None = None
    """Events counted (None in results converted from printed tables)."""
    seconds: float | None = None
    producers: int = 1
    """Producer (or client) processes."""
    p50_ms: float | None = None
    p99_ms: float | None = None
    p999_ms: float | None = None
    server_cpu_us_per_event: float | None = None
    server_peak_rss_mib: float | None = None
    client_cpu_share: float | None = None
    """The client processes' CPU time over the row's wall time, in cores."""
    send_lateness_p99_ms: float | None = None
    """A paced writer's p99 of how far behind its schedule it sent."""
    server_append_count: int | None = None
    server_append_p50_ms_at_most: float | None = None
    server_append_p99_ms_at_most: float | None = None
    server_fsync_count: int | None = None
    server_fsync_p50_ms_at_most: float | None = None
    server_fsync_p99_ms_at_most: float | None = None
    server_rss_mib_before: float | None = None
    server_rss_mib_during: float | None = None
    note: str = ""

    def add_note(self, text: str) -> None:
        self.note = f"{self.note}; {text}" if self.note else text


@dataclass(slots=True)
class Fsync:
    """4 KiB ``os.write`` + ``fdatasync`` to a growing file."""

    ops_per_s: int
    p50_ms: float
    p99_ms: float
    p999_ms: float


@dataclass(slots=True)
class Limits:
    """The machine's own figures, measured in the same run."""

    mb_per_s: dict[str, float] = field(default_factory=dict)
    """``loopback_tcp``, ``write_nosync``, ``write_fsync``."""
    fsync: dict[str, Fsync] = field(default_factory=dict)
    """``fsync_4k`` (first), ``fsync_4k_before_latency``, ``fsync_4k_after_latency``,
    ``fsync_4k_after`` (after the run)."""
    skipped: dict[str, str] = field(default_factory=dict)
    """A limit not measured, and why."""


@dataclass(slots=True)
class Memory:
    """Server RSS growth per idle connection (and per parked tail reader)."""

    connections: int
    kib_per_connection: float
    readers: int | None = None
    kib_per_reader_and_connection: float | None = None


@dataclass(slots=True)
class Target:
    figure: str
    value: float | None
    target: float
    higher_is_better: bool
    met: bool | None


@dataclass(slots=True)
class Profile:
    """py-spy samples of the server during one shape (``--profile``)."""

    samples: int
    self_time: list[tuple[str, float]]
    inclusive: list[tuple[str, float]]


@dataclass(slots=True)
class Run:
    """When, where and how the figures were measured."""

    when: str
    quick: bool
    machine: dict[str, Any]
    filesystem: str = ""
    only: list[str] = field(default_factory=list)
    flush_ms: float = 1.0
    loadavg_start: float = 0.0
    loadavg_end: float = 0.0
    wall_s: float = 0.0
    note: str = ""
    """Where the figures came from, when not from this suite's own run."""


@dataclass(slots=True)
class Results:
    run: Run
    limits: Limits = field(default_factory=Limits)
    rows: list[Row] = field(default_factory=list)
    memory: dict[str, Memory] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    profiles: dict[str, Profile] = field(default_factory=dict)

    def put(self, shape: str, key: str, row: Row) -> Row:
        """Add ``row`` as ``key`` of ``shape``, replacing a row of the same shape and key."""
        row.shape, row.key = shape, key
        self.rows = [r for r in self.rows if (r.shape, r.key) != (shape, key)]
        self.rows.append(row)
        return row

    def row(self, shape: str, key: str) -> Row | None:
        return next((r for r in self.rows if r.shape == shape and r.key == key), None)

    def shape(self, shape: str) -> list[Row]:
        return [r for r in self.rows if r.shape == shape]

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["rows"] = [
            {k: v for k, v in row.items() if v is not None and v != ""} for row in out["rows"]
        ]
        return {"format": FORMAT, **out}

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Results:
        if data.get("format") != FORMAT:
            return from_legacy(data)
        limits = data["limits"]
        return cls(
            run=Run(**data["run"]),
            limits=Limits(
                mb_per_s=limits["mb_per_s"],
                fsync={k: Fsync(**v) for k, v in limits["fsync"].items()},
                skipped=limits["skipped"],
            ),
            rows=[Row(**row) for row in data["rows"]],
            memory={k: Memory(**v) for k, v in data["memory"].items()},
            targets=[Target(**t) for t in data["targets"]],
            profiles={
                k: Profile(
                    v["samples"],
                    [(w, s) for w, s in v["self_time"]],
                    [(w, s) for w, s in v["inclusive"]],
                )
                for k, v in data["profiles"].items()
            },
        )


def load(path: Path) -> Results:
    """A results file, or a saved run's output whose last ``{`` line is its JSON."""
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        lines = text.splitlines()
        data = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
    return Results.from_json(data)


ROW_FIELDS: Final = frozenset(f.name for f in dataclasses.fields(Row))


def from_legacy(data: dict[str, Any]) -> Results:
    """Results from the one JSON object older suites printed last (a dict per shape)."""
    machine = data.get("machine", {})
    load_start, load_end = data.get("loadavg_start_end", [0.0, 0.0])
    results = Results(
        Run(
            when=data.get("when", ""),
            quick=bool(data.get("quick")),
            machine=machine,
            filesystem=data.get("filesystem", ""),
            only=list(data.get("only", [])),
            flush_ms=float(data.get("latency_flush_ms", 0.2)),
            loadavg_start=load_start,
            loadavg_end=load_end,
            wall_s=float(data.get("wall_s", 0.0)),
        )
    )
    for name, figures in data.get("limits", {}).items():
        if "skipped" in figures:
            results.limits.skipped[name] = figures["skipped"]
        elif name.startswith("fsync"):
            results.limits.fsync[name] = Fsync(**figures)
        else:
            results.limits.mb_per_s[name] = figures["mb_per_s"]
    for shape in RESULT_SHAPES:
        producers = PRODUCERS if shape.endswith("_4") else 1
        for key, row in data.get(shape, {}).items():
            if "system" not in row and "events_per_s" in row:  # redis-benchmark's ceiling
                events = int(row["events_per_s"])
                system = f"Redis Streams (appendfsync {key.split('_')[1]}), redis-benchmark -P 64"
                row = {"system": system, "events": events, "seconds": 1.0, **row}
                row |= {"event_bytes": 100, "mb_per_s": round(events * 100 / 1e6, 2)}
            if "system" not in row:
                continue
            fields = {k: v for k, v in row.items() if k in ROW_FIELDS}
            fields.setdefault("producers", producers)
            results.put(shape, key, Row(size=row["event_bytes"], **fields))
    for key, memory in data.get("idle_memory", {}).items():
        results.memory[key] = Memory(**memory)
    return results
