"""``--max-segment-attributes``: the bound on the writer ids a segment keeps
reaches the store of a real ``headrace serve``.

Three of our ``EventWriter`` s (each a fresh writer id) write one after the
other to a one-segment stream of a server started with a bound of 2; after a
clean stop the segment holds the two most recent writers' ids with their last
event numbers, and the first writer's is gone.
"""

from __future__ import annotations

from pathlib import Path

from headrace.client import PravegaClient
from headrace.store import DiskStore
from tests._server import PravegaServer

SCOPE = "attrs"
STREAM = "bounded"
EVENTS_PER_WRITER = 3


async def _writer_attributes(data_dir: Path) -> dict[str, int]:
    """Writer id (hex) -> last event number of the stream's only segment (offline)."""
    store = await DiskStore.open(data_dir)
    try:
        names = [n for n in await store.list_segments() if n.startswith(f"{SCOPE}/{STREAM}/")]
        assert len(names) == 1, names
        info = await store.info(names[0])
        return {w.hex: n for w, n in info.attributes.items()}
    finally:
        await store.close()


async def test_max_segment_attributes_keeps_the_most_recent_writers(tmp_path: Path) -> None:
    server = PravegaServer(tmp_path / "data", fsync="always", args=["--max-segment-attributes=2"])
    writer_ids: list[str] = []
    try:
        client = PravegaClient(server.uri)
        try:
            await client.controller.create_scope(SCOPE)
            await client.controller.create_stream(SCOPE, STREAM)
            for w in range(3):
                writer = await client.create_writer(SCOPE, STREAM)
                for i in range(EVENTS_PER_WRITER):
                    await writer.write(f"w{w}:{i}".encode())
                await writer.flush()
                (segment_writer,) = writer._writers.values()  # one segment: one writer id
                writer_ids.append(segment_writer.writer_id.hex)
                await writer.aclose()
        finally:
            await client.aclose()
    finally:
        code = server.stop()
    assert code == 0, server.log_tail()
    attributes = await _writer_attributes(server.data_dir)
    assert attributes == {writer_ids[1]: EVENTS_PER_WRITER, writer_ids[2]: EVENTS_PER_WRITER}
