"""Kill -9 crash test of DiskStore: acknowledged appends survive, exactly once, in order.

Each round starts ``crash_appender.py`` as a child process on the same data
directory (``fsync=always``). The child runs concurrent appenders on several
segments and prints one line per acknowledged append, after its ``await``
returned. The parent reads those lines and kills the child with SIGKILL at a
moment picked by the round's random plan: after a number of
acknowledgements, a short while after the child said it was ready, or a
short while after it was spawned (which often lands inside recovery).

After every kill the parent opens the store (in place, or on a copy of the
crashed directory so that the next child has to recover it itself) and checks
architecture.md#invariant-no-loss:

* every segment parses as whole, intact records (nothing torn is readable);
* each appender's sequence numbers are 0..n, each exactly once, in order;
* every append is contiguous and whole (its records are adjacent);
* every acknowledged append is there, at the offset it was acknowledged at;
* writer dedup state is consistent: retries after an acknowledgement are
  duplicates, the stored writer attribute is the writer's last stored event
  number, and ``previous_event_number`` always matched what was stored;

then closes it and runs ``headrace verify`` on the directory, which must exit 0.
On the copy rounds ``headrace verify`` also runs on the crashed directory before
anything recovered it: a kill must leave nothing worse than a torn WAL tail.
Half the rounds give the child a small ``checkpoint_wal_bytes`` so that kills
land inside checkpoints too, and half a low ``ref_append_bytes`` so that most
appends are written once, to the data file, and logged by reference (with the
default threshold, 256 KiB, almost none of the child's appends is).

Randomness is deterministic from ``HEADRACE_CRASH_SEED`` (default below) and
the round number; the seed is in every failure message. ``HEADRACE_CRASH_ROUNDS``
changes the number of rounds.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from headrace.store import DiskStore
from headrace.store.api import FsyncPolicy
from headrace.types import NULL_ATTRIBUTE_VALUE
from tests.store.crash_appender import (
    APPENDERS_PER_SEGMENT,
    SEGMENT_NAMES,
    RecordError,
    is_writer,
    parse_segment,
    writer_id,
)

SEED = int(os.environ.get("HEADRACE_CRASH_SEED", "20261122"))
ROUNDS = int(os.environ.get("HEADRACE_CRASH_ROUNDS", "20"))
CHILD_SCRIPT = Path(__file__).with_name("crash_appender.py")

MAX_ACKS_BEFORE_KILL = 200
"""Upper bound of the "kill after n acknowledgements" plan; keeps a round short."""

MAX_DELAY_AFTER_READY_S = 0.15
MAX_DELAY_AFTER_SPAWN_S = 1.0
"""Child start-up (interpreter, imports, open, recovery) takes a few hundred ms,
so delays up to a second after spawning land in recovery as well as in appends."""

SMALL_CHECKPOINT_WAL_BYTES = (64 * 1024, 1024 * 1024)
"""Half the rounds run the child with one of these WAL sizes per checkpoint (instead
of the default), so that kills also land inside checkpoints."""

LOW_REF_APPEND_BYTES = (None, 300)
"""Half the rounds log every append of 300 bytes or more by reference (APPEND_REF;
the child's appends are mostly 0-8 KiB), the others keep the default threshold."""

ROUND_TIMEOUT_S = 20.0
"""A round whose kill condition is not reached by then means the child stalled."""

KILL_TIMEOUT_S = 10.0
"""Bound on reaping the killed child and reading the rest of its output."""

CHECK_TIMEOUT_S = 60.0
"""Bound on reopening (recovering) and checking the store in the parent."""

VERIFY_TIMEOUT_S = 60.0
"""Bound on one ``headrace verify`` run."""


@dataclass(frozen=True, slots=True)
class Ack:
    """One acknowledged append as the child reported it."""

    round_number: int
    segment: int
    appender: int
    first: int
    count: int
    size_bytes: int
    offset: int
    length: int
    previous_event_number: int
    duplicate: bool
    kind: str

    @classmethod
    def parse(cls, round_number: int, line: str) -> Ack:
        tag, *fields = line.split()
        assert tag == "A" and len(fields) == 10, line
        numbers = [int(f) for f in fields[:9]]
        return cls(round_number, *numbers[:8], bool(numbers[8]), fields[9])


@dataclass(slots=True)
class History:
    """Everything acknowledged so far, over all rounds."""

    acks: list[Ack] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def writer_next(self) -> dict[str, int]:
        """One past each writer's last acknowledged sequence number."""
        result: dict[str, int] = {}
        for ack in self.acks:
            key = f"{ack.segment}/{ack.appender}"
            result[key] = max(result.get(key, 0), ack.first + ack.count)
        return {k: v for k, v in result.items() if is_writer(int(k.split("/")[1]))}


class LineReader:
    """Complete lines from a pipe, with a deadline on every wait (no blocking reads)."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self._fd = pipe.fileno()
        os.set_blocking(self._fd, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._fd, selectors.EVENT_READ)
        self._buffer = b""
        self.eof = False

    def read_lines(self, timeout_s: float) -> list[str]:
        """Lines completed within ``timeout_s`` (maybe none). A partial last line
        at end of file is dropped: the child never finished saying it."""
        if self.eof or not self._selector.select(max(0.0, timeout_s)):
            return []
        try:
            chunk = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return []
        if not chunk:
            self.eof = True
            return []
        *lines, self._buffer = (self._buffer + chunk).split(b"\n")
        return [line.decode() for line in lines]

    def close(self) -> None:
        self._selector.close()


@dataclass(frozen=True, slots=True)
class KillPlan:
    mode: str  # "acks" | "after_ready" | "after_spawn"
    acks: int = 0
    delay_s: float = 0.0

    @classmethod
    def draw(cls, rng: random.Random) -> KillPlan:
        mode = rng.choice(["acks", "acks", "after_ready", "after_spawn"])
        if mode == "acks":
            return cls(mode, acks=rng.randint(1, MAX_ACKS_BEFORE_KILL))
        limit = MAX_DELAY_AFTER_READY_S if mode == "after_ready" else MAX_DELAY_AFTER_SPAWN_S
        return cls(mode, delay_s=rng.uniform(0.0, limit))


def _tail(path: Path, size_bytes: int = 4000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-size_bytes:]


def run_round(
    round_number: int,
    data_dir: Path,
    work_dir: Path,
    history: History,
    context: str,
    policy: FsyncPolicy = FsyncPolicy.ALWAYS,
) -> str:
    """Start the child, kill it as planned, and record what it acknowledged.

    Returns the failure-message context, now naming the round's plan."""
    rng = random.Random(f"{SEED}/kill/{round_number}")
    plan = KillPlan.draw(rng)
    checkpoint_wal_bytes = rng.choice(SMALL_CHECKPOINT_WAL_BYTES + (None,) * 2)
    ref_append_bytes = rng.choice(LOW_REF_APPEND_BYTES)
    context = (
        f"{context} plan={plan} checkpoint_wal_bytes={checkpoint_wal_bytes}"
        f" ref_append_bytes={ref_append_bytes}"
    )
    state_path = work_dir / "state.json"
    state = {
        "seed": SEED,
        "round": round_number,
        "writer_next": history.writer_next(),
        "checkpoint_wal_bytes": checkpoint_wal_bytes,
        "ref_append_bytes": ref_append_bytes,
        "fsync": policy.value,
    }
    state_path.write_text(json.dumps(state))
    stderr_path = work_dir / f"child-{round_number}.stderr"

    with stderr_path.open("wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, str(CHILD_SCRIPT), str(data_dir), str(state_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    assert child.stdout is not None
    reader = LineReader(child.stdout)
    acks_this_round = 0
    seen: list[str] = []

    def handle(line: str) -> None:
        nonlocal acks_this_round
        seen.append(line.split(" ", 1)[0])
        if line.startswith("A "):
            ack = Ack.parse(round_number, line)
            history.acks.append(ack)
            history.stats[f"kind_{ack.kind}_dup{int(ack.duplicate)}"] += 1
            acks_this_round += 1

    try:
        spawned = time.monotonic()
        deadline = spawned + ROUND_TIMEOUT_S
        kill_at = spawned + plan.delay_s if plan.mode == "after_spawn" else None
        while True:
            now = time.monotonic()
            if kill_at is not None and now >= kill_at:
                break
            if plan.mode == "acks" and acks_this_round >= plan.acks:
                break
            if now >= deadline:
                pytest.fail(
                    f"{context}: child made no progress to its kill point within "
                    f"{ROUND_TIMEOUT_S} s (stalled?); lines seen: {seen[-5:]}; "
                    f"stderr:\n{_tail(stderr_path)}"
                )
            if reader.eof:
                child.wait(timeout=KILL_TIMEOUT_S)
                pytest.fail(
                    f"{context}: child exited on its own with {child.returncode} "
                    f"before it was killed; stderr:\n{_tail(stderr_path)}"
                )
            wait_s = deadline - now if kill_at is None else min(deadline, kill_at) - now
            for line in reader.read_lines(wait_s):
                handle(line)
                if line == "READY" and plan.mode == "after_ready":
                    kill_at = time.monotonic() + plan.delay_s
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=KILL_TIMEOUT_S)
        drain_deadline = time.monotonic() + KILL_TIMEOUT_S
        while not reader.eof:
            if time.monotonic() >= drain_deadline:
                pytest.fail(f"{context}: child output did not end after the kill")
            for line in reader.read_lines(drain_deadline - time.monotonic()):
                handle(line)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=KILL_TIMEOUT_S)
        reader.close()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL, (
        f"{context}: child ended with {child.returncode}, not by the kill; "
        f"stderr:\n{_tail(stderr_path)}"
    )
    history.stats["rounds_with_acks"] += acks_this_round > 0
    history.stats["killed_before_ready"] += "READY" not in seen
    return context


async def check_store(data_dir: Path, history: History, context: str) -> None:
    """Reopen the store and check every invariant against what was acknowledged."""
    store = await DiskStore.open(data_dir, fsync=FsyncPolicy.ALWAYS)
    try:
        names = await store.list_segments()
        acked_segments = {ack.segment for ack in history.acks}
        for segment in acked_segments:
            assert SEGMENT_NAMES[segment] in names, (
                f"{context}: segment {SEGMENT_NAMES[segment]!r} has acknowledged appends "
                f"but is gone; segments: {names}"
            )
        assert set(names) <= set(SEGMENT_NAMES), f"{context}: unexpected segments {names}"
        for segment, name in enumerate(SEGMENT_NAMES):
            if name in names:
                await _check_segment(store, segment, name, history, context)
    finally:
        await store.close()


async def _check_segment(
    store: DiskStore, segment: int, name: str, history: History, context: str
) -> None:
    context = f"{context} segment={name!r}"
    info = await store.info(name)
    assert info.start_offset == 0, f"{context}: start offset moved to {info.start_offset}"
    assert not info.sealed, f"{context}: segment sealed by itself"
    chunks = []
    offset = 0
    while offset < info.length:
        result = await store.read(name, offset, 8 * 1024 * 1024)
        assert result.data, f"{context}: empty read at {offset} below length {info.length}"
        chunks.append(result.data)
        offset += len(result.data)
    data = b"".join(chunks)
    assert len(data) == info.length, f"{context}: read {len(data)} bytes, length {info.length}"
    try:
        records = parse_segment(data)
    except RecordError as error:
        pytest.fail(f"{context}: stored bytes do not parse: {error}")

    # Appends are whole and contiguous; record the start and size of each.
    appends: dict[tuple[int, int], tuple[int, int, int]] = {}  # (app, first) -> offset, count, size
    index = 0
    while index < len(records):
        head = records[index]
        assert head.segment == segment, f"{context}: record of segment {head.segment} here"
        assert head.seq == head.first_seq, (
            f"{context}: append of appender {head.appender} at offset {head.offset} "
            f"starts with record {head.seq}, not its first {head.first_seq} (torn append?)"
        )
        group = records[index : index + head.count]
        expected = [(head.appender, head.first_seq + i, head.first_seq) for i in range(head.count)]
        assert [(r.appender, r.seq, r.first_seq) for r in group] == expected, (
            f"{context}: append at offset {head.offset} is not whole and contiguous"
        )
        key = (head.appender, head.first_seq)
        assert key not in appends, (
            f"{context}: append {key} stored twice, at {appends[key][0]} and {head.offset}"
        )
        appends[key] = (head.offset, head.count, sum(r.size_bytes for r in group))
        index += head.count

    # Per appender: 0..n, each once, in offset order (appends are awaited one by one).
    stored_last: dict[int, int] = {}
    for appender in range(APPENDERS_PER_SEGMENT):
        seqs = [r.seq for r in records if r.appender == appender]
        assert seqs == list(range(len(seqs))), (
            f"{context}: appender {appender} stored sequence numbers are not 0..n once "
            f"each in order (lost, duplicated or reordered): {_describe_gaps(seqs)}"
        )
        if seqs:
            stored_last[appender] = seqs[-1]

    # Every acknowledged append, where it was acknowledged, with consistent writer state.
    for ack in history.acks:
        if ack.segment != segment:
            continue
        where = f"{context}: acknowledged {ack}"
        stored = appends.get((ack.appender, ack.first))
        assert stored is not None, f"{where} is missing (acknowledged data lost)"
        stored_offset, stored_count, stored_size = stored
        assert (stored_count, stored_size) == (ack.count, ack.size_bytes), f"{where}: {stored}"
        if not is_writer(ack.appender):
            assert not ack.duplicate, f"{where}: a plain append reported as duplicate"
            assert ack.previous_event_number == NULL_ATTRIBUTE_VALUE, where
        elif ack.duplicate:
            assert ack.previous_event_number >= ack.first + ack.count - 1, (
                f"{where}: duplicate, yet the writer's previous event number was lower"
            )
        else:
            expected_previous = ack.first - 1 if ack.first > 0 else NULL_ATTRIBUTE_VALUE
            assert ack.previous_event_number == expected_previous, (
                f"{where}: previous event number should have been {expected_previous}"
            )
        if ack.kind == "r":
            assert ack.duplicate, f"{where}: a retry after the acknowledgement was stored again"
        if not ack.duplicate:
            assert (ack.offset, ack.length) == (stored_offset, stored_offset + ack.size_bytes), (
                f"{where}: stored at offset {stored_offset} instead"
            )

    expected_attributes = {
        writer_id(segment, appender): last
        for appender, last in stored_last.items()
        if is_writer(appender)
    }
    assert dict(info.attributes) == expected_attributes, (
        f"{context}: writer attributes {dict(info.attributes)} do not match the last "
        f"stored event numbers {expected_attributes}"
    )
    history.stats["stored_records"] += len(records)
    history.stats["stored_bytes"] += len(data)


def _describe_gaps(seqs: list[int]) -> str:
    problems = [f"{a}->{b}" for a, b in itertools.pairwise(seqs) if b != a + 1]
    head = f"first={seqs[0]}" if seqs else "empty"
    return f"{len(seqs)} records, {head}, breaks: {problems[:10]}"


def run_verify(data_dir: Path, context: str) -> str:
    """Run ``headrace verify`` on ``data_dir``; it must exit 0. Returns its output."""
    done = subprocess.run(
        [sys.executable, "-m", "headrace", "verify", str(data_dir)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=VERIFY_TIMEOUT_S,
    )
    assert done.returncode == 0, (
        f"{context}: headrace verify exited {done.returncode}\n"
        f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    )
    return done.stdout


def check_after_crash(data_dir: Path, history: History, context: str) -> None:
    started = time.monotonic()
    asyncio.run(asyncio.wait_for(check_store(data_dir, history, context), CHECK_TIMEOUT_S))
    checked = time.monotonic()
    run_verify(data_dir, context)
    history.stats["check_ms"] += int((checked - started) * 1000)
    history.stats["verify_ms"] += int((time.monotonic() - checked) * 1000)


def run_crash_rounds(tmp_path: Path, rounds: int, policies: tuple[FsyncPolicy, ...]) -> None:
    """``rounds`` kill -9 rounds on one data dir, the child's policy cycling through
    ``policies``; every check of the module docstring after every kill."""
    data_dir = tmp_path / "data"
    copy_dir = tmp_path / "copy"
    work_dir = tmp_path / "work"
    work_dir.mkdir()
    history = History()
    started = time.monotonic()
    for round_number in range(rounds):
        policy = policies[round_number % len(policies)]
        context = f"[HEADRACE_CRASH_SEED={SEED} round {round_number}/{rounds} fsync={policy}]"
        round_started = time.monotonic()
        context = run_round(round_number, data_dir, work_dir, history, context, policy)
        history.stats["child_ms"] += int((time.monotonic() - round_started) * 1000)
        if not data_dir.exists():  # killed before the store created its directory
            continue
        if round_number % 2:
            # The crashed directory as it is must verify (a torn tail is a note,
            # not damage). Then check a copy: the next child must recover the
            # crashed original itself.
            report = run_verify(data_dir, f"{context} (crashed, before recovery)")
            history.stats["torn_wal_tails"] += report.count("torn tail of")
            shutil.rmtree(copy_dir, ignore_errors=True)
            shutil.copytree(data_dir, copy_dir, symlinks=True)
            check_after_crash(copy_dir, history, f"{context} (copy)")
        else:
            check_after_crash(data_dir, history, context)
    final_context = f"[HEADRACE_CRASH_SEED={SEED} final]"
    check_after_crash(data_dir, history, final_context)

    stats = dict(history.stats)
    elapsed_s = time.monotonic() - started
    print(f"crash test seed={SEED} rounds={rounds} {policies} {elapsed_s:.1f}s {stats}")
    # The rounds must really have exercised the store, or the checks above prove nothing.
    assert len(history.acks) >= rounds, f"{final_context}: too few acknowledgements {stats}"
    assert stats.get("rounds_with_acks", 0) >= rounds // 2, f"{final_context}: {stats}"
    assert stats.get("kind_r_dup1", 0) > 0, f"{final_context}: no retry was exercised {stats}"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_acknowledged_appends_survive_kill_9_exactly_once(tmp_path: Path) -> None:
    run_crash_rounds(tmp_path, ROUNDS, (FsyncPolicy.ALWAYS,))


RELAXED_ROUNDS = 4


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_acknowledged_appends_survive_kill_9_under_interval_and_never(tmp_path: Path) -> None:
    # FsyncPolicy: under INTERVAL and NEVER a process crash (not a power
    # failure) loses nothing acknowledged either, since the OS has the bytes.
    run_crash_rounds(tmp_path, RELAXED_ROUNDS, (FsyncPolicy.INTERVAL, FsyncPolicy.NEVER))


FRESH_ROUNDS = 6
MAX_DELAY_AFTER_START_S = 0.04
"""Opening a fresh data dir (manifest, containers, first WALs, all synced) takes
tens of ms, so kills this soon after ``START`` land inside its creation."""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_fresh_data_dir_killed_while_created_opens_cleanly(tmp_path: Path) -> None:
    for round_number in range(FRESH_ROUNDS):
        context = f"[HEADRACE_CRASH_SEED={SEED} fresh round {round_number}/{FRESH_ROUNDS}]"
        data_dir = tmp_path / f"data-{round_number}"
        state_path = tmp_path / f"state-{round_number}.json"
        state_path.write_text(json.dumps({"seed": SEED, "round": round_number}))
        delay_s = random.Random(f"{SEED}/fresh/{round_number}").uniform(
            0.0, MAX_DELAY_AFTER_START_S
        )
        stderr_path = tmp_path / f"fresh-{round_number}.stderr"
        with stderr_path.open("wb") as stderr:
            child = subprocess.Popen(
                [sys.executable, str(CHILD_SCRIPT), str(data_dir), str(state_path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        assert child.stdout is not None
        reader = LineReader(child.stdout)
        try:
            deadline = time.monotonic() + ROUND_TIMEOUT_S
            kill_at: float | None = None
            while kill_at is None or time.monotonic() < kill_at:
                now = time.monotonic()
                if now >= deadline or reader.eof:
                    pytest.fail(
                        f"{context}: child never reached START (eof={reader.eof}); "
                        f"stderr:\n{_tail(stderr_path)}"
                    )
                wait_s = deadline - now if kill_at is None else kill_at - now
                if "START" in reader.read_lines(wait_s) and kill_at is None:
                    kill_at = time.monotonic() + delay_s
        finally:
            child.kill()
            child.wait(timeout=KILL_TIMEOUT_S)
            reader.close()
            child.stdout.close()
        assert child.returncode == -signal.SIGKILL, (
            f"{context}: child ended with {child.returncode}; stderr:\n{_tail(stderr_path)}"
        )
        # Whatever the kill left, the store opens (finishing or redoing the
        # creation) and holds nothing but the crash test's own segments.
        check_after_crash(data_dir, History(), f"{context} delay={delay_s:.3f}s")
