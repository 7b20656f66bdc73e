"""``RemoteStore`` and ``RoutedStore`` against real ``headrace serve`` processes.

The store conformance suite runs against a ``RemoteStore`` pointed at one of
two servers (every test gets a fresh one, each test's segments are deleted
after it); what the wire cannot carry is excluded by name in
``EXCLUDED_FROM_SUITE``, each with its reason. Then what only forwarding
can get wrong: writer dedup across the hop, pipelining and its order, tail
waits woken by another client's append, a connection to the owner that dies
mid-append (a retriable error, never a false acknowledgement), auth, and
``RoutedStore`` sending each segment to its owner (checked on the servers
with a direct client).

Waits are bounded; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Final

import pytest

from headrace.client._conn import SegmentStoreConnection, next_request_id
from headrace.cluster import remote as remote_module
from headrace.cluster.remote import Endpoint, RemoteStore
from headrace.cluster.routing import RoutedStore
from headrace.controller.auth import TOKEN_KEY_FILE
from headrace.errors import (
    OwnerUnavailable,
    SegmentNotFound,
    SegmentTypeMismatch,
    StoreClosed,
    StoreError,
)
from headrace.protocols import pravega as p
from headrace.store import MemoryStore
from headrace.store.api import MAX_NAME_BYTES
from headrace.types import (
    AppendResult,
    ReadResult,
    SegmentKind,
    TableKey,
    TableUpdate,
    WriterAppend,
)
from tests._server import FREE, ServerProcess, add_user
from tests.store.contract import ODD_NAMES, StoreContract

WAIT_S: Final = 20.0
"""Bound on every wait a test expects to end."""

W1 = uuid.UUID(int=1)


def _endpoint(server: ServerProcess) -> Endpoint:
    return ("127.0.0.1", server.port_of("segment_store"))


def _serve(tmp: Path, *args: str) -> ServerProcess:
    return ServerProcess(tmp / "data", ports={"segment_store": FREE}, args=args)


@pytest.fixture(scope="module")
def owners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ...]]:
    """Two nodes: the owners every test here forwards to."""
    servers = [_serve(tmp_path_factory.mktemp(f"owner{i}"), "--fsync", "never") for i in range(2)]
    with contextlib.ExitStack() as stack:
        for server in servers:
            stack.enter_context(server)
        yield tuple(servers)
    for server in servers:
        assert "Traceback" not in server.log_text(), server.log_text()


# --------------------------------------------------------------------------- the suite


class _SuiteStore(RemoteStore):
    """A ``RemoteStore`` that remembers what the test created, to delete it after.

    The suite checks its segment list in many tests; the wire cannot list
    segments (``RemoteStore.list_segments`` refuses), so here the list is
    asked of the owner segment by segment: those this test created that the
    owner still has. ``test_list_segments_is_refused`` checks the real one.
    """

    def __init__(self, endpoint: Endpoint) -> None:
        super().__init__(endpoint)
        self.created: list[str] = []

    async def create_segment(self, name: str, **kwargs: object) -> None:
        self.created.append(name)
        await super().create_segment(name, **kwargs)  # type: ignore[arg-type]

    async def list_segments(self) -> list[str]:
        self._check_open()
        present = []
        for name in dict.fromkeys(self.created):
            with contextlib.suppress(SegmentNotFound):
                await self.get_attribute(name, W1)  # any kind; SegmentNotFound if absent
                present.append(name)
        return sorted(present)


EXCLUDED_FROM_SUITE: Final = {
    "test_list_segments_sorted_both_kinds": "the wire has no request listing segments: "
    "RemoteStore.list_segments refuses (test_list_segments_is_refused)",
    "test_odd_names_are_distinct_segments": "a name with a lone surrogate cannot be encoded on "
    "the wire (test_odd_names_reach_the_owner, test_lone_surrogate_names_are_refused)",
    "test_append_writer_records_event_number": "info().attributes is empty: the wire cannot "
    "list a segment's attributes (get_attribute reads them, checked by the other tests)",
    "test_append_writers_are_independent": "info().attributes is empty (as above)",
    "test_attributes_past_the_bound_drop_the_least_recently_set": "info().attributes is empty",
    "test_info_reports_every_field": "info().attributes is empty "
    "(test_info_reports_every_field_but_attributes)",
    "test_info_attributes_are_a_snapshot": "info().attributes is empty",
    "test_empty_key_and_value": "the wire writes the empty table key without its version "
    "(Java's layout): RemoteStore refuses it (test_the_empty_table_key_is_refused)",
    "test_iterate_with_empty_key_ends": "the empty table key cannot travel (as above)",
}
"""Suite tests that cannot apply to a remote store, and why."""


class TestRemoteStore(StoreContract):
    @pytest.fixture
    async def store(self, owners: tuple[ServerProcess, ...]) -> AsyncIterator[RemoteStore]:
        endpoint = _endpoint(owners[0])
        store = _SuiteStore(endpoint)
        try:
            yield store
        finally:
            await store.close()
            cleaner = RemoteStore(endpoint)
            for name in dict.fromkeys(store.created):
                with contextlib.suppress(SegmentNotFound):
                    await cleaner.delete(name)
            await cleaner.close()


for _name in EXCLUDED_FROM_SUITE:
    assert callable(getattr(StoreContract, _name, None)), f"{_name} is not in the suite"
    setattr(TestRemoteStore, _name, None)  # not collected: see EXCLUDED_FROM_SUITE


# --------------------------------------------------------------------------- a direct client


class _Replies:
    """A writer listener that queues what the owner answers."""

    def __init__(self) -> None:
        self.got: asyncio.Queue[p.Command] = asyncio.Queue()

    def reply(self, cmd: p.Command) -> None:
        self.got.put_nowait(cmd)

    def connection_lost(self, exc: BaseException) -> None:
        pass

    async def next(self) -> p.Command:
        return await asyncio.wait_for(self.got.get(), WAIT_S)


async def _exists(endpoint: Endpoint, name: str) -> bool:
    """Whether the node at ``endpoint`` holds segment ``name``, asked directly."""
    conn = await SegmentStoreConnection.connect(*endpoint)
    try:
        reply = await conn.request(p.GetStreamSegmentInfo(next_request_id(), name))
    finally:
        await conn.aclose()
    assert isinstance(reply, p.StreamSegmentInfo)
    return reply.exists


async def _append_directly(endpoint: Endpoint, name: str, data: bytes) -> None:
    """Append ``data`` to ``name`` as a client of the owner itself (not forwarded)."""
    conn = await SegmentStoreConnection.connect(*endpoint)
    writer_id, replies = uuid.uuid4(), _Replies()
    try:
        conn.attach_writer(writer_id, replies)
        rid = next_request_id()
        conn.send_append(writer_id, rid, p.SetupAppend(rid, writer_id, name))
        assert isinstance(await replies.next(), p.AppendSetup)
        rid = next_request_id()
        conn.send_append(writer_id, rid, p.AppendBlockEnd(writer_id, len(data), data, 1, 1, rid))
        assert isinstance(await replies.next(), p.DataAppended)
    finally:
        await conn.aclose()


async def _writer_number(endpoint: Endpoint, name: str, writer_id: uuid.UUID) -> int:
    """The owner's last event number of ``writer_id`` on ``name`` (its SetupAppend answer)."""
    conn = await SegmentStoreConnection.connect(*endpoint)
    replies = _Replies()
    try:
        conn.attach_writer(writer_id, replies)
        rid = next_request_id()
        conn.send_append(writer_id, rid, p.SetupAppend(rid, writer_id, name))
        setup = await replies.next()
    finally:
        await conn.aclose()
    assert isinstance(setup, p.AppendSetup)
    return setup.last_event_number


@pytest.fixture
async def remote(owners: tuple[ServerProcess, ...]) -> AsyncIterator[RemoteStore]:
    store = RemoteStore(_endpoint(owners[1]))
    yield store
    await store.close()


def _name(tag: str) -> str:
    """A fresh segment name: tests on the shared owners never meet each other's segments."""
    return f"sc/{tag}/{uuid.uuid4().hex}.#epoch.0"


# --------------------------------------------------------------------------- what cannot travel


async def test_list_segments_is_refused(remote: RemoteStore) -> None:
    with pytest.raises(StoreError, match="cannot list") as caught:
        await remote.list_segments()
    assert type(caught.value) is StoreError


async def test_odd_names_reach_the_owner(
    remote: RemoteStore, owners: tuple[ServerProcess, ...]
) -> None:
    """Every valid name the wire can carry is the same segment on the owner."""
    names = [n for n in ODD_NAMES if n != "lone\ud800surrogate"]
    suffix = uuid.uuid4().hex[:8]
    names = [n if len(n.encode()) > 60000 else n + suffix for n in names]
    for name in names:
        with contextlib.suppress(SegmentNotFound):
            await remote.delete(name)  # the two at the length limit carry no suffix
    for i, name in enumerate(names):
        await remote.create_segment(name)
        await remote.append(name, b"data-%d" % i)
    for i, name in enumerate(names):
        assert await remote.read(name, 0, 100) == ReadResult(0, b"data-%d" % i, True, False)
        assert await _exists(_endpoint(owners[1]), name)
    for name in names:
        await remote.delete(name)


async def test_lone_surrogate_names_are_refused(remote: RemoteStore) -> None:
    name = "lone\ud800surrogate"
    for call in (
        remote.create_segment(name),
        remote.append(name, b"x"),
        remote.read(name, 0, 1),
        remote.info(name),
    ):
        with pytest.raises(StoreError, match="lone surrogate") as caught:
            await call
        assert type(caught.value) is StoreError
    await remote.create_segment(ok := _name("surrogate"))  # the link is unharmed
    assert (await remote.append(ok, b"x")).length == 1


async def test_the_empty_table_key_is_refused(remote: RemoteStore) -> None:
    await remote.create_table(table := _name("t_kvtable"))
    for call in (
        remote.update_table(table, [TableUpdate(b"", b"v")]),
        remote.get_table_entries(table, [b"k", b""]),
    ):
        with pytest.raises(StoreError, match="empty key"):
            await call
    assert await remote.update_table(table, [TableUpdate(b"k", b"v")]) == [0]


async def test_info_of_the_longest_names(remote: RemoteStore) -> None:
    """The kind of a segment whose name is as long as names go is asked like any
    other: the owner's answer to the table probe of a stream segment quotes
    the name cut, so it can be encoded."""
    suffix = uuid.uuid4().hex
    stream = "sc/long/" + "s" * (MAX_NAME_BYTES - len("sc/long/") - len(suffix)) + suffix
    table = "sc/long_kvtable/" + "t" * (MAX_NAME_BYTES - len("sc/long_kvtable/") - 32) + suffix
    await remote.create_segment(stream)
    await remote.create_table(table)
    try:
        assert (await remote.info(stream)).kind is SegmentKind.STREAM
        assert (await remote.info(table)).kind is SegmentKind.TABLE
        with pytest.raises(SegmentTypeMismatch):
            await remote.update_table(stream, [TableUpdate(b"k", b"v")])
    finally:
        await remote.delete(stream)
        await remote.delete_table(table)


async def test_info_reports_every_field_but_attributes(remote: RemoteStore) -> None:
    await remote.create_segment(name := _name("info"))
    await remote.append(name, b"0123456789", writer=WriterAppend(W1, 4))
    await remote.truncate(name, 2)
    assert await remote.seal(name) == 10
    info = await remote.info(name)
    assert (info.name, info.kind, info.start_offset, info.length, info.sealed) == (
        name,
        SegmentKind.STREAM,
        2,
        10,
        True,
    )
    assert dict(info.attributes) == {}  # the wire cannot list them...
    assert await remote.get_attribute(name, W1) == 4  # ...but reads each one
    await remote.create_table(table := _name("info_kvtable"))
    assert (await remote.info(table)).kind is SegmentKind.TABLE


# --------------------------------------------------------------------------- appends


async def test_writer_dedup_survives_the_hop(
    remote: RemoteStore, owners: tuple[ServerProcess, ...]
) -> None:
    """A forwarded append keeps its writer's id and event number: the owner's
    dedup sees a retry, whichever node forwards it, and keeps the number."""
    endpoint = _endpoint(owners[1])
    await remote.create_segment(name := _name("dedup"))
    writer = uuid.uuid4()
    first = await remote.append(name, b"event-5", writer=WriterAppend(writer, 5))
    assert first == AppendResult(0, 7)
    retry = await remote.append(name, b"event-5", writer=WriterAppend(writer, 5))
    assert retry == AppendResult(7, 7, 5, duplicate=True)
    older = await remote.append(name, b"event-3", writer=WriterAppend(writer, 3))
    assert older == AppendResult(7, 7, 5, duplicate=True)
    other_node = RemoteStore(endpoint)  # another connection, another forwarder
    try:
        again = await other_node.append(name, b"event-5", writer=WriterAppend(writer, 5))
        assert again == AppendResult(7, 7, 5, duplicate=True)
        fresh = await other_node.append(name, b"event-6", writer=WriterAppend(writer, 6))
        assert fresh == AppendResult(7, 14, 5)
    finally:
        await other_node.close()
    assert await _writer_number(endpoint, name, writer) == 6  # the owner's own record
    assert await remote.read(name, 0, 100) == ReadResult(0, b"event-5event-6", True, False)


async def test_a_writer_moving_between_segments_keeps_its_order_and_dedup(
    remote: RemoteStore,
) -> None:
    """The wire gives a writer one segment per connection at a time: a forwarded
    writer that alternates between segments is set up again for each, in order."""
    one, two = _name("one"), _name("two")
    for name in (one, two):
        await remote.create_segment(name)
    writer = uuid.uuid4()
    steps = [(one, 1), (two, 1), (one, 2), (two, 2), (one, 1), (two, 3), (one, 3)]
    results = await asyncio.wait_for(
        asyncio.gather(
            *(remote.append(n, b"%d" % k, writer=WriterAppend(writer, k)) for n, k in steps)
        ),
        WAIT_S,
    )
    assert [r.duplicate for r in results] == [False, False, False, False, True, False, False]
    assert (await remote.read(one, 0, 10)).data == b"123"
    assert (await remote.read(two, 0, 10)).data == b"123"
    assert await remote.get_attribute(one, writer) == 3


async def test_sessions_past_the_bounds_move_to_fresh_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``MAX_WRITERS_PER_LINK`` writers on one connection new sessions go to a
    fresh one (and the old one closes once idle); past ``MAX_SESSIONS`` idle
    sessions are forgotten and set up again. Nothing is lost or reordered."""
    monkeypatch.setattr(remote_module, "MAX_WRITERS_PER_LINK", 3)
    monkeypatch.setattr(remote_module, "MAX_SESSIONS", 2)
    writers = [uuid.uuid4() for _ in range(10)]
    with _serve(tmp_path) as owner:
        store = RemoteStore(_endpoint(owner))
        try:
            await store.create_segment(name := _name("bounds"))
            for number in (1, 2):
                results = await asyncio.wait_for(
                    asyncio.gather(
                        *(
                            store.append(name, b"%d" % i, writer=WriterAppend(w, number))
                            for i, w in enumerate(writers)
                        ),
                        store.append(name, b"|"),
                    ),
                    WAIT_S,
                )
                assert not any(r.duplicate for r in results)
            stored = (await store.read(name, 0, 100)).data
            # Order holds per writer; a writer set up again may come after a later call.
            assert sorted(stored) == sorted(b"0123456789|" * 2)
            assert [await store.get_attribute(name, w) for w in writers] == [2] * 10
        finally:
            await store.close()
    accesses = [line for line in owner.log_text().splitlines() if "access: segment_store" in line]
    assert len(accesses) >= 4, accesses  # a connection per three writers


async def test_appends_are_pipelined_in_call_order(tmp_path: Path) -> None:
    """Many concurrent appends to one segment all go out before the owner answers
    any (it is stopped meanwhile), on one connection, and are stored in call order."""
    count = 100
    with _serve(tmp_path) as owner:
        store = RemoteStore(_endpoint(owner))
        try:
            await store.create_segment(name := _name("pipelined"))
            await store.append(name, b"first")  # the writer session is set up
            assert owner.process is not None
            owner.process.send_signal(signal.SIGSTOP)
            try:
                chunks = [b"%03d" % i * (i + 1) for i in range(count)]
                appends = [asyncio.create_task(store.append(name, c)) for c in chunks]
                for _ in range(5):
                    await asyncio.sleep(0)  # each task runs its first step: the send
                assert store.appends_in_flight == count
                assert not any(a.done() for a in appends)
            finally:
                owner.process.send_signal(signal.SIGCONT)
            results = await asyncio.wait_for(asyncio.gather(*appends), WAIT_S)
            offset = len(b"first")
            for result, chunk in zip(results, chunks, strict=True):
                assert result == AppendResult(offset, offset + len(chunk))
                offset += len(chunk)
            stored = await store.read(name, 0, 1 << 20)
            assert stored == ReadResult(0, b"first" + b"".join(chunks), True, False)
        finally:
            await store.close()
    log = owner.log_text().splitlines()
    accesses = [line for line in log if "access: segment_store" in line]
    assert len(accesses) == 1, accesses  # one connection carried everything


async def test_a_tail_read_waits_and_wakes_on_another_clients_append(
    remote: RemoteStore, owners: tuple[ServerProcess, ...]
) -> None:
    endpoint = _endpoint(owners[1])
    await remote.create_segment(name := _name("tail"))
    await remote.append(name, b"abc")
    assert await remote.read(name, 3, 10) == ReadResult(3, b"", True, False)  # at once
    waiter = asyncio.create_task(remote.wait_for_data(name, 3, WAIT_S))
    wake = asyncio.get_running_loop().create_future()
    assert remote.watch(name, 3, wake) is True
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiter.done() and not wake.done()  # parked at the owner
    await _append_directly(endpoint, name, b"def")  # another client, straight to the owner
    assert await asyncio.wait_for(waiter, WAIT_S) is True
    await asyncio.wait_for(wake, WAIT_S)
    assert await remote.read(name, 3, 10) == ReadResult(3, b"def", True, False)
    assert remote.watch(name, 3, asyncio.get_running_loop().create_future()) is False


async def test_owner_killed_mid_append_is_retriable_never_a_false_ack(tmp_path: Path) -> None:
    """Kill -9 the owner with appends in flight: each append ends acknowledged or
    with OwnerUnavailable; every acknowledged one is on the owner after its restart.

    The owner is stopped before the last appends go out and killed once they are
    all on their way, so some are surely in flight when it dies."""
    in_flight, stop_after = 32, 50
    with _serve(tmp_path) as owner:  # the default fsync: acknowledged means synced
        assert owner.process is not None
        store = RemoteStore(_endpoint(owner))
        try:
            await store.create_segment(name := _name("killed"))
            payloads: dict[asyncio.Task[AppendResult], bytes] = {}
            pending: set[asyncio.Task[AppendResult]] = set()

            def append(number: int) -> None:
                data = b"append-%06d|" % number * 500
                task = asyncio.create_task(store.append(name, data))
                payloads[task] = data
                pending.add(task)

            acked = 0
            while acked < stop_after:  # appends flowing, acknowledged as they go
                while len(pending) < in_flight:
                    append(len(payloads))
                done, pending = await asyncio.wait(
                    pending, timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED
                )
                assert done, "no append was answered"
                acked += sum(1 for t in done if t.exception() is None)
            owner.process.send_signal(signal.SIGSTOP)
            last = len(payloads)
            for number in range(last, last + in_flight):
                append(number)
            for _ in range(5):
                await asyncio.sleep(0)  # each new task sends its append
            assert store.appends_in_flight >= in_flight
            owner.kill()
            await asyncio.wait(payloads, timeout=WAIT_S)
            assert all(task.done() for task in payloads), "an append neither ended nor failed"
            outcomes = {task: task.exception() or task.result() for task in payloads}
            failed = [o for o in outcomes.values() if isinstance(o, BaseException)]
            assert all(isinstance(o, OwnerUnavailable) for o in failed), failed
            assert len(failed) >= in_flight  # those sent to the stopped owner, at least
            await asyncio.to_thread(owner.start)
            # The same store reaches the owner again: the error was retriable.
            again = await store.append(name, b"after the restart")
            data = b""
            while len(data) < again.length:
                data += (await store.read(name, len(data), 1 << 20)).data
            for task, outcome in outcomes.items():
                if isinstance(outcome, AppendResult):  # acknowledged: stored, where it said
                    assert data[outcome.offset : outcome.length] == payloads[task]
            assert data.endswith(b"after the restart")
        finally:
            await store.close()


async def test_a_silent_owner_is_unavailable_not_an_endless_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner that stops answering (SIGSTOP) fails the appends waiting on it with
    OwnerUnavailable after ``APPEND_REPLY_TIMEOUT_S``; the connection is dropped,
    and the next call, once the owner answers again, goes on a new one."""
    monkeypatch.setattr(remote_module, "APPEND_REPLY_TIMEOUT_S", 0.5)
    with _serve(tmp_path) as owner:
        assert owner.process is not None
        store = RemoteStore(_endpoint(owner))
        try:
            await store.create_segment(name := _name("silent"))
            await store.append(name, b"before")
            owner.process.send_signal(signal.SIGSTOP)
            try:
                appends = [asyncio.create_task(store.append(name, b"x")) for _ in range(3)]
                done, _ = await asyncio.wait(appends, timeout=WAIT_S)
                assert len(done) == 3
                assert all(isinstance(a.exception(), OwnerUnavailable) for a in appends)
            finally:
                owner.process.send_signal(signal.SIGCONT)
            after = await asyncio.wait_for(store.append(name, b"after"), WAIT_S)
            stored = (await store.read(name, 0, 100)).data
            assert stored.startswith(b"before") and stored.endswith(b"after")
            assert after.length == len(stored)
        finally:
            await store.close()


# --------------------------------------------------------------------------- auth


async def test_forwarding_with_auth_on_uses_a_node_token(tmp_path: Path) -> None:
    """With auth on, a node signs its own node token with the shared key, which
    reaches internal segments and FlushToStorage too; without the key (or with
    another) the owner refuses, clearly and not as retriable."""
    users = tmp_path / "users"
    add_user(users, "admin", "a long secret", "prn::/*,READ_UPDATE")
    with _serve(tmp_path, "--auth-password-file", str(users)) as owner:
        endpoint = _endpoint(owner)
        key = (owner.data_dir / TOKEN_KEY_FILE).read_bytes()  # the shared key, as configured
        store = RemoteStore(endpoint, token_key=key)
        outsiders = [RemoteStore(endpoint), RemoteStore(endpoint, token_key=b"k" * len(key))]
        try:
            await store.create_segment(name := _name("auth"))
            assert await store.append(name, b"abc") == AppendResult(0, 3)
            dup = await store.append(name, b"abc", writer=WriterAppend(W1, 1))
            assert dup == AppendResult(3, 6)
            waiter = asyncio.create_task(store.wait_for_data(name, 6, WAIT_S))
            await _appended_by(store, name, b"def")
            assert await asyncio.wait_for(waiter, WAIT_S) is True
            assert await store.read(name, 0, 100) == ReadResult(0, b"abcabcdef", True, False)
            await store.create_table(table := _name("g_kvtable"))
            assert await store.update_table(table, [TableUpdate(b"k", b"v")]) == [0]
            assert [e.value for e in await store.get_table_entries(table, [b"k"]) if e] == [b"v"]
            for outsider in outsiders:
                for call in (outsider.append(name, b"x"), outsider.read(name, 0, 10)):
                    with pytest.raises(StoreError, match="refused this node's token") as caught:
                        await call
                    assert not isinstance(caught.value, OwnerUnavailable)
            internal = f"_system/forwarded/{uuid.uuid4().hex}"
            await store.create_table(internal)
            assert await store.update_table(internal, [TableUpdate(b"k", b"v")]) == [0]
            await store.flush()
            for outsider in outsiders:
                with pytest.raises(StoreError, match="refused this node's token"):
                    await outsider.update_table(internal, [TableUpdate(b"k", b"x")])
            [entry] = await store.get_table_entries(internal, [b"k"])
            assert entry is not None and entry.value == b"v"
            assert (await store.info(name)).length == 9
        finally:
            for each in (store, *outsiders):
                await each.close()


def _secret(path: Path, data: bytes) -> Path:
    """A cluster secret file (mode 0600, as the server wants it)."""
    path.write_bytes(data)
    path.chmod(0o600)
    return path


async def test_internal_segments_take_forwarded_changes_only_from_nodes(tmp_path: Path) -> None:
    """Auth off: a node holding the cluster secret (``--cluster-secret-file``)
    forwards changes to internal segments (the controller's and TANK's tables)
    with its node token; a client without it, or with another secret, is
    refused them (``OperationUnsupported``), and may still read them."""
    secret = secrets.token_bytes(32)
    path = _secret(tmp_path / "cluster.secret", secret)
    with _serve(tmp_path, "--cluster-secret-file", str(path)) as owner:
        endpoint = _endpoint(owner)
        node = RemoteStore(endpoint, token_key=secret)
        outsiders = [RemoteStore(endpoint), RemoteStore(endpoint, token_key=b"o" * 32)]
        try:
            table = f"_system/controller/{uuid.uuid4().hex}"
            segment = f"_system/tank/{uuid.uuid4().hex}"
            await node.create_table(table)
            assert await node.update_table(table, [TableUpdate(b"k", b"v")]) == [0]
            await node.create_segment(segment)
            assert await node.append(segment, b"abc") == AppendResult(0, 3)
            for outsider in outsiders:
                for call in (
                    outsider.update_table(table, [TableUpdate(b"k", b"x")]),
                    outsider.remove_table_keys(table, [TableKey(b"k")]),
                    outsider.append(segment, b"x"),
                    outsider.create_segment(f"_system/new/{uuid.uuid4().hex}"),
                    outsider.delete(segment),
                ):
                    with pytest.raises(StoreError, match="need the cluster secret") as caught:
                        await call
                    assert not isinstance(caught.value, OwnerUnavailable)
                [entry] = await outsider.get_table_entries(table, [b"k"])  # reads stay open
                assert entry is not None and entry.value == b"v"
            assert await node.read(segment, 0, 10) == ReadResult(0, b"abc", True, False)
            await node.delete(segment)
            await node.delete_table(table)
        finally:
            for each in (node, *outsiders):
                await each.close()
    assert "no node token" in owner.log_text()


async def test_without_a_cluster_secret_no_node_changes_internal_segments(
    owners: tuple[ServerProcess, ...],
) -> None:
    """A server without ``--cluster-secret-file`` (and auth off) has no key to
    check node tokens with: whatever a client signs, internal segments stay
    the server's own."""
    store = RemoteStore(_endpoint(owners[0]), token_key=b"k" * 32)
    try:
        with pytest.raises(StoreError, match="need the cluster secret"):
            await store.create_table(f"_system/controller/{uuid.uuid4().hex}")
    finally:
        await store.close()


async def test_with_auth_on_the_cluster_secret_signs_every_token(tmp_path: Path) -> None:
    """With auth on, the cluster secret replaces the data directory's token key:
    the controller's tokens and the nodes' are signed with it (no key file is
    made), so every node of a cluster takes the tokens any of them issued."""
    users = tmp_path / "users"
    add_user(users, "admin", "a long secret", "prn::/*,READ_UPDATE")
    secret = secrets.token_bytes(48)
    path = _secret(tmp_path / "cluster.secret", secret)
    args = ("--auth-password-file", str(users), "--cluster-secret-file", str(path))
    with _serve(tmp_path, *args) as owner:
        node = RemoteStore(_endpoint(owner), token_key=secret)
        try:
            await node.create_table(table := f"_system/controller/{uuid.uuid4().hex}")
            assert await node.update_table(table, [TableUpdate(b"k", b"v")]) == [0]
            await node.create_segment(name := _name("secret"))
            assert await node.append(name, b"abc") == AppendResult(0, 3)
        finally:
            await node.close()
    assert not (owner.data_dir / TOKEN_KEY_FILE).exists()


async def _appended_by(store: RemoteStore, name: str, data: bytes) -> None:
    """Append from another task (the waiter's own store: a waiter never blocks it)."""
    await store.append(name, data)


# --------------------------------------------------------------------------- routing


async def test_routed_store_sends_each_segment_to_its_owner(
    owners: tuple[ServerProcess, ...],
) -> None:
    a, b = (_endpoint(server) for server in owners)
    here: Endpoint = ("127.0.0.1", 1)  # this node: never dialled, its store is local
    tag = uuid.uuid4().hex[:12]
    nodes = {"a": a, "b": b, "here": here}

    def locate(name: str) -> Endpoint | None:
        return nodes.get(name.partition("-")[0])

    def named(node: str, kind: str = "st") -> str:
        return f"{node}-{tag}/{kind}/0.#epoch.0"

    local = MemoryStore()
    routed = RoutedStore(local, locate, here=here)
    try:
        for node in nodes:
            await routed.create_segment(named(node))
            assert await routed.append(named(node), node.encode()) == AppendResult(0, len(node))
            await routed.create_table(named(node, "g_kvtable"))
            await routed.update_table(named(node, "g_kvtable"), [TableUpdate(b"k", node.encode())])
        for node in nodes:
            read = await routed.read(named(node), 0, 100)
            assert read == ReadResult(0, node.encode(), True, False)
            [entry] = await routed.get_table_entries(named(node, "g_kvtable"), [b"k"])
            assert entry is not None and entry.value == node.encode()
        for node in nodes:  # each segment is at its owner and nowhere else
            for name in (named(node), named(node, "g_kvtable")):
                assert await _exists(a, name) is (node == "a"), name
                assert await _exists(b, name) is (node == "b"), name
        expected = sorted([named("here"), named("here", "g_kvtable")])
        assert await local.list_segments() == expected
        assert await routed.list_segments() == expected  # what this node holds

        txn = named("a") + "#transaction." + uuid.uuid4().hex
        await routed.create_segment(txn)
        await routed.append(txn, b"+txn")
        assert await routed.merge(named("a"), txn) == len(b"a+txn")  # one owner: merged there
        assert not await _exists(a, txn)
        with pytest.raises(StoreError, match="owned by different nodes"):
            await routed.merge(named("a"), named("b"))
        assert await routed.read(named("b"), 0, 10) == ReadResult(0, b"b", True, False)

        with pytest.raises(OwnerUnavailable):
            await routed.append(named("nobody"), b"x")  # no owner now: retriable
        with pytest.raises(OwnerUnavailable):
            await routed.info(named("nobody"))

        wake = asyncio.get_running_loop().create_future()
        assert routed.watch(named("b"), 1, wake) is True
        await _append_directly(b, named("b"), b"more")
        await asyncio.wait_for(wake, WAIT_S)
        local_wake = asyncio.get_running_loop().create_future()
        assert routed.watch(named("here"), len(b"here"), local_wake) is True
        routed.unwatch(named("here"), local_wake)
    finally:
        await routed.close()
    with pytest.raises(StoreClosed):
        await local.list_segments()  # the routed store closed its local store too
    with pytest.raises(StoreClosed):
        await routed.read(named("a"), 0, 1)
