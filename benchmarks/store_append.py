"""Append throughput of DiskStore under fsync=always, next to the raw disk limit.

Run: ``.venv/bin/python benchmarks/store_append.py [--quick] [--dir DIR]``.

For 100-byte and 64 KiB appends with 1, 16 and 256 concurrent appenders
(asyncio tasks, each awaiting one append at a time, spread round-robin over
up to ``--segments`` segments), it prints appends/s and MB/s (10^6 bytes) of a
fresh ``DiskStore`` in a temporary directory. In the same run, on the same
disk, it measures the raw limit: a plain loop of ``os.write`` + ``os.fsync``
of the same size appended to one file. A shared or virtual disk drifts within
seconds, so each store configuration runs in slices alternating with slices
of the raw loop of the same size, and the ratios divide by that paired raw
figure; the ``fdatasync`` variant of the raw loop (what the store's WAL uses)
is printed for reference.

The last line printed is one JSON object with every figure, including:

* ``group_commit_ratio``: 256 concurrent 100-byte appends/s divided by raw
  write+fsync ops/s of 100 bytes (goal >= 20: group commit amortises fsyncs);
* ``large_append_ratio``: best DiskStore MB/s with 64 KiB appends divided by
  raw write+fsync MB/s of 64 KiB writes (goal >= 0.8: big appends cost little
  beyond the disk itself).

``--sizes`` and ``--concurrencies`` pick other shapes (the two ratios are then
left out if their shape is not measured). ``--compare-refs`` measures each
shape twice in the same slices, as a back-to-back pair on one disk moment:
the store with large appends written once (APPEND_REF, the default
threshold or ``--ref-append-bytes``) and with references off (every byte in
the WAL and the data file); each is printed with
its ratio to the raw loop interleaved with it, and the pair's ratio after /
before.

Nothing here asserts speed; it is a measuring tool, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from headrace.store import DiskStore
from headrace.store.api import MAX_APPEND_BYTES, FsyncPolicy
from headrace.store.disk.container import REF_APPEND_BYTES, REF_APPEND_BYTES_UNSYNCED

REFS_OFF = MAX_APPEND_BYTES + 1
"""A threshold no append reaches: every append carries its bytes in the WAL."""

SIZES_BYTES = (100, 64 * 1024)
CONCURRENCIES = (1, 16, 256)

DEFAULT_DURATION_S = 4.0
"""Per store measurement (raw ones take half): a default run takes about 45 s."""

QUICK_DURATION_S = 0.4
"""Per measurement with ``--quick``: the whole run takes a few seconds."""

DEFAULT_SEGMENTS = 8
"""Appenders are spread over up to this many segments (so over several containers)."""

SLICES = 8
"""Alternating store/raw slices per configuration (see ``_measure_pair``)."""

GROUP_COMMIT_GOAL = 20.0
LARGE_APPEND_GOAL = 0.8


@dataclass(frozen=True, slots=True)
class Figure:
    """One measurement."""

    kind: str  # "store", "store_norefs", "raw_fsync" or "raw_fdatasync"
    size_bytes: int
    concurrency: int
    count: int
    elapsed_s: float
    cpu_s: float = 0.0
    """Process CPU (every thread) while the store ran; 0 for raw loops."""

    @property
    def ops_per_s(self) -> float:
        return self.count / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.ops_per_s * self.size_bytes / 1e6

    def as_json(self) -> dict[str, object]:
        return {
            **asdict(self),
            "ops_per_s": round(self.ops_per_s, 1),
            "mb_per_s": round(self.mb_per_s, 3),
            "cpu_us_per_op": round(self.cpu_s / self.count * 1e6, 2) if self.cpu_s else None,
        }


class RawLoop:
    """A plain loop of write + fsync (or fdatasync) of one size, appended to one file."""

    def __init__(self, directory: Path, size_bytes: int, sync: str = "fsync") -> None:
        self.size_bytes = size_bytes
        self.kind = f"raw_{sync}"
        self._sync = os.fsync if sync == "fsync" else getattr(os, "fdatasync", os.fsync)
        self._data = os.urandom(size_bytes)
        self._path = directory / f"raw-{sync}-{size_bytes}.bin"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        self._fd = os.open(self._path, flags, 0o600)
        self.count = 0
        self.elapsed_s = 0.0

    def run(self, duration_s: float) -> None:
        started = now = time.perf_counter()
        stop_at = started + duration_s
        while now < stop_at:
            written = os.write(self._fd, self._data)
            assert written == self.size_bytes, "short write to a regular file"
            self._sync(self._fd)
            self.count += 1
            now = time.perf_counter()
        self.elapsed_s += now - started

    def figure(self) -> Figure:
        return Figure(self.kind, self.size_bytes, 1, self.count, self.elapsed_s)

    def close(self) -> None:
        os.close(self._fd)
        self._path.unlink()


def sync_tree(path: Path) -> None:
    """fsync every file under ``path``."""
    for file in path.rglob("*"):
        if file.is_file():
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


class _Variant:
    """One store configuration measured in the slices of ``_measure_pair``."""

    def __init__(self, kind: str, store: DiskStore, directory: Path, concurrency: int) -> None:
        self.kind = kind
        self.store = store
        self.directory = directory
        self.counts = [0] * concurrency
        self.elapsed_s = 0.0
        self.cpu_s = 0.0


async def _measure_pair(
    directory: Path,
    size_bytes: int,
    concurrency: int,
    segments: int,
    duration_s: float,
    ref_thresholds: dict[str, int],
    policy: FsyncPolicy = FsyncPolicy.ALWAYS,
) -> tuple[Figure, list[Figure]]:
    """Store(s) and raw loop of one size, in alternating slices, on one disk.

    The disk's speed drifts (other tenants, writeback, the host's cache), so
    each store runs in ``SLICES`` slices and a raw slice of half the length runs
    before each round of them: all see the same mix of good and bad moments.
    ``ref_thresholds`` maps each store variant's kind to its
    ``ref_append_bytes`` (several variants alternate slice by slice). Each
    store slice ends by syncing the store's files, so its figure includes the
    writeback of everything it wrote (data files are synced lazily).
    """
    variants: list[_Variant] = []
    raw = RawLoop(directory, size_bytes)
    names = [f"bench/append/{i}" for i in range(min(segments, concurrency))]
    try:
        for kind, threshold in ref_thresholds.items():
            path = directory / kind
            store = await DiskStore.open(path, fsync=policy, ref_append_bytes=threshold)
            variants.append(_Variant(kind, store, path, concurrency))
            for name in names:
                await store.create_segment(name)
        data = os.urandom(size_bytes)
        stop_at = 0.0

        async def appender(variant: _Variant, index: int) -> None:
            name = names[index % len(names)]
            while time.perf_counter() < stop_at:
                await variant.store.append(name, data)
                variant.counts[index] += 1

        slice_s = duration_s / SLICES
        for _ in range(SLICES):
            raw.run(slice_s / 2)  # the store's tasks are idle meanwhile
            for variant in variants:
                started = time.perf_counter()
                cpu_started = time.process_time()
                stop_at = started + slice_s
                async with asyncio.TaskGroup() as group:
                    for index in range(concurrency):
                        group.create_task(appender(variant, index))
                # The store syncs its WAL per commit but its data files only at
                # checkpoints (and, for APPEND_REFs, per commit); flush what it
                # left dirty inside its own time, or the next slice would pay
                # for the store's writeback.
                sync_tree(variant.directory)
                variant.elapsed_s += time.perf_counter() - started
                variant.cpu_s += time.process_time() - cpu_started
        for variant in variants:  # every acknowledged byte is there: a cheap sanity check
            for name in names:
                assert (await variant.store.info(name)).length == size_bytes * sum(
                    variant.counts[i] for i in range(concurrency) if names[i % len(names)] == name
                )
    finally:
        raw.close()
        for variant in variants:
            await variant.store.close()
    figures = [
        Figure(v.kind, size_bytes, concurrency, sum(v.counts), v.elapsed_s, v.cpu_s)
        for v in variants
    ]
    return raw.figure(), figures


def measure_pair(
    base: Path,
    size_bytes: int,
    concurrency: int,
    segments: int,
    duration_s: float,
    ref_thresholds: dict[str, int],
    policy: FsyncPolicy = FsyncPolicy.ALWAYS,
) -> tuple[Figure, list[Figure]]:
    """``_measure_pair`` on its own event loop, in a fresh directory under ``base``
    that is removed afterwards: each configuration starts on an empty disk
    directory, and ``main`` stays synchronous."""
    directory = Path(tempfile.mkdtemp(prefix=f"store-{size_bytes}-{concurrency}-", dir=base))
    try:
        return asyncio.run(
            _measure_pair(
                directory, size_bytes, concurrency, segments, duration_s, ref_thresholds, policy
            )
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def measure_fdatasync(base: Path, size_bytes: int, duration_s: float) -> Figure:
    raw = RawLoop(base, size_bytes, sync="fdatasync")
    try:
        raw.run(duration_s)
    finally:
        raw.close()
    return raw.figure()


def describe_disk(path: Path) -> dict[str, object]:
    """Where the data went: filesystem, device and free space, for the record."""
    info: dict[str, object] = {"dir": str(path.resolve())}
    usage = shutil.disk_usage(path)
    info["free_gb"] = round(usage.free / 1e9, 1)
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
        best = ""
        for line in mounts:
            device, mount_point, fs_type, *_ = line.split()
            if str(path.resolve()).startswith(mount_point) and len(mount_point) >= len(best):
                best = mount_point
                info.update(device=device, mount_point=mount_point, fs_type=fs_type)
    except OSError:
        pass
    return info


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where to make the temporary data directory (default: the current directory)",
    )
    parser.add_argument(
        "--duration-s",
        type=float,
        default=DEFAULT_DURATION_S,
        help=f"seconds per measurement (default {DEFAULT_DURATION_S})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_DURATION_S} s per measurement: a smoke run of a few seconds",
    )
    parser.add_argument(
        "--segments",
        type=int,
        default=DEFAULT_SEGMENTS,
        help=f"spread appenders over up to this many segments (default {DEFAULT_SEGMENTS})",
    )
    parser.add_argument(
        "--sizes",
        type=_int_list,
        default=SIZES_BYTES,
        help="append sizes in bytes, comma-separated (default "
        + ",".join(map(str, SIZES_BYTES))
        + ")",
    )
    parser.add_argument(
        "--concurrencies",
        type=_int_list,
        default=CONCURRENCIES,
        help="appender counts, comma-separated (default " + ",".join(map(str, CONCURRENCIES)) + ")",
    )
    parser.add_argument(
        "--ref-append-bytes",
        type=int,
        default=None,
        help="appends this large are logged by reference (default: the store's, "
        f"{REF_APPEND_BYTES} under always, {REF_APPEND_BYTES_UNSYNCED} otherwise; 0: never)",
    )
    parser.add_argument(
        "--fsync",
        type=FsyncPolicy,
        default=FsyncPolicy.ALWAYS,
        help="the stores' durability policy (default always; never and interval "
        "acknowledge at once, so the figures are page-cache speed)",
    )
    parser.add_argument(
        "--compare-refs",
        action="store_true",
        help="measure each shape with references on and off, slice by slice",
    )
    args = parser.parse_args(argv)
    if args.ref_append_bytes is not None and args.ref_append_bytes <= 0:
        args.ref_append_bytes = REFS_OFF
    if args.quick:
        args.duration_s = QUICK_DURATION_S
    if args.duration_s <= 0 or args.segments < 1:
        parser.error("--duration-s and --segments must be positive")
    return args


def _int_list(text: str) -> tuple[int, ...]:
    values = tuple(int(part) for part in text.split(",") if part)
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of positive integers")
    return values


def _line(figure: Figure, raw: Figure | None = None) -> str:
    if figure.kind.startswith("store"):
        label = "DiskStore " if figure.kind == "store" else "no refs   "
        head = f"{label} {figure.size_bytes:>7} B x {figure.concurrency:>3} appenders"
    else:
        head = f"raw write+{figure.kind[4:]:<9} {figure.size_bytes:>6} B            "
    text = f"{head}: {figure.ops_per_s:>9.0f} ops/s {figure.mb_per_s:>9.2f} MB/s"
    if raw is not None and raw.ops_per_s > 0:
        text += f"  ({figure.ops_per_s / raw.ops_per_s:.2f}x the raw ops/s interleaved with it)"
    if figure.cpu_s and figure.count:
        text += f"  CPU {figure.cpu_s / figure.count * 1e6:.1f} us/append"
    return text


def _cpu_per_op(figure: Figure) -> float:
    return figure.cpu_s / figure.count if figure.count else 0.0


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    parent = args.dir if args.dir is not None else Path.cwd()
    parent.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="headrace-bench-", dir=parent))
    raw_duration_s = args.duration_s / 2
    load_start = os.getloadavg()
    started = time.perf_counter()
    pairs: list[tuple[Figure, Figure]] = []  # (raw fsync, store), interleaved
    baselines: list[tuple[Figure, Figure, Figure]] = []  # (raw, without refs, with refs)
    fdatasync: list[Figure] = []
    thresholds = {"store": args.ref_append_bytes}
    if args.compare_refs:
        thresholds = {"store_norefs": REFS_OFF, "store": args.ref_append_bytes}
    try:
        for size in args.sizes:
            figure = measure_fdatasync(base, size, raw_duration_s)
            fdatasync.append(figure)
            print(_line(figure), flush=True)
            for concurrency in args.concurrencies:
                raw, stores = measure_pair(
                    base, size, concurrency, args.segments, args.duration_s, thresholds, args.fsync
                )
                print(_line(raw), flush=True)
                for store in stores:
                    print(_line(store, raw), flush=True)
                store = stores[-1]
                pairs.append((raw, store))
                if args.compare_refs:
                    before = stores[0]
                    baselines.append((raw, before, store))
                    speed = _ratio(store.mb_per_s, before.mb_per_s)
                    cpu = _ratio(_cpu_per_op(store), _cpu_per_op(before))
                    print(
                        f"  written once / written twice: {speed:.2f}x MB/s, "
                        f"{cpu:.2f}x CPU per append",
                        flush=True,
                    )
        disk = describe_disk(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    raw_median = {
        size: statistics.median(r.ops_per_s for r, _ in pairs if r.size_bytes == size)
        for size in args.sizes
    }
    small = [(r, s) for r, s in pairs if s.size_bytes == 100 and s.concurrency == 256]
    large = [(r, s) for r, s in pairs if s.size_bytes == 64 * 1024]
    group_commit_ratio = _ratio(small[0][1].ops_per_s, small[0][0].ops_per_s) if small else None
    large_append_ratio = None
    best_concurrency = None
    if large:
        raw_large, best_large = max(large, key=lambda p: p[1].mb_per_s)
        large_append_ratio = _ratio(best_large.mb_per_s, raw_large.mb_per_s)
        best_concurrency = best_large.concurrency
    print(
        (
            f"group_commit_ratio {group_commit_ratio:.2f} (goal >= {GROUP_COMMIT_GOAL}); "
            if group_commit_ratio is not None
            else ""
        )
        + (
            f"large_append_ratio {large_append_ratio:.2f} (goal >= {LARGE_APPEND_GOAL}, "
            f"best at {best_concurrency} appenders); "
            if large_append_ratio is not None
            else ""
        )
        + "raw fsync ops/s median "
        + ", ".join(f"{size} B: {ops:.0f}" for size, ops in raw_median.items()),
        flush=True,
    )
    summary = {
        "benchmark": "store_append",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "fsync": args.fsync.value,
        "duration_s_per_measurement": args.duration_s,
        "raw_duration_s_per_measurement": raw_duration_s,
        "segments_max": args.segments,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "loadavg_1m_start_end": [round(load_start[0], 2), round(os.getloadavg()[0], 2)],
        "disk": disk,
        "store": [
            {**s.as_json(), "raw_fsync_ops_per_s_interleaved": round(r.ops_per_s, 1)}
            for r, s in pairs
        ],
        "raw_fsync": [r.as_json() for r, _ in pairs],
        "raw_fsync_median_ops_per_s": {str(k): round(v, 1) for k, v in raw_median.items()},
        "raw_fdatasync": [f.as_json() for f in fdatasync],
        "ref_append_bytes": args.ref_append_bytes,
        "compare_refs": [
            {
                "size_bytes": s.size_bytes,
                "concurrency": s.concurrency,
                "raw_fsync_mb_per_s": round(r.mb_per_s, 3),
                "without_refs_mb_per_s": round(b.mb_per_s, 3),
                "with_refs_mb_per_s": round(s.mb_per_s, 3),
                "without_refs_ratio_to_raw": round(_ratio(b.mb_per_s, r.mb_per_s), 3),
                "with_refs_ratio_to_raw": round(_ratio(s.mb_per_s, r.mb_per_s), 3),
                "after_over_before": round(_ratio(s.mb_per_s, b.mb_per_s), 3),
                "without_refs_cpu_us_per_op": b.as_json()["cpu_us_per_op"],
                "with_refs_cpu_us_per_op": s.as_json()["cpu_us_per_op"],
            }
            for r, b, s in baselines
        ],
        "group_commit_ratio": None if group_commit_ratio is None else round(group_commit_ratio, 3),
        "group_commit_goal": GROUP_COMMIT_GOAL,
        "large_append_ratio": None if large_append_ratio is None else round(large_append_ratio, 3),
        "large_append_goal": LARGE_APPEND_GOAL,
        "large_append_best_concurrency": best_concurrency,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
