"""The decisions of container replication, as pure functions (``docs/replication.md``).

No I/O, no clock, no ZooKeeper here: each rule takes what a node knows and
returns what it must do, so the rules are tested on their own, with
properties over random histories of leaders, appends and failures.

Terms. A container's log is its sequence of records, numbered from 1 (its
WAL's sequence numbers); a log's *end* is its last record's number (0: empty).
Every record was written by the leader of one *epoch*: a container's epoch is
bumped by a version-conditional write of its ZooKeeper record each time its
leader changes, so one epoch has one leader, and that leader only ever
appends to its log during it. A replica keeps its **epoch history**: for each
epoch that wrote records into its log, the number of the first one
(``EpochStart``). Two logs holding a record of the same epoch at the same
number hold the same records up to it (the *log-matching* property): that
record was written by that epoch's one leader, which had the same prefix.

The rules:

* ``begin_epoch``: a new leader starts its epoch at its own log end + 1.
* ``truncation_point``: where a follower's log stops matching the leader's,
  found from the two epoch histories alone (Kafka's leader-epoch truncation,
  KIP-101 and KIP-279): the follower cuts its log there, then copies the
  leader's records from the next one. Records it cuts were never committed.
* ``commit_point``: a record is committed (and only then acknowledged to the
  client and readable) once **every** member of the in-sync set holds it
  durably, and only while that set has at least ``min_in_sync`` members.
  Counting every member, not a quorum, is what lets ZooKeeper pick any
  in-sync member as the next leader: each holds every committed record.
* ``in_sync_after``: a follower that has not reached the leader's end for
  ``lag_max_s`` leaves the in-sync set; one that holds every committed record
  of the current epoch joins it. The leader changes the set in ZooKeeper
  (version-conditional) *before* it acts on it.
* ``choose_leader``: the next leader is a live member of the in-sync set;
  with none alive the container stays offline (never an unclean election).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "EpochHistory",
    "EpochStart",
    "FollowerProgress",
    "begin_epoch",
    "check_history",
    "choose_leader",
    "commit_point",
    "end_for_epoch",
    "epoch_of",
    "extend_history",
    "in_sync_after",
    "truncate_history",
    "truncation_point",
]


@dataclass(frozen=True, slots=True, order=True)
class EpochStart:
    """The first record number ``start_seq`` a replica's log holds from ``epoch``."""

    epoch: int
    start_seq: int


EpochHistory = tuple[EpochStart, ...]
"""Ascending in epoch and in ``start_seq``; every entry but the last holds at least one record."""


def check_history(history: EpochHistory, end: int) -> None:
    """Raise ValueError if ``history`` is not a valid history of a log ending at ``end``."""
    previous: EpochStart | None = None
    for entry in history:
        if entry.epoch < 1 or entry.start_seq < 1:
            raise ValueError(f"epoch history entry {entry} is not positive")
        if previous is not None and (
            entry.epoch <= previous.epoch or entry.start_seq <= previous.start_seq
        ):
            raise ValueError(f"epoch history is not ascending at {entry}")
        previous = entry
    if previous is not None and previous.start_seq > end + 1:
        raise ValueError(f"epoch history starts epoch {previous.epoch} past the log's end {end}")
    if end > 0 and (not history or history[0].start_seq != 1):
        raise ValueError("a non-empty log's epoch history must start at record 1")


def begin_epoch(history: EpochHistory, epoch: int, end: int) -> EpochHistory:
    """``history`` of a log ending at ``end`` whose leader starts ``epoch`` now.

    Entries of earlier epochs that wrote nothing (their start is past ``end``)
    are dropped, so every entry but the last holds a record.

    Raises:
        ValueError: ``epoch`` is not above every epoch in the history.
    """
    if history and epoch <= history[-1].epoch:
        raise ValueError(f"epoch {epoch} does not follow {history[-1].epoch}")
    kept = tuple(e for e in history if e.start_seq <= end)
    return (*kept, EpochStart(epoch, end + 1))


def extend_history(history: EpochHistory, epoch: int, first_seq: int) -> EpochHistory:
    """``history`` after a follower wrote records of ``epoch`` from ``first_seq`` on
    (its log ended at ``first_seq`` - 1, so entries starting there held nothing).

    Raises:
        ValueError: ``epoch`` is older than the history's last (a deposed
            leader's records: refused before they reach here).
    """
    if history and history[-1].epoch == epoch:
        return history
    kept = tuple(e for e in history if e.start_seq < first_seq)  # epochs that wrote nothing go
    if kept and epoch < kept[-1].epoch:
        raise ValueError(f"records of epoch {epoch} at {first_seq} after {kept[-1]}")
    return (*kept, EpochStart(epoch, first_seq))


def epoch_of(history: EpochHistory, seq: int) -> int | None:
    """The epoch that wrote record ``seq`` (None: before the history, or ``seq`` < 1)."""
    found = None
    for entry in history:
        if entry.start_seq > seq:
            break
        found = entry.epoch
    return found if seq >= 1 else None


def end_for_epoch(history: EpochHistory, end: int, epoch: int) -> tuple[int, int] | None:
    """What a leader answers a follower whose last epoch is ``epoch``.

    ``(e, last)``: ``e`` is the largest epoch of the leader's history not above
    ``epoch``, and ``last`` the number of the last record the leader holds
    from ``e`` (its log ends at ``end``). None: the leader holds no record of
    ``epoch`` or any earlier one.
    """
    for index in range(len(history) - 1, -1, -1):
        entry = history[index]
        if entry.epoch <= epoch:
            last = history[index + 1].start_seq - 1 if index + 1 < len(history) else end
            return entry.epoch, min(last, end)
    return None


def truncate_history(history: EpochHistory, end: int) -> EpochHistory:
    """``history`` after its log was cut to end at ``end`` (entries past it go)."""
    return tuple(e for e in history if e.start_seq <= end)


def truncation_point(
    leader: EpochHistory, leader_end: int, follower: EpochHistory, follower_end: int
) -> int:
    """The last record number at which the follower's log still matches the leader's.

    The follower keeps its records up to the answer and drops the rest; the
    leader then sends it records from the answer + 1. Asked epoch by epoch, as
    a follower asks a leader over the wire: the follower's last epoch, the
    leader's end for it, and if the leader never wrote in that epoch, the
    follower forgets its records of the epochs the leader does not know and
    asks again.
    """
    history, end = follower, follower_end
    while history:
        last_epoch = history[-1].epoch
        answer = end_for_epoch(leader, leader_end, last_epoch)
        if answer is None:
            return 0
        epoch, last = answer
        if epoch == last_epoch:
            return min(last, end)
        later = [e for e in history if e.epoch > epoch]
        end = min(end, later[0].start_seq - 1)
        history = tuple(e for e in history if e.epoch <= epoch)
    return 0


def commit_point(
    positions: Mapping[str, int], in_sync: Collection[str], min_in_sync: int
) -> int | None:
    """The last committed record, from each replica's durable end.

    ``positions`` maps replica to the end of its durable log (the leader's
    own included); a member of ``in_sync`` without one counts as 0. None: the
    in-sync set has fewer than ``min_in_sync`` members, so nothing new may be
    committed (appends are refused with a retriable error; reads go on).
    """
    if len(in_sync) < min_in_sync or not in_sync:
        return None
    return min(positions.get(member, 0) for member in in_sync)


@dataclass(frozen=True, slots=True)
class FollowerProgress:
    """What the leader knows of one follower in the current epoch."""

    position: int
    """The end of the follower's durable log that matches the leader's (its last ack)."""
    caught_up_at: float
    """When its position last reached the leader's end (at first: when the epoch began)."""


def in_sync_after(
    *,
    now: float,
    leader: str,
    in_sync: Collection[str],
    progress: Mapping[str, FollowerProgress],
    commit: int,
    epoch_start: int,
    lag_max_s: float,
) -> frozenset[str]:
    """The in-sync set the leader should write to ZooKeeper.

    A member that has not been caught up for more than ``lag_max_s`` (or that
    the leader has not heard from in this epoch at all) leaves; a replica that
    is not a member joins once its position holds every committed record and
    everything before the current epoch (``epoch_start`` - 1), so it holds what
    every member holds. The leader is always a member.
    """
    members = {leader}
    for replica, seen in progress.items():
        if replica == leader:
            continue
        if replica in in_sync:
            if now - seen.caught_up_at <= lag_max_s:
                members.add(replica)
        elif seen.position >= max(commit, epoch_start - 1):
            members.add(replica)
    return frozenset(members)


def choose_leader(in_sync: Iterable[str], live: Collection[str]) -> str | None:
    """The next leader: the first live member of the in-sync set by id, or None.

    Any member will do, since each holds every committed record; a container
    whose members are all gone stays offline rather than lose what was
    acknowledged.
    """
    alive = sorted(member for member in in_sync if member in live)
    return alive[0] if alive else None
