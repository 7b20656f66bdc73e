"""What the segment store's replies can always carry, against a real ``headrace serve``.

* Texts quoting a segment name (a store error in ``ErrorMessage``) are
  bounded: a name near the wire's 64 KiB string limit is cut in the text,
  so the reply is encodable and the connection goes on.
* The empty table key: the wire writes it without its version, and Pravega's
  tables hold none, so a request naming it is refused with ``ErrorMessage``,
  and a table that holds it anyway (written through the store, here before
  the server started) is iterated without it, page after page.

A raw client (our sans-I/O codec over a socket) talks to the server. Every
wait is bounded; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from headrace.protocols import pravega as p
from headrace.store import DiskStore
from headrace.store.api import MAX_NAME_BYTES
from headrace.types import TableUpdate
from tests._server import FREE, ServerProcess
from tests.server.test_pravega_server import WAIT_S, Raw

LONG_STREAM = "sc/st/" + "n" * (MAX_NAME_BYTES - len("sc/st/"))
"""A stream segment's name of the longest length there is."""
LONG_TABLE = "sc/t_kvtable/" + "t" * (MAX_NAME_BYTES - len("sc/t_kvtable/"))
LONG_TANK = "tank/t/" + "k" * (MAX_NAME_BYTES - len("tank/t/"))
"""Under the TANK scope: the store refuses appends that are not TANK bundles."""
HELD = "sc/held_kvtable/0.#epoch.0"
"""A table holding the empty key, written through the store before the server started."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("bounds") / "data"

    async def hold_the_empty_key() -> None:
        store = await DiskStore.open(data)
        try:
            await store.create_table(HELD)
            await store.update_table(
                HELD, [TableUpdate(k, b"value of " + k) for k in (b"", b"a", b"b")]
            )
        finally:
            await store.close()

    asyncio.run(hold_the_empty_key())
    server = ServerProcess(data, ports={"segment_store": FREE, "tank": FREE})
    with server:
        yield server
    assert "Traceback" not in server.log_text(), server.log_text()


async def _answer(raw: Raw) -> p.Command | None:
    """The next reply, or None once the server closed the connection."""
    while True:
        event = raw.conn.next_event()
        if isinstance(event, p.ConnectionClosed):
            return None
        if event is not None:
            assert isinstance(event, p.Command), event
            return event
        try:
            data = await asyncio.wait_for(raw.reader.read(1 << 20), WAIT_S)
        except ConnectionResetError:
            data = b""
        raw.conn.receive_data(data)


async def _ask(raw: Raw, cmd: p.Command) -> p.Command | None:
    await raw.send(cmd)
    return await _answer(raw)


def _bounded_mention(reply: p.Command | None, name: str, says: str) -> None:
    """``reply`` is an illegal-argument ``ErrorMessage`` echoing ``name`` whole,
    whose text says ``says`` and quotes the name cut, within the bound."""
    assert isinstance(reply, p.ErrorMessage), reply
    assert reply.error_code == p.ErrorMessage.ILLEGAL_ARGUMENT
    assert reply.segment == name
    assert says in reply.message
    assert len(reply.message.encode()) <= p.MAX_REPLY_TEXT_BYTES
    assert repr(name[: p.QUOTED_NAME_CHARS] + "\u2026") in reply.message


def test_errors_about_the_longest_names_are_encodable(server: ServerProcess) -> None:
    """Store errors quoting names of ``MAX_NAME_BYTES`` (a table request on a
    stream segment and the reverse, an append the TANK scope refuses) are
    answered with a bounded text, and the connection serves on."""

    async def check() -> None:
        raw = await Raw.connect(server.port_of("segment_store"))
        try:
            created = await _ask(raw, p.CreateSegment(1, LONG_STREAM, 0, 0))
            assert created == p.SegmentCreated(1, LONG_STREAM)
            info = await _ask(raw, p.GetTableSegmentInfo(2, LONG_STREAM))
            _bounded_mention(info, LONG_STREAM, "is not a table segment")
            read = await _ask(raw, p.ReadTable(3, LONG_STREAM, "", (p.TableKey(b"k"),)))
            _bounded_mention(read, LONG_STREAM, "is not a table segment")
            assert await _ask(raw, p.CreateTableSegment(4, LONG_TABLE)) == p.SegmentCreated(
                4, LONG_TABLE
            )
            truncated = await _ask(raw, p.TruncateSegment(5, LONG_TABLE, 0))
            _bounded_mention(truncated, LONG_TABLE, "is not a stream segment")
            assert await _ask(raw, p.CreateSegment(6, LONG_TANK, 0, 0)) == p.SegmentCreated(
                6, LONG_TANK
            )
            writer = uuid.uuid4()
            setup = await _ask(raw, p.SetupAppend(7, writer, LONG_TANK))
            assert isinstance(setup, p.AppendSetup), setup
            event = p.encode_event(b"not a TANK bundle")
            refused = await _ask(raw, p.AppendBlockEnd(writer, len(event), event, 1, 1, 8))
            _bounded_mention(refused, LONG_TANK, "refuses the append")
            # The connection is whole: the segments are there, untouched.
            stat = await _ask(raw, p.GetStreamSegmentInfo(9, LONG_STREAM))
            assert isinstance(stat, p.StreamSegmentInfo) and stat.exists, stat
            tank = await _ask(raw, p.GetStreamSegmentInfo(10, LONG_TANK))
            assert isinstance(tank, p.StreamSegmentInfo) and tank.write_offset == 0, tank
        finally:
            await raw.aclose()

    asyncio.run(check())
    assert server.alive()


def test_requests_naming_the_empty_key_are_refused(server: ServerProcess) -> None:
    """UpdateTableEntries, RemoveTableKeys and ReadTable naming the empty key get
    ``ErrorMessage`` (illegal argument); nothing is stored, and the connection
    serves on."""
    table = f"sc/empty{uuid.uuid4().hex[:8]}_kvtable/0.#epoch.0"
    empty = p.TableKey(b"")
    value = p.TableValue(b"v")

    async def check() -> None:
        raw = await Raw.connect(server.port_of("segment_store"))
        try:
            assert await _ask(raw, p.CreateTableSegment(1, table)) == p.SegmentCreated(1, table)
            for cmd in (
                p.UpdateTableEntries(2, table, "", p.TableEntries(((empty, value),))),
                p.UpdateTableEntries(
                    3, table, "", p.TableEntries(((p.TableKey(b"k"), value), (empty, value)))
                ),
                p.RemoveTableKeys(4, table, "", (empty,)),
                p.ReadTable(5, table, "", (p.TableKey(b"k"), empty)),
                p.ReadTable(6, table, "", (empty,)),
            ):
                reply = await _ask(raw, cmd)
                assert isinstance(reply, p.ErrorMessage), (cmd, reply)
                assert reply.error_code == p.ErrorMessage.ILLEGAL_ARGUMENT
                assert (reply.request_id, reply.segment) == (cmd.request_id, table)
                assert reply.message == "a table key cannot be empty"
            info = await _ask(raw, p.GetTableSegmentInfo(7, table))
            assert isinstance(info, p.TableSegmentInfo), info
            assert (info.length, info.entry_count) == (0, 0)  # nothing was stored
        finally:
            await raw.aclose()

    asyncio.run(check())


def test_a_table_holding_the_empty_key_is_read_without_it(server: ServerProcess) -> None:
    """Iterations (one key a page: the empty key's page is followed by the next)
    and deltas of a table holding the empty key leave it out; ReadTable of its
    other keys answers; the connection serves on."""

    async def check() -> None:
        raw = await Raw.connect(server.port_of("segment_store"))
        try:
            keys: list[bytes] = []
            token = b""
            for rid in range(1, 10):
                page = await _ask(
                    raw, p.ReadTableKeys(rid, HELD, "", 1, p.TableIteratorArgs(token))
                )
                assert isinstance(page, p.TableKeysRead), page
                if not page.keys:
                    break
                keys += [k.key for k in page.keys]
                token = page.continuation_token
            assert keys == [b"a", b"b"]
            entries = await _ask(raw, p.ReadTableEntries(20, HELD, "", 10, p.TableIteratorArgs()))
            assert isinstance(entries, p.TableEntriesRead), entries
            assert [(k.key, v.value) for k, v in entries.entries.entries] == [
                (b"a", b"value of a"),
                (b"b", b"value of b"),
            ]
            delta = await _ask(raw, p.ReadTableEntriesDelta(21, HELD, "", 0, 10))
            assert isinstance(delta, p.TableEntriesDeltaRead), delta
            assert sorted(k.key for k, _ in delta.entries.entries) == [b"a", b"b"]
            assert delta.reached_end
            first = await _ask(raw, p.ReadTableEntriesDelta(22, HELD, "", 0, 1))
            assert isinstance(first, p.TableEntriesDeltaRead), first
            assert [k.key for k, _ in first.entries.entries] == [b"a"]  # past the empty key
            read = await _ask(raw, p.ReadTable(23, HELD, "", (p.TableKey(b"b"),)))
            assert isinstance(read, p.TableRead), read
            assert read.entries.entries[0][1].value == b"value of b"
        finally:
            await raw.aclose()

    asyncio.run(check())
