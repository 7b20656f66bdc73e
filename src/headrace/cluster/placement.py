"""Where containers go: the leader's placement, pure and deterministic.

No I/O here: ``plan`` takes the container records, the live nodes and the
nodes being drained, and returns the writes the leader should make next
(``docs/cluster.md#placement``). The leader (``member.py``) applies them
with version-conditional writes, waits for the records to change, and asks
again. The rules:

* **Eligible nodes** are live and not being drained. Nothing is ever placed
  on another node.
* **Containers that never had an owner** (epoch 0) are assigned at once, each
  to the eligible node with the fewest containers (``Assign``): they hold no
  data, so assigning is not a move. An assignment to a node that died or is
  being drained before it claimed the container is made again.
* **A move whose target died or is being drained is called off**
  (``CancelMove``): the owner keeps the container.
* **One move at a time** (``Move``), and only when nothing else is in course
  (no move, release or claim involving a live node): first off the nodes
  being drained, then from the fullest eligible node to the emptiest while
  they differ by two or more. Done, the eligible nodes' counts differ by at
  most one.
* **A container whose node is dead stays with it** (one copy: its data is
  nowhere else), whether that node owns it or was handed it, until the node
  comes back and claims it (``docs/cluster.md#killed-node``).

With a replication factor above 1 (``docs/replication.md``):

* **An assignment names the copies**: the target leads, and the other
  eligible nodes holding the fewest copies follow (``Assign.replicas``, as
  many as the factor); all start in sync. A never-owned container waits
  until as many nodes as the factor are eligible, so every copy is placed
  from the start and the leaders spread over the nodes.
* **A container whose owner is dead fails over** (``FailOver``) to the first
  live member of its in-sync set (``replication_rules.choose_leader``): the
  record goes ``RELEASED`` to it, without the dead owner in the in-sync set,
  and it claims the container from its own copy at the next epoch. With no
  live member the container stays offline: never an unclean election.
* **A replicated container short of copies gets one more** (``AddReplica``)
  on the eligible node with the fewest, one per round: a node that joins
  later gets copies too. It follows, catches up and joins the in-sync set.
* **A replicated container moves only its leadership**, to an in-sync copy
  (the same handshake; no data moves): balancing and draining pick, for each
  container, the least loaded in-sync node.

Ties break by node id and container number, so the same input always gives
the same plan.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from headrace.cluster.layout import ContainerRecord, ContainerState
from headrace.cluster.replication_rules import choose_leader

__all__ = ["Action", "AddReplica", "Assign", "CancelMove", "FailOver", "Move", "apply", "plan"]


@dataclass(frozen=True, slots=True)
class Assign:
    """Give a never-owned container to ``target``, which then claims it."""

    container: int
    target: str
    replicas: tuple[str, ...] = ()
    """Every copy, the target first (replicated clusters only)."""


@dataclass(frozen=True, slots=True)
class FailOver:
    """The owner of ``container`` is dead: ``target``, in sync, leads next."""

    container: int
    target: str


@dataclass(frozen=True, slots=True)
class AddReplica:
    """Give ``container`` one more copy, on ``node``: it follows the leader,
    catches up and joins the in-sync set when it holds every committed record."""

    container: int
    node: str


@dataclass(frozen=True, slots=True)
class Move:
    """Ask ``source`` (the owner) to hand ``container`` to ``target``."""

    container: int
    source: str
    target: str


@dataclass(frozen=True, slots=True)
class CancelMove:
    """Call off the move of ``container``: its target died or is being drained."""

    container: int


Action = Assign | AddReplica | FailOver | Move | CancelMove


def plan(
    records: Mapping[int, ContainerRecord],
    live: Collection[str],
    draining: Collection[str],
    replication_factor: int = 1,
) -> list[Action]:
    """The leader's next writes: every assignment and cancellation due, else at most one move.

    Args:
        records: every container's record, by container number.
        live: ids of the nodes registered now (``/nodes``).
        draining: ids of the nodes to empty (``/drain``); live or not.
        replication_factor: copies of each new container (``/cluster``).

    Returns:
        Actions in container order; empty when the placement is done (or no
        node is eligible).
    """
    eligible = sorted(set(live) - set(draining))
    if not eligible:
        return []
    load = Counter(
        r.destination for r in records.values() if r.destination in eligible
    )  # containers each eligible node holds or is about to
    copies = Counter(n for r in records.values() for n in r.replicas if n in eligible)
    actions: list[Action] = []
    for container in sorted(records):
        record = records[container]
        if record.replicas and record.epoch > 0:
            failover = _failover(container, record, set(live))
            if failover is not None:
                actions.append(failover)
            elif record.state is ContainerState.MOVING and record.target not in eligible:
                actions.append(CancelMove(container))
            elif (
                record.state is ContainerState.OWNED
                and len(record.replicas) < replication_factor
                and (spare := [n for n in eligible if n not in record.replicas])
            ):
                node = min(spare, key=lambda n: (copies[n], n))
                copies[node] += 1
                actions.append(AddReplica(container, node))
            continue
        if record.state is ContainerState.MOVING and record.target not in eligible:
            actions.append(CancelMove(container))
            if record.owner in eligible:
                load[record.owner] += 1
        elif (
            record.state is ContainerState.RELEASED
            and record.epoch == 0
            and record.target not in eligible
        ):
            if len(eligible) < replication_factor:
                continue  # a new replicated container waits for as many nodes as copies
            target = min(eligible, key=lambda n: (load[n], n))
            load[target] += 1
            if replication_factor <= 1:
                actions.append(Assign(container, target))
                continue
            others = sorted((n for n in eligible if n != target), key=lambda n: (copies[n], n))
            replicas = (target, *others[: replication_factor - 1])
            copies.update(replicas)
            actions.append(Assign(container, target, replicas))
    if actions:
        return actions
    move = _next_move(records, set(live), set(draining), eligible)
    return [] if move is None else [move]


def _failover(container: int, record: ContainerRecord, live: set[str]) -> FailOver | None:
    """The failover a replicated container needs: its owner (or the node it was
    failed over to, before it claimed) is dead and a member in sync is live."""
    if record.state is not ContainerState.RELEASED and record.owner not in live:
        gone = record.owner
    elif record.state is ContainerState.RELEASED and record.epoch > 0 and record.target not in live:
        gone = record.target
    else:
        return None
    target = choose_leader((n for n in record.in_sync if n != gone), live)
    return None if target is None else FailOver(container, target)


def _next_move(
    records: Mapping[int, ContainerRecord],
    live: set[str],
    draining: set[str],
    eligible: list[str],
) -> Move | None:
    for record in records.values():
        if record.state is ContainerState.MOVING and record.owner in live:
            return None  # a move in course: its owner is releasing
        if record.state is ContainerState.RELEASED and record.target in live:
            return None  # a claim in course
    owned = sorted(
        (c, r.owner) for c, r in records.items() if r.state is ContainerState.OWNED and r.owner
    )
    load = Counter({node: 0 for node in eligible})
    load.update(owner for _, owner in owned if owner in load)
    by_load = sorted(eligible, key=lambda n: (load[n], n))
    emptiest = by_load[0]

    def target(container: int, source: str) -> str | None:
        """The least loaded node that may take ``container``: any eligible one, or
        for a replicated container an in-sync copy (leadership moves, data does not)."""
        record = records[container]
        for node in by_load:
            if node != source and (not record.replicas or node in record.in_sync):
                return node
        return None

    for container, owner in owned:
        if owner in draining and owner in live:
            to = target(container, owner)
            if to is not None:
                return Move(container, owner, to)
    for fullest in sorted(eligible, key=lambda n: (-load[n], n)):
        for container, owner in owned:
            if owner != fullest:
                continue
            to = target(container, owner)
            if to is not None and load[fullest] - load[to] >= 2:
                return Move(container, fullest, to)
        if load[fullest] - load[emptiest] < 2:
            break
    return None


def apply(record: ContainerRecord, action: Action) -> ContainerRecord:
    """The record the leader writes for ``action`` (on the version it planned from)."""
    match action:
        case Assign(target=target, replicas=replicas):
            return dataclasses.replace(record, target=target, replicas=replicas, in_sync=replicas)
        case AddReplica(node=node):
            return dataclasses.replace(record, replicas=(*record.replicas, node))
        case FailOver(target=target):
            gone = record.owner if record.state is not ContainerState.RELEASED else record.target
            in_sync = tuple(n for n in record.in_sync if n != gone)
            return dataclasses.replace(
                record, state=ContainerState.RELEASED, target=target, in_sync=in_sync
            )
        case Move(target=target):
            return dataclasses.replace(record, state=ContainerState.MOVING, target=target)
        case CancelMove():
            return dataclasses.replace(record, state=ContainerState.OWNED, target=None)
