"""The replication rules (``cluster/replication_rules.py``): unit cases, then properties
over random histories of a replicated container.

The model: three replicas, a ZooKeeper record (epoch, leader, in-sync set), and
operations drawn by hypothesis: the leader appends (while the in-sync set is
big enough), a follower syncs with the leader (truncating by epoch history,
then copying some records), the leader hears an ack and commits, the in-sync
set shrinks or grows, and the leader fails over to a member of the in-sync
set. After every operation: nothing committed is missing from the leader,
every follower that synced matches the leader's log up to its end, and any two
logs holding one epoch at one number are equal up to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.cluster.replication_rules import (
    EpochHistory,
    EpochStart,
    FollowerProgress,
    begin_epoch,
    check_history,
    choose_leader,
    commit_point,
    end_for_epoch,
    epoch_of,
    extend_history,
    in_sync_after,
    truncate_history,
    truncation_point,
)


def h(*pairs: tuple[int, int]) -> EpochHistory:
    return tuple(EpochStart(e, s) for e, s in pairs)


def test_end_for_epoch_answers_the_largest_epoch_not_above_and_its_last_record() -> None:
    leader = h((1, 1), (3, 5), (4, 9))
    assert end_for_epoch(leader, 12, 4) == (4, 12)
    assert end_for_epoch(leader, 12, 3) == (3, 8)
    assert end_for_epoch(leader, 12, 2) == (1, 4)
    assert end_for_epoch(leader, 12, 9) == (4, 12)
    assert end_for_epoch(h((2, 1)), 3, 1) is None


def test_a_deposed_leaders_uncommitted_tail_is_cut_where_the_new_epoch_began() -> None:
    # Epoch 1 wrote 1..4 everywhere; its leader wrote 5..7 alone and died;
    # the new leader began epoch 2 at 5 and wrote 5..6.
    old = h((1, 1))
    new = h((1, 1), (2, 5))
    assert truncation_point(new, 6, old, 7) == 4
    # A follower of epoch 1 that had 1..3 only keeps all of it.
    assert truncation_point(new, 6, old, 3) == 3
    # A follower ahead in the leader's own epoch keeps what the leader holds.
    assert truncation_point(new, 6, new, 6) == 6
    # Records of an epoch the leader never held at all go.
    assert truncation_point(h((2, 1)), 3, h((1, 1)), 2) == 0
    # Several epochs unknown to the leader: asked one after another.
    assert truncation_point(h((1, 1), (4, 4)), 6, h((1, 1), (2, 4), (3, 6)), 8) == 3
    # The follower's own epoch ends before the leader's epoch it falls back to:
    # its records 3..5 are of epoch 3, which the leader never held.
    assert truncation_point(h((1, 1), (2, 5)), 7, h((1, 1), (3, 3)), 5) == 2


def test_histories_are_begun_extended_cut_and_checked() -> None:
    history = begin_epoch((), 1, 0)
    assert history == h((1, 1))
    # An epoch that wrote nothing is dropped when the next begins.
    assert begin_epoch(history, 2, 0) == h((2, 1))
    history = begin_epoch(history, 3, 4)
    assert history == h((1, 1), (3, 5))
    assert epoch_of(history, 4) == 1 and epoch_of(history, 5) == 3 and epoch_of(history, 0) is None
    assert truncate_history(history, 4) == h((1, 1))
    assert extend_history(h((1, 1)), 1, 3) == h((1, 1))
    assert extend_history(h((1, 1)), 3, 5) == h((1, 1), (3, 5))
    # an epoch that wrote nothing (a leader that appended nothing) is replaced
    assert extend_history(h((1, 1)), 2, 1) == h((2, 1))
    with pytest.raises(ValueError):
        extend_history(h((3, 1)), 2, 5)
    with pytest.raises(ValueError):
        begin_epoch(h((3, 1)), 3, 2)
    check_history(h((1, 1), (3, 5)), 6)
    for bad, end in ((h((2, 1), (1, 3)), 5), (h((1, 2)), 4), (h((1, 1), (2, 9)), 4), ((), 2)):
        with pytest.raises(ValueError):
            check_history(bad, end)


def test_commit_needs_every_in_sync_member_and_at_least_min_in_sync_of_them() -> None:
    assert commit_point({"a": 9, "b": 7, "c": 3}, {"a", "b", "c"}, 2) == 3
    assert commit_point({"a": 9, "b": 7, "c": 3}, {"a", "b"}, 2) == 7
    assert commit_point({"a": 9}, {"a", "b"}, 2) == 0
    assert commit_point({"a": 9, "b": 7}, {"a"}, 2) is None
    assert commit_point({"a": 9}, {"a"}, 1) == 9


def test_laggards_leave_the_in_sync_set_and_caught_up_followers_join() -> None:
    progress = {
        "b": FollowerProgress(position=10, caught_up_at=95.0),
        "c": FollowerProgress(position=4, caught_up_at=80.0),
        "d": FollowerProgress(position=10, caught_up_at=99.0),
        "e": FollowerProgress(position=6, caught_up_at=99.0),
    }
    after = in_sync_after(
        now=100.0,
        leader="a",
        in_sync={"a", "b", "c"},
        progress=progress,
        commit=8,
        epoch_start=5,
        lag_max_s=10.0,
    )
    assert after == {"a", "b", "d"}


def test_the_next_leader_is_a_live_in_sync_member_or_nobody() -> None:
    assert choose_leader({"c", "b"}, {"a", "b", "c"}) == "b"
    assert choose_leader({"c", "b"}, {"a", "c"}) == "c"
    assert choose_leader({"b"}, {"a", "c"}) is None


# --------------------------------------------------------------------------- the model

NODES = ("a", "b", "c")
MIN_IN_SYNC = 2


@dataclass
class Replica:
    log: list[tuple[int, int]] = field(default_factory=list)
    """(epoch, unique id) of each record, record n at index n - 1."""
    history: EpochHistory = ()
    synced: bool = False
    """Truncated against the current leader in the current epoch."""


@dataclass
class Cluster:
    replicas: dict[str, Replica]
    leader: str
    epoch: int
    in_sync: set[str]
    positions: dict[str, int] = field(default_factory=dict)
    committed: list[tuple[int, int]] = field(default_factory=list)
    uid: int = 0

    @property
    def lead(self) -> Replica:
        return self.replicas[self.leader]


def new_cluster() -> Cluster:
    replicas = {n: Replica() for n in NODES}
    replicas["a"].history = begin_epoch((), 1, 0)
    replicas["a"].synced = True
    return Cluster(replicas, "a", 1, set(NODES), {"a": 0})


def append(c: Cluster) -> None:
    if len(c.in_sync) < MIN_IN_SYNC:
        return  # refused: fewer than min in-sync copies
    c.uid += 1
    c.lead.log.append((c.epoch, c.uid))
    c.positions[c.leader] = len(c.lead.log)


def sync(c: Cluster, node: str, count: int) -> None:
    follower = c.replicas[node]
    if node == c.leader:
        return
    if not follower.synced:
        point = truncation_point(
            c.lead.history, len(c.lead.log), follower.history, len(follower.log)
        )
        if node in c.in_sync:
            assert point >= len(c.committed), "a sync would cut a committed record"
        del follower.log[point:]
        follower.history = truncate_history(follower.history, point)
        follower.synced = True
    start = len(follower.log)
    for record in c.lead.log[start : start + count]:
        follower.history = extend_history(follower.history, record[0], len(follower.log) + 1)
        follower.log.append(record)
    c.positions[node] = len(follower.log)


def commit(c: Cluster) -> None:
    point = commit_point(c.positions, c.in_sync, MIN_IN_SYNC)
    if point is not None and point > len(c.committed):
        c.committed = list(c.lead.log[:point])


def change_in_sync(c: Cluster, node: str) -> None:
    if node == c.leader:
        return
    if node in c.in_sync:
        c.in_sync.discard(node)  # it lagged for too long
    elif c.replicas[node].synced and c.positions.get(node, -1) >= len(c.committed):
        c.in_sync.add(node)


def fail_over(c: Cluster) -> None:
    candidates = c.in_sync - {c.leader}
    new = choose_leader(candidates, set(NODES) - {c.leader})
    if new is None:
        return
    c.in_sync.discard(c.leader)
    c.epoch += 1
    c.leader = new
    c.lead.history = begin_epoch(c.lead.history, c.epoch, len(c.lead.log))
    for name, replica in c.replicas.items():
        replica.synced = name == new
    c.positions = {new: len(c.lead.log)}


def check(c: Cluster) -> None:
    lead = c.lead
    assert lead.log[: len(c.committed)] == c.committed, "a committed record was lost"
    for name, replica in c.replicas.items():
        check_history(replica.history, len(replica.log))
        if replica.synced:
            assert replica.log == lead.log[: len(replica.log)], f"{name} diverges"
        for other in c.replicas.values():
            for n in range(min(len(replica.log), len(other.log)), 0, -1):
                if replica.log[n - 1][0] == other.log[n - 1][0]:
                    assert replica.log[:n] == other.log[:n], "log matching broken"
                    break


OPERATION = st.one_of(
    st.just(("append",)),
    st.tuples(st.just("sync"), st.sampled_from(NODES), st.integers(0, 4)),
    st.just(("commit",)),
    st.tuples(st.just("in_sync"), st.sampled_from(NODES)),
    st.just(("fail_over",)),
)


@given(st.lists(OPERATION, max_size=60))
def test_no_committed_record_is_lost_and_synced_logs_match_the_leader(
    operations: list[tuple[object, ...]],
) -> None:
    c = new_cluster()
    for op in operations:
        match op:
            case ("append",):
                append(c)
            case ("sync", str(node), int(count)):
                sync(c, node, count)
            case ("commit",):
                commit(c)
            case ("in_sync", str(node)):
                change_in_sync(c, node)
            case ("fail_over",):
                fail_over(c)
        check(c)


@given(st.lists(OPERATION, max_size=60))
def test_the_truncation_point_is_the_longest_matching_prefix(
    operations: list[tuple[object, ...]],
) -> None:
    c = new_cluster()
    for op in operations:
        match op:
            case ("append",):
                append(c)
            case ("sync", str(node), int(count)):
                sync(c, node, count)
            case ("commit",):
                commit(c)
            case ("in_sync", str(node)):
                change_in_sync(c, node)
            case ("fail_over",):
                fail_over(c)
    lead = c.lead
    for replica in c.replicas.values():
        point = truncation_point(lead.history, len(lead.log), replica.history, len(replica.log))
        assert replica.log[:point] == lead.log[:point]
        longest = 0
        while (
            longest < min(len(replica.log), len(lead.log))
            and replica.log[longest] == lead.log[longest]
        ):
            longest += 1
        assert point == longest
