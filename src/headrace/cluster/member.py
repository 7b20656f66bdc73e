"""``ClusterMember``: one node's part in the cluster, coordinated by ZooKeeper.

A member (``docs/cluster.md``):

1. connects (``--cluster zk://host:port[,host:port...]/chroot``), creates the
   cluster if the chroot holds none (``/cluster`` and every container record,
   in one transaction) or joins the one there;
2. registers ``/nodes/<id>`` (ephemeral: its doors' endpoints), waiting for a
   previous run's registration to expire if there is one;
3. keeps a view of the cluster (live nodes, drains, the leader, every
   container's record), re-reading what its watches say changed, and tells
   listeners on the asyncio loop (``NodesChanged``, ``LeaderChanged``,
   ``ContainersChanged``, ``OwnershipChanged``);
4. claims the containers its records hand it and hands over the ones the
   leader moves away, through the ``ContainerHooks`` the server supplies
   (``docs/cluster.md#moves``);
5. runs for leader (``/leader``, ephemeral); the leader writes the plan of
   ``placement.py`` with version-conditional writes
   (``docs/cluster.md#placement``).

**Fencing** (``docs/cluster.md#fencing``): the moment the ZooKeeper session
is lost, or its lease runs out (a suspended connection not back in time, a
paused process), ``owns`` answers False for every container (kazoo's thread
marks the session before the loop hears of it), running hooks are cancelled
and listeners get ``OwnershipChanged(fenced=True)``. A connection back
within the lease, in the same session, changes nothing. Once a session is
back after a fence (the same one, or a new one after expiry), the member
confirms its registration and re-claims each container its records still
give it, with a conditional write of ``epoch + 1``; only then does it own it
again.

Everything but ``owns`` runs on the loop that called ``start``; kazoo's
callbacks reach it through ``loop.call_soon_threadsafe`` (``_zk.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, Protocol

from headrace.cluster._zk import CONNECTION_ERRORS, Stat, ZkSession
from headrace.cluster.errors import BadRecord, ClusterError, NodeIdInUse
from headrace.cluster.layout import (
    CLUSTER_PATH,
    CONTAINERS_PATH,
    DEFAULT_CLUSTER_CONTAINERS,
    DRAIN_PATH,
    LEADER_PATH,
    MAPPING_NAMES,
    MAX_CLUSTER_CONTAINERS,
    NODES_PATH,
    UNOWNED,
    ClusterRecord,
    ClusterUrl,
    ContainerRecord,
    ContainerState,
    LeaderRecord,
    NodeInfo,
    check_node_id,
    container_path,
    decode_cluster,
    decode_container,
    decode_leader,
    decode_node,
    drain_path,
    encode,
    node_path,
    parse_cluster_url,
)
from headrace.cluster.placement import apply, plan
from headrace.errors import ConfigError
from headrace.store.disk.layout import SegmentMapping, container_of

__all__ = [
    "SESSION_TIMEOUT_S",
    "START_TIMEOUT_S",
    "ClusterEvent",
    "ClusterMember",
    "ContainerHooks",
    "ContainersChanged",
    "LeaderChanged",
    "NodesChanged",
    "OwnershipChanged",
]

log = logging.getLogger(__name__)

SESSION_TIMEOUT_S: Final = 10.0
"""ZooKeeper session timeout asked for (Pravega's default): how long a node
may be unreachable before its registration and leadership go."""

START_TIMEOUT_S: Final = 30.0
"""Bound on ``start``: connecting, and waiting for a previous run's
registration to expire (at most a session timeout), with room to spare."""

RETRY_DELAY_S: Final = 0.5
"""Pause before trying again after a hook failed or ZooKeeper refused a
call on a live connection, so a persistent failure does not spin."""


class ContainerHooks(Protocol):
    """What the server does when a container comes or goes (``docs/cluster.md#moves``).

    Both run on the loop, one at a time per container. A hook may be
    cancelled when the session is lost (the member then serves nothing);
    a hook that raises is logged and tried again after ``RETRY_DELAY_S``.
    """

    async def acquire(self, container: int, epoch: int) -> None:
        """Get ready to serve ``container`` at ``epoch`` (open and recover its data).

        The member writes the ownership record once this returns, and owns
        the container once that write succeeds; if it fails, ``release``
        follows with ``to=None``.
        """

    async def release(self, container: int, to: NodeInfo | None) -> None:
        """Stop serving ``container``: finish or refuse what is in flight, flush, hand over.

        ``to`` is the node taking it over, or None when a claim did not
        happen and whatever ``acquire`` prepared is to be dropped. The
        member writes ``RELEASED`` once this returns.
        """


class _NoHooks:
    async def acquire(self, container: int, epoch: int) -> None:
        pass

    async def release(self, container: int, to: NodeInfo | None) -> None:
        pass


@dataclass(frozen=True, slots=True)
class NodesChanged:
    """The live nodes or the nodes being drained changed."""

    nodes: frozenset[str]
    draining: frozenset[str]


@dataclass(frozen=True, slots=True)
class LeaderChanged:
    leader: str | None


@dataclass(frozen=True, slots=True)
class ContainersChanged:
    """These containers' records changed (owner, epoch, state or target)."""

    containers: frozenset[int]


@dataclass(frozen=True, slots=True)
class OwnershipChanged:
    """The containers this node owns changed.

    ``fenced``: the ZooKeeper session is suspended or lost, so it owns
    nothing until a session confirms its records again.
    """

    owned: frozenset[int]
    fenced: bool = False


ClusterEvent = NodesChanged | LeaderChanged | ContainersChanged | OwnershipChanged

_NODES: Final = "nodes"
_DRAIN: Final = "drain"
_LEADER: Final = "leader"


class ClusterMember:
    """One node's membership; see the module docstring.

    Args:
        url: ``zk://host:port[,host:port...]/chroot`` or its parsed form.
        node: this node's id and the endpoints of its doors.
        container_count: containers of the cluster if this node creates it
            (default ``DEFAULT_CLUSTER_CONTAINERS``); a cluster that exists
            keeps its own count (``container_count`` tells which).
        hooks: called as containers come and go; default: do nothing.
        segment_mapping: how this node's data dir places segments in
            containers; a new cluster takes it (default ``GROUPED``), and
            ``start`` refuses a cluster that uses another. None: a store
            without one (memory), which takes the cluster's.
        session_timeout_s: asked of ZooKeeper (which clamps it).
        start_timeout_s: bound on ``start``.
    """

    def __init__(
        self,
        url: ClusterUrl | str,
        node: NodeInfo,
        *,
        container_count: int | None = None,
        hooks: ContainerHooks | None = None,
        segment_mapping: SegmentMapping | None = None,
        replication_factor: int = 1,
        min_in_sync: int = 1,
        session_timeout_s: float = SESSION_TIMEOUT_S,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.url = parse_cluster_url(url) if isinstance(url, str) else url
        self.node = node
        self.node_id = check_node_id(node.node_id)
        if container_count is not None and not 1 <= container_count <= MAX_CLUSTER_CONTAINERS:
            raise ConfigError(f"a cluster has 1 to {MAX_CLUSTER_CONTAINERS} containers")
        self._wanted_count = container_count
        self._hooks: ContainerHooks = hooks if hooks is not None else _NoHooks()
        self._mapping = segment_mapping
        self._replication = (replication_factor, min(min_in_sync, replication_factor))
        self._session_timeout_s = session_timeout_s
        self._start_timeout_s = start_timeout_s
        self._zk: ZkSession | None = None
        self._cluster: ClusterRecord | None = None
        self._nodes: dict[str, NodeInfo] = {}
        self._draining: frozenset[str] = frozenset()
        self._leader: str | None = None
        self._leader_session = 0
        self._records: dict[int, tuple[ContainerRecord, int]] = {}
        self._owned: dict[int, int] = {}
        self._owned_session = -1
        """The session the containers in ``_owned`` were claimed or confirmed in."""
        self._releasing: set[int] = set()
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._not_before: dict[int, float] = {}
        self._dirty: set[str] = set()
        self._changed: set[int] = set()
        self._wake = asyncio.Event()
        self._ready = asyncio.Event()
        self._registered_session = 0
        self._blocked_since: float | None = None
        self._listeners: list[Callable[[ClusterEvent], None]] = []
        self._run_task: asyncio.Task[None] | None = None
        self._last_failure: str | None = None
        self._bad_records: dict[str, str] = {}
        self._closing = False

    # ------------------------------------------------------------------ the view

    @property
    def container_count(self) -> int:
        """The cluster's container count (known once ``start`` returned)."""
        assert self._cluster is not None, "start() first"
        return self._cluster.container_count

    @property
    def cluster(self) -> ClusterRecord:
        assert self._cluster is not None, "start() first"
        return self._cluster

    def container_of(self, segment_name: str) -> int:
        """The container of a segment: the disk store's function (``store/disk/layout.py``)
        under the cluster's mapping."""
        cluster = self.cluster
        return container_of(segment_name, cluster.container_count, cluster.mapping)

    def record(self, container: int) -> ContainerRecord:
        """``container``'s record as last read (unowned before the first read)."""
        found = self._records.get(container)
        return UNOWNED if found is None else found[0]

    def records(self) -> dict[int, ContainerRecord]:
        return {c: record for c, (record, _) in self._records.items()}

    def owner(self, container: int) -> NodeInfo | None:
        """The live node serving ``container``; None while it moves or its node is dead."""
        record = self.record(container)
        if record.state is ContainerState.RELEASED or record.owner is None:
            return None
        return self._nodes.get(record.owner)

    def epoch(self, container: int) -> int:
        return self.record(container).epoch

    def owns(self, container: int) -> bool:
        """True while this node serves ``container``: confirmed in the current session.

        Safe to call from any thread; False from the moment the session is
        suspended or lost, and while its proof of life is older than the lease
        (a process resumed after a pause, ``_zk.py``).
        """
        zk = self._zk
        return (
            zk is not None
            and zk.live
            and zk.session_id == self._owned_session
            and container in self._owned
        )

    @property
    def live(self) -> bool:
        """Whether this node's view can be trusted now: its session is connected
        with a fresh proof of life. False while fenced (``owns`` answers False
        for every container then, and what it last read of the others may be stale)."""
        zk = self._zk
        return zk is not None and zk.live

    def owned(self) -> frozenset[int]:
        return frozenset(c for c in self._owned if self.owns(c))

    def nodes(self) -> dict[str, NodeInfo]:
        """Live nodes by id."""
        return dict(self._nodes)

    def draining(self) -> frozenset[str]:
        return self._draining

    def leader(self) -> str | None:
        return self._leader

    @property
    def is_leader(self) -> bool:
        zk = self._zk
        return (
            zk is not None
            and zk.connected
            and self._leader == self.node_id
            and self._leader_session == zk.session_id
        )

    def add_listener(self, listener: Callable[[ClusterEvent], None]) -> None:
        """Call ``listener`` on the loop with every ``ClusterEvent``; it must not block."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[ClusterEvent], None]) -> None:
        self._listeners.remove(listener)

    # ------------------------------------------------------------------ commands

    async def drain(self, node_id: str) -> None:
        """Ask the leader to move every container off ``node_id`` (``/drain/<id>``)."""
        await self._session().create(drain_path(node_id), encode(None))

    async def undrain(self, node_id: str) -> None:
        await self._session().delete(drain_path(node_id))

    async def write_in_sync(self, container: int, epoch: int, members: frozenset[str]) -> bool:
        """Write ``container``'s in-sync set while this node owns it at ``epoch``
        (conditional on the version read); True once written.

        The leader of a replicated container calls it before it acts on a new
        set (``replication.ContainerLeader``); a record that changed since
        (a failover, a new epoch) makes it False.
        """
        found = self._records.get(container)
        if found is None or not self.owns(container):
            return False
        record, version = found
        if record.owner != self.node_id or record.epoch != epoch:
            return False
        in_sync = tuple(n for n in record.replicas if n in members)
        written = dataclasses.replace(record, in_sync=in_sync)
        zk = self._session()
        stat = await zk.set_if(container_path(container), encode(written), version)
        if stat is None:
            self._dirty.add(container_path(container))
            self._wake.set()
            return False
        self._set_record(container, written, stat)
        self._changed.add(container)
        self._flush_changes()
        return True

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        """Connect, create or join the cluster, register, and read the cluster once.

        Raises:
            ZooKeeperUnavailable: no ZooKeeper server answered in time.
            NodeIdInUse: another live session holds this node id.
            ClusterError: the chroot holds something that is not a cluster.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._start_timeout_s
        self._zk = ZkSession(self.url, self._session_timeout_s, self._on_state, self._on_watch)
        try:
            await self._zk.connect(self._start_timeout_s)
            self._cluster = await self._create_or_join(self._zk)
            self._dirty |= self._everything()
            self._run_task = asyncio.create_task(self._run(), name=f"cluster {self.node_id}")
            self._wake.set()
            try:
                async with asyncio.timeout(max(0.0, deadline - loop.time())):
                    await self._ready.wait()
            except TimeoutError:
                if self._blocked_since is not None:
                    raise NodeIdInUse(self.node_id, loop.time() - self._blocked_since) from None
                raise ClusterError(
                    f"could not join the cluster at {self.url} within {self._start_timeout_s:g} s"
                ) from None
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Leave: end the session (registration and leadership go at once).

        The containers this node owns stay with it (``docs/cluster.md#killed-node``);
        drain it first to move them.
        """
        if self._closing:
            return
        self._closing = True
        tasks = [*self._tasks.values(), *([self._run_task] if self._run_task else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        had = bool(self._owned)
        self._owned.clear()
        if self._zk is not None:
            await self._zk.close()
        if had:
            self._emit(OwnershipChanged(frozenset(), fenced=True))

    def _session(self) -> ZkSession:
        if self._zk is None:
            raise ClusterError("the member is not started")
        return self._zk

    def _everything(self) -> set[str]:
        return {_NODES, _DRAIN, _LEADER, *(container_path(c) for c in range(self.container_count))}

    async def _create_or_join(self, zk: ZkSession) -> ClusterRecord:
        found = await zk.get(CLUSTER_PATH, watch=False)
        if found is None:
            count = self._wanted_count or DEFAULT_CLUSTER_CONTAINERS
            mapping = SegmentMapping.GROUPED if self._mapping is None else self._mapping
            factor, min_in_sync = self._replication
            record = ClusterRecord(count, factor, min_in_sync, mapping)
            nodes = [
                (CLUSTER_PATH, encode(record)),
                (NODES_PATH, b""),
                (DRAIN_PATH, b""),
                (CONTAINERS_PATH, b""),
                *((container_path(c), encode(UNOWNED)) for c in range(count)),
            ]
            try:
                created = await zk.create_all(nodes)
            except CONNECTION_ERRORS as exc:
                raise ClusterError(
                    f"cannot create a cluster under {self.url}: {type(exc).__name__} "
                    "(does the chroot hold something else?)"
                ) from None
            if created:
                log.info("created the cluster at %s with %d containers", self.url, count)
                return record
            found = await zk.get(CLUSTER_PATH, watch=False)
            if found is None:
                raise ClusterError(f"the cluster at {self.url} vanished while being joined")
        cluster = decode_cluster(found[0])
        if self._mapping is not None and self._mapping is not cluster.mapping:
            raise ClusterError(
                f"the cluster at {self.url} places segments by the "
                f"{MAPPING_NAMES[cluster.mapping]!r} mapping and this node's data dir by "
                f"{MAPPING_NAMES[self._mapping]!r}: a node joins only a cluster of its "
                "data dir's mapping (docs/cluster.md#containers)"
            )
        if self._wanted_count not in (None, cluster.container_count):
            log.warning(
                "the cluster at %s has %d containers (fixed when it was created), not %d",
                self.url,
                cluster.container_count,
                self._wanted_count,
            )
        return cluster

    # ------------------------------------------------------------------ from kazoo's thread

    def _on_state(self, state: str) -> None:
        if self._closing:
            return
        if state == "CONNECTED":
            self._dirty |= self._everything() if self._cluster else set()
            self._wake.set()
        elif state == "SUSPENDED" and self._zk is not None and self._zk.live:
            # The session outlives the connection for its timeout at ZooKeeper:
            # keep serving what is owned while the lease lasts, then fence.
            left = self._zk.lease_left_s()
            log.warning(
                "node %s: ZooKeeper connection lost; serving its containers for %.1f s more "
                "unless it is back",
                self.node_id,
                left,
            )
            asyncio.get_running_loop().call_later(max(left, 0.0), self._lease_check)
        else:
            self._fence(state)

    def _lease_check(self) -> None:
        """The lease of a suspended session ran out: fence, unless it was renewed."""
        zk = self._zk
        if self._closing or zk is None or zk.live or not self._owned:
            return
        self._fence("suspended past its lease")

    def _on_watch(self, path: str) -> None:
        if path == NODES_PATH or path.startswith(NODES_PATH + "/"):
            self._dirty.add(_NODES)
        elif path == DRAIN_PATH or path.startswith(DRAIN_PATH + "/"):
            self._dirty.add(_DRAIN)
        elif path == LEADER_PATH:
            self._dirty.add(_LEADER)
        elif path.startswith(CONTAINERS_PATH + "/"):
            self._dirty.add(path)
        self._wake.set()

    def _fence(self, state: str) -> None:
        """The session is suspended or lost: serve nothing until it is confirmed again."""
        for task in self._tasks.values():
            task.cancel()
        self._owned.clear()
        self._releasing.clear()
        log.warning(
            "node %s: ZooKeeper session %s; serving no container until it is back",
            self.node_id,
            state.lower(),
        )
        self._emit(OwnershipChanged(frozenset(), fenced=True))

    # ------------------------------------------------------------------ the loop's work

    async def _run(self) -> None:
        zk = self._session()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not zk.connected:
                continue  # the next CONNECTED wakes us
            generation = zk.generation
            try:
                await self._reconcile(zk, generation)
                self._last_failure = None
            except CONNECTION_ERRORS as exc:
                if zk.connected and zk.generation == generation:
                    self._failed(logging.WARNING, f"ZooKeeper call failed: {exc!r}")
            except BadRecord as exc:
                self._failed(logging.ERROR, str(exc))
            self._flush_changes()

    def _failed(self, level: int, reason: str) -> None:
        """Log ``reason`` once (not at every retry), and look again after ``RETRY_DELAY_S``."""
        if reason != self._last_failure:
            self._last_failure = reason
            log.log(level, "node %s: %s; retrying every %g s", self.node_id, reason, RETRY_DELAY_S)
        self._wake_later(RETRY_DELAY_S)

    def _wake_later(self, delay_s: float) -> None:
        asyncio.get_running_loop().call_later(delay_s, self._wake.set)

    async def _reconcile(self, zk: ZkSession, generation: int) -> None:
        if self._owned_session != zk.session_id:
            # a new session: what was owned is confirmed again from scratch
            self._owned_session = zk.session_id
            self._owned.clear()
            self._releasing.clear()
            self._dirty |= self._everything()
        session = zk.session_id
        if self._registered_session != session:
            if not await self._register(zk, session):
                return
            self._registered_session = session
            self._blocked_since = None
            log.info("node %s: registered in session %#x", self.node_id, session)
            self._emit(OwnershipChanged(frozenset()))
        dirty, self._dirty = self._dirty, set()
        try:
            await self._read(zk, dirty)
        except BaseException:
            self._dirty |= dirty
            raise
        if zk.generation != generation:
            return
        self._ready.set()
        self._act(zk, generation)
        if self._leader is None:
            if await zk.create(LEADER_PATH, encode(LeaderRecord(self.node_id)), ephemeral=True):
                log.info("node %s: leads the cluster", self.node_id)
            self._dirty.add(_LEADER)
            self._wake.set()
        elif self.is_leader:
            await self._place(zk, generation)

    async def _register(self, zk: ZkSession, session: int) -> bool:
        """Create ``/nodes/<id>``; False while another session still holds it."""
        path = node_path(self.node_id)
        if await zk.create(path, encode(self.node), ephemeral=True):
            return True
        found = await zk.get(path, watch=True)
        if found is None:
            self._wake.set()  # it just went: try again
            return False
        if found[1].ephemeral_owner == session:
            return True  # ours, from before a reconnection of this same session
        if self._blocked_since is None:
            self._blocked_since = asyncio.get_running_loop().time()
            log.warning(
                "node %s: the id is registered by another session (a previous run not "
                "expired yet, or another node with this id); waiting for it to go",
                self.node_id,
            )
        return False  # the watch wakes us when it goes

    async def _read(self, zk: ZkSession, dirty: set[str]) -> None:
        if _NODES in dirty:
            names = await zk.children(NODES_PATH, watch=True)
            found = await asyncio.gather(*(zk.get(node_path(n), watch=False) for n in names))
            nodes: dict[str, NodeInfo] = {}
            for name, item in zip(names, found, strict=True):
                if item is None:
                    continue  # gone between the listing and the read
                try:
                    nodes[name] = decode_node(item[0], node_path(name))
                except BadRecord as exc:
                    log.error("node %s: ignoring a node: %s", self.node_id, exc)
            if nodes != self._nodes:
                self._nodes = nodes
                self._emit(NodesChanged(frozenset(nodes), self._draining))
        if _DRAIN in dirty:
            draining = frozenset(await zk.children(DRAIN_PATH, watch=True))
            if draining != self._draining:
                self._draining = draining
                self._emit(NodesChanged(frozenset(self._nodes), draining))
        if _LEADER in dirty:
            item = await zk.get(LEADER_PATH, watch=True)
            leader = None if item is None else decode_leader(item[0]).node_id
            self._leader_session = 0 if item is None else item[1].ephemeral_owner
            if leader != self._leader:
                self._leader = leader
                self._emit(LeaderChanged(leader))
        paths = sorted(p for p in dirty if p.startswith(CONTAINERS_PATH + "/"))
        found_records = await asyncio.gather(*(zk.get(p, watch=True) for p in paths))
        for path, item in zip(paths, found_records, strict=True):
            try:
                if item is None:
                    raise BadRecord(path, "missing")
                record = decode_container(item[0], path)
            except BadRecord as exc:
                self._unreadable(int(path.rsplit("/", 1)[1]), exc)
                continue
            self._bad_records.pop(path, None)
            self._set_record(int(path.rsplit("/", 1)[1]), record, item[1])

    def _unreadable(self, container: int, exc: BadRecord) -> None:
        """A record this node cannot read: it stops serving the container and plans
        nothing for it until the record is fixed (its watch brings the fix)."""
        if self._bad_records.get(exc.path) != exc.reason:
            self._bad_records[exc.path] = exc.reason
            log.error("node %s: %s; leaving container %d alone", self.node_id, exc, container)
        if self._records.pop(container, None) is not None:
            self._changed.add(container)
        self._releasing.discard(container)
        if self._owned.pop(container, None) is not None:
            self._emit(OwnershipChanged(frozenset(self._owned)))

    def _set_record(self, container: int, record: ContainerRecord, stat: Stat) -> None:
        old = self._records.get(container)
        if old is not None and old[1] > stat.version:
            return  # an older read than what a write of ours already showed
        self._records[container] = (record, stat.version)
        if old is None or old[0] != record:
            self._changed.add(container)

    def _flush_changes(self) -> None:
        if self._changed:
            changed, self._changed = frozenset(self._changed), set()
            self._emit(ContainersChanged(changed))

    def _emit(self, event: ClusterEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("node %s: cluster listener failed on %r", self.node_id, event)

    # ------------------------------------------------------------------ claims and releases

    def _act(self, zk: ZkSession, generation: int) -> None:
        """Start the claim or release each container's record asks of this node."""
        now = asyncio.get_running_loop().time()
        me = self.node_id
        before = frozenset(self._owned)
        for container, (record, version) in sorted(self._records.items()):
            mine = record.owner == me and record.state is not ContainerState.RELEASED
            if container in self._owned and not (mine and self._owned[container] == record.epoch):
                del self._owned[container]  # the record no longer says so: stop at once
            if container in self._tasks or self._not_before.get(container, 0.0) > now:
                continue
            serving = container in self._owned or container in self._releasing
            if mine and record.state is ContainerState.MOVING and serving:
                if record.target not in self._nodes:
                    continue  # its target is gone: the leader calls the move off
                self._owned.pop(container, None)
                self._releasing.add(container)
                self._spawn(container, self._release(zk, generation, container, record, version))
            elif mine and container not in self._owned:
                self._releasing.discard(container)
                self._spawn(container, self._claim(zk, generation, container, record, version))
            elif record.state is ContainerState.RELEASED:
                self._releasing.discard(container)
                if record.target == me:
                    self._spawn(container, self._claim(zk, generation, container, record, version))
        if frozenset(self._owned) != before:
            self._emit(OwnershipChanged(frozenset(self._owned)))

    def _spawn(self, container: int, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name=f"cluster {self.node_id} container {container}")
        self._tasks[container] = task

        def done(finished: asyncio.Task[None]) -> None:
            if self._tasks.get(container) is finished:
                del self._tasks[container]
            if not finished.cancelled() and finished.exception() is not None:
                log.error(
                    "node %s: container %d: %r", self.node_id, container, finished.exception()
                )
                self._retry_later(container)
            self._dirty.add(container_path(container))
            self._wake.set()

        task.add_done_callback(done)

    def _retry_later(self, container: int) -> None:
        self._not_before[container] = asyncio.get_running_loop().time() + RETRY_DELAY_S
        self._wake_later(RETRY_DELAY_S)

    async def _claim(
        self,
        zk: ZkSession,
        generation: int,
        container: int,
        record: ContainerRecord,
        version: int,
    ) -> None:
        """Take ``container`` at ``epoch + 1``: acquire hook, then the conditional write."""
        epoch = record.epoch + 1
        try:
            await self._hooks.acquire(container, epoch)
        except Exception:
            log.exception("node %s: container %d: acquire failed", self.node_id, container)
            self._retry_later(container)
            return
        claimed = ContainerRecord(
            self.node_id, epoch, ContainerState.OWNED, None, record.replicas, record.in_sync
        )
        stat = None
        try:
            stat = await zk.set_if(container_path(container), encode(claimed), version)
        finally:
            if stat is None or zk.generation != generation:
                await self._undo(container)
        if stat is None or zk.generation != generation:
            return
        self._set_record(container, claimed, stat)
        self._owned[container] = epoch
        self._not_before.pop(container, None)
        log.info("node %s: owns container %d at epoch %d", self.node_id, container, epoch)
        self._emit(OwnershipChanged(frozenset(self._owned)))

    async def _undo(self, container: int) -> None:
        try:
            await self._hooks.release(container, None)
        except Exception:
            log.exception(
                "node %s: container %d: release after a lost claim failed", self.node_id, container
            )

    async def _release(
        self,
        zk: ZkSession,
        generation: int,
        container: int,
        record: ContainerRecord,
        version: int,
    ) -> None:
        """Hand ``container`` to the move's target: release hook, then ``RELEASED``."""
        assert record.target is not None
        try:
            await self._hooks.release(container, self._nodes.get(record.target))
        except Exception:
            log.exception("node %s: container %d: release failed", self.node_id, container)
            self._retry_later(container)
            return
        released = dataclasses.replace(record, state=ContainerState.RELEASED)
        stat = await zk.set_if(container_path(container), encode(released), version)
        if stat is None or zk.generation != generation:
            return  # the move was called off (or the session changed): look again
        self._set_record(container, released, stat)
        self._releasing.discard(container)
        self._not_before.pop(container, None)
        log.info("node %s: released container %d to %s", self.node_id, container, record.target)

    # ------------------------------------------------------------------ the leader

    async def _place(self, zk: ZkSession, generation: int) -> None:
        """Write the next steps of the placement plan, each conditional on the version read."""
        records = {c: record for c, (record, _) in self._records.items()}
        factor = self.cluster.replication_factor
        for action in plan(records, self._nodes.keys(), self._draining, factor):
            record, version = self._records[action.container]
            written = apply(record, action)
            path = container_path(action.container)
            stat = await zk.set_if(path, encode(written), version)
            if zk.generation != generation:
                return
            if stat is None:
                self._dirty.add(path)  # changed since read: plan again from what is there
                self._wake.set()
                continue
            self._set_record(action.container, written, stat)
            log.info("leader %s: %s", self.node_id, action)
