"""The leader's placement (``headrace.cluster.placement``): examples and properties.

The property tests run the whole protocol on records alone: the leader's
``plan`` is applied, then the members' side of the handshake (an owner
releases a moving container to a live target, a live target claims a
released one at ``epoch + 1``), in rounds where any member may lag, until
nothing is left to do.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.cluster.layout import UNOWNED, ContainerRecord, ContainerState
from headrace.cluster.placement import (
    Action,
    AddReplica,
    Assign,
    CancelMove,
    FailOver,
    Move,
    apply,
    plan,
)
from tests._hypothesis import examples

OWNED, MOVING, RELEASED = ContainerState.OWNED, ContainerState.MOVING, ContainerState.RELEASED
NODES = ("n0", "n1", "n2", "n3", "n4", "n5")


def owned(owner: str, epoch: int = 1) -> ContainerRecord:
    return ContainerRecord(owner, epoch, OWNED)


def test_unowned_containers_are_assigned_at_once_round_robin() -> None:
    records = dict.fromkeys(range(7), UNOWNED)
    assert plan(records, {"b", "a", "c"}, set()) == [
        Assign(0, "a"),
        Assign(1, "b"),
        Assign(2, "c"),
        Assign(3, "a"),
        Assign(4, "b"),
        Assign(5, "c"),
        Assign(6, "a"),
    ]


def test_assignments_fill_the_emptiest_nodes_first() -> None:
    records = {0: owned("a"), 1: owned("a"), 2: UNOWNED, 3: UNOWNED}
    assert plan(records, {"a", "b"}, set()) == [Assign(2, "b"), Assign(3, "b")]


def test_nothing_is_placed_on_a_dead_or_draining_node() -> None:
    records = {0: UNOWNED, 1: dataclasses.replace(UNOWNED, target="dead")}
    assert plan(records, {"a", "drained"}, {"drained"}) == [Assign(0, "a"), Assign(1, "a")]
    assert plan(records, {"drained"}, {"drained"}) == []


def test_a_new_node_gets_one_container_at_a_time() -> None:
    records = {c: owned("a") for c in range(4)}
    assert plan(records, {"a", "b"}, set()) == [Move(0, "a", "b")]
    moving = {**records, 0: apply(records[0], Move(0, "a", "b"))}
    assert moving[0] == ContainerRecord("a", 1, MOVING, "b")
    assert plan(moving, {"a", "b"}, set()) == []  # the move is in course
    released = {**records, 0: ContainerRecord("a", 1, RELEASED, "b")}
    assert plan(released, {"a", "b"}, set()) == []  # the claim is in course
    claimed = {**records, 0: owned("b", 2)}
    assert plan(claimed, {"a", "b"}, set()) == [Move(1, "a", "b")]
    done = {**claimed, 1: owned("b", 2)}
    assert plan(done, {"a", "b"}, set()) == []


def test_a_draining_node_is_emptied_before_any_balancing() -> None:
    records = {0: owned("a"), 1: owned("a"), 2: owned("a"), 3: owned("b")}
    assert plan(records, {"a", "b", "c"}, {"b"}) == [Move(3, "b", "c")]


def test_a_dead_nodes_containers_stay_with_it() -> None:
    records = {
        0: owned("dead"),
        1: ContainerRecord("dead", 3, MOVING, "a"),
        2: ContainerRecord("a", 2, RELEASED, "dead"),
        3: owned("a"),
    }
    assert plan(records, {"a", "b"}, set()) == []


def test_a_move_to_a_node_that_died_or_drains_is_called_off() -> None:
    records = {0: ContainerRecord("a", 1, MOVING, "b"), 1: ContainerRecord("a", 1, MOVING, "c")}
    actions = plan(records, {"a", "c"}, {"c"})
    assert actions == [CancelMove(0), CancelMove(1)]
    assert apply(records[0], actions[0]) == owned("a")


# --------------------------------------------------------------------------- properties


@st.composite
def records_strategy(draw: st.DrawFn) -> dict[int, ContainerRecord]:
    count = draw(st.integers(1, 24))
    node = st.sampled_from(NODES)
    records: dict[int, ContainerRecord] = {}
    for container in range(count):
        kind = draw(st.sampled_from(["unowned", "assigned", "owned", "moving", "released"]))
        epoch = draw(st.integers(1, 5))
        owner = draw(node)
        other = draw(node.filter(lambda n, owner=owner: n != owner))
        records[container] = {
            "unowned": UNOWNED,
            "assigned": dataclasses.replace(UNOWNED, target=other),
            "owned": owned(owner, epoch),
            "moving": ContainerRecord(owner, epoch, MOVING, other),
            "released": ContainerRecord(owner, epoch, RELEASED, other),
        }[kind]
    return records


def _in_flight(records: dict[int, ContainerRecord], live: set[str]) -> bool:
    return any(
        (r.state is MOVING and r.owner in live) or (r.state is RELEASED and r.target in live)
        for r in records.values()
    )


def _check_plan(
    records: dict[int, ContainerRecord], live: set[str], draining: set[str], actions: list[Action]
) -> None:
    eligible = live - draining
    moves = [a for a in actions if isinstance(a, Move)]
    assert len(moves) <= 1, "one move at a time"
    if moves:
        assert actions == moves and not _in_flight(records, live)
    for action in actions:
        if isinstance(action, Assign | Move):
            assert action.target in eligible, f"{action} places on a dead or draining node"
        if isinstance(action, Move):
            assert records[action.container] == owned(
                action.source, records[action.container].epoch
            )
    # the same input, in another order, gives the same plan
    shuffled = dict(reversed(list(records.items())))
    assert plan(shuffled, sorted(live, reverse=True), list(draining)) == actions


@settings(max_examples=examples(150), deadline=None)
@given(
    records=records_strategy(),
    live=st.sets(st.sampled_from(NODES)),
    draining=st.sets(st.sampled_from(NODES), max_size=3),
    data=st.data(),
)
def test_placement_converges_to_a_balance_one_move_at_a_time(
    records: dict[int, ContainerRecord],
    live: set[str],
    draining: set[str],
    data: st.DataObject,
) -> None:
    start = dict(records)
    eligible = live - draining
    bound = 4 * len(records) * (len(NODES) + 2) + 10
    for _ in range(bound):
        actions = plan(records, live, draining)
        _check_plan(records, live, draining, actions)
        for action in actions:
            records[action.container] = apply(records[action.container], action)
        # the members' side of the handshake; any of them may lag a round
        due = {
            c: dataclasses.replace(r, state=RELEASED)
            if r.state is MOVING
            else ContainerRecord(r.target, r.epoch + 1, OWNED)
            for c, r in records.items()
            if (r.state is MOVING and r.owner in live and r.target in live)
            or (r.state is RELEASED and r.target in live)
        }
        if not actions and not due:
            break
        lagging = data.draw(st.sets(st.sampled_from(sorted(due)))) if due and actions else set()
        for container, record in due.items():
            if container not in lagging or not actions:
                assert record.epoch >= records[container].epoch
                records[container] = record
    else:
        raise AssertionError(f"no convergence in {bound} rounds")

    # containers whose data is on a dead node did not move
    for container, record in start.items():
        holder = record.owner if record.state is not RELEASED else record.target
        if record.epoch > 0 and holder not in live:
            final = records[container]
            assert (final.owner, final.epoch) == (record.owner, record.epoch)
    if not eligible:
        return
    # every never-owned container got an owner; nothing left on a live draining node
    assert all(r.epoch > 0 for r in records.values())
    assert not [r for r in records.values() if r.owner in draining & live and r.state is OWNED]
    counts = {n: 0 for n in eligible}
    for record in records.values():
        if record.state is OWNED and record.owner in eligible:
            counts[record.owner] += 1
    assert max(counts.values()) - min(counts.values()) <= 1


def test_replicated_containers_get_copies_fail_over_in_sync_and_move_leadership_only() -> None:
    released = ContainerRecord(None, 0, ContainerState.RELEASED)
    actions = plan({0: released, 1: released}, ["a", "b", "c"], [], replication_factor=2)
    assert actions == [Assign(0, "a", ("a", "b")), Assign(1, "b", ("b", "c"))]
    assert apply(released, actions[0]).in_sync == ("a", "b")

    # A new replicated container waits for as many eligible nodes as copies.
    assert plan({0: released}, ["a"], [], replication_factor=2) == []
    # A container short of copies gets one on a node that joins.
    alone = ContainerRecord("a", 1, ContainerState.OWNED, None, ("a",), ("a",))
    assert plan({0: alone}, ["a", "b"], [], replication_factor=3) == [AddReplica(0, "b")]
    assert apply(alone, AddReplica(0, "b")).replicas == ("a", "b")

    # A dead owner's container goes to a live in-sync copy, not to any live node.
    owned = ContainerRecord("a", 3, ContainerState.OWNED, None, ("a", "b", "c"), ("a", "c"))
    assert plan({0: owned}, ["b", "c"], [], replication_factor=3) == [FailOver(0, "c")]
    failed = apply(owned, FailOver(0, "c"))
    assert failed.state is ContainerState.RELEASED and failed.target == "c"
    assert failed.in_sync == ("c",) and failed.epoch == 3
    # No live in-sync copy: it stays offline.
    lone = ContainerRecord("a", 3, ContainerState.OWNED, None, ("a", "b"), ("a",))
    assert plan({0: lone}, ["b"], [], replication_factor=2) == []

    # Balancing moves leadership only to an in-sync copy.
    records = {
        0: ContainerRecord("a", 1, ContainerState.OWNED, None, ("a", "b"), ("a",)),
        1: ContainerRecord("a", 1, ContainerState.OWNED, None, ("a", "b"), ("a",)),
    }
    assert plan(records, ["a", "b"], [], replication_factor=2) == []  # b is in sync with neither
    records[2] = ContainerRecord("a", 1, ContainerState.OWNED, None, ("a", "b"), ("a", "b"))
    assert plan(records, ["a", "b"], [], replication_factor=2) == [Move(2, "a", "b")]
