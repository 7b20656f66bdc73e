"""A front door over a ``RoutedStore``: appends to segments another node owns travel to it.

The owner is a plain ``headrace serve``; the forwarding node is the same
server on a ``RoutedStore`` (``forwarding_server.py``) that sends every
segment under ``fwd/`` to the owner's segment store. A client writes events
through the forwarding node's doors as it would to any server; the owner
holds every byte. The Pravega door starts an append's handler inline
(``server/_inline.py``), outside any task, so forwarding must not need one
before its first suspension.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
from headrace.protocols import pravega as p
from tests._server import FREE, ServerProcess, free_port
from tests.server.test_pravega_server import Raw

HERE: Final = Path(__file__).resolve().parent
EVENTS: Final = 3000
"""Enough 1 KiB events for several full blocks and small ones."""
EVENT_BYTES: Final = 1024


async def test_events_written_through_a_forwarding_node_are_stored_at_the_owner(
    tmp_path: Path,
) -> None:
    owner = ServerProcess(tmp_path / "owner", ports={"controller": FREE, "segment_store": FREE})
    with owner:
        owner_store = f"127.0.0.1:{owner.port_of('segment_store')}"
        forwarder = ServerProcess(
            tmp_path / "forwarder",
            ports={"controller": free_port(), "segment_store": free_port()},
            runner=[str(HERE / "forwarding_server.py"), owner_store, "fwd/"],
        )
        with forwarder:
            async with PravegaClient(forwarder.uri) as client:
                await client.controller.create_scope("fwd")
                config = StreamConfig(ScalingPolicy.fixed(1))
                await client.controller.create_stream("fwd", "st", config)
                writer = await client.create_writer("fwd", "st")
                for number in range(EVENTS):
                    await writer.write(number.to_bytes(4, "big") * (EVENT_BYTES // 4))
                await writer.flush()
                await writer.aclose()
            assert "Traceback" not in forwarder.log_text(), forwarder.log_text()

        raw = await Raw.connect(owner.port_of("segment_store"))
        try:
            reply = await raw.request(p.GetStreamSegmentInfo(1, "fwd/st/0.#epoch.0", ""))
        finally:
            raw.writer.close()
        assert isinstance(reply, p.StreamSegmentInfo) and reply.exists, reply
        assert reply.write_offset == EVENTS * (8 + EVENT_BYTES)  # each event framed, once
