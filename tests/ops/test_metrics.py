"""``/metrics`` of a real ``headrace serve``: the process, the build, and events per stream."""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

from headrace import __version__
from headrace.client import PravegaClient
from headrace.client.tank import TankClient
from headrace.protocols.tank import BundleMessage
from headrace.server.metrics import OTHER_STREAMS, StreamTally, count_events
from tests.ops.conftest import START_TIMEOUT_S, WAIT_S, free_port, listener_args


async def _produce(port: int, counts: dict[str, int], per_bundle: int = 1) -> None:
    async with await TankClient.connect("127.0.0.1", port) as client:
        for topic, bundles in counts.items():
            await client.create_topic(topic, 1)
            for n in range(bundles):
                messages = [BundleMessage(f"{topic} {n}.{m}".encode()) for m in range(per_bundle)]
                await client.produce(topic, 0, messages)


def test_process_and_build_metrics_describe_the_server_process(start_serve: Any) -> None:
    serve = start_serve(*listener_args(http=free_port()))
    assert serve.process is not None
    assert serve.metric("headrace_build_info", version=__version__) == 1
    assert serve.metric("process_resident_memory_bytes") > 1_000_000
    assert serve.metric("process_open_fds") >= 3
    assert serve.metric("process_max_fds") >= serve.metric("process_open_fds")
    started = serve.metric("process_start_time_seconds")
    assert time.time() - START_TIMEOUT_S - 60 < started <= time.time()
    assert serve.metric("process_cpu_seconds_total") > 0


def test_events_per_stream_are_counted_once_acknowledged(start_serve: Any) -> None:
    http, tank = free_port(), free_port()
    serve = start_serve(*listener_args(http=http, tank=tank))
    asyncio.run(asyncio.wait_for(_produce(tank, {"alpha": 3, "beta": 5}), WAIT_S))
    assert serve.metric("headrace_stream_events_total", stream="tank/alpha") == 3
    assert serve.metric("headrace_stream_events_total", stream="tank/beta") == 5
    assert serve.metric("headrace_stream_events_total", stream=OTHER_STREAMS) == 0
    # Each bundle is one stored event, and its bytes are what was appended.
    assert serve.metric("headrace_stream_appended_bytes_total", stream="tank/beta") > 5 * 8
    assert serve.metric("headrace_append_seconds_count") >= 8


def test_a_pravega_writers_events_are_counted_as_its_appends_say(start_serve: Any) -> None:
    """The Pravega door passes each append block's event count to the store,
    so many events in one append are counted without a walk over the data."""
    http, controller, store = free_port(), free_port(), free_port()
    serve = start_serve(*listener_args(http=http, controller=controller, segment_store=store))

    async def write() -> None:
        async with PravegaClient(f"tcp://127.0.0.1:{controller}") as client:
            await client.controller.create_scope("pm")
            await client.controller.create_stream("pm", "st")
            async with await client.create_writer("pm", "st") as writer:
                for i in range(500):
                    await writer.write(b"event %d" % i)
                await writer.flush()

    asyncio.run(asyncio.wait_for(write(), WAIT_S))
    assert serve.metric("headrace_stream_events_total", stream="pm/st") == 500
    assert serve.metric("headrace_append_seconds_count") < 500  # events shared appends


def test_per_stream_labels_stay_bounded_by_metrics_streams(start_serve: Any) -> None:
    http, tank = free_port(), free_port()
    serve = start_serve(*listener_args(http=http, tank=tank), "--metrics-streams", "2")
    topics = {f"t{n}": n + 1 for n in range(5)}  # 1 + 2 + 3 + 4 + 5 bundles
    asyncio.run(asyncio.wait_for(_produce(tank, topics), WAIT_S))
    from prometheus_client.parser import text_string_to_metric_families

    _, text = serve.get("/metrics")
    labels = {
        sample.labels["stream"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "headrace_stream_events_total"
    }
    assert labels == {"tank/t0": 1, "tank/t1": 2, OTHER_STREAMS: 3 + 4 + 5}


def test_no_per_stream_labels_with_metrics_streams_0(start_serve: Any) -> None:
    http, tank = free_port(), free_port()
    serve = start_serve(*listener_args(http=http, tank=tank), "--metrics-streams", "0")
    asyncio.run(asyncio.wait_for(_produce(tank, {"solo": 2}), WAIT_S))
    assert serve.metric("headrace_stream_events_total", stream=OTHER_STREAMS) == 2
    assert serve.metric("headrace_stream_events_total", stream="tank/solo") == 0


def test_events_are_whole_frames_of_the_event_framing_and_streams_are_capped() -> None:
    def frame(payload: bytes) -> bytes:
        return struct.pack(">ii", 0, len(payload)) + payload

    assert count_events(frame(b"a") + frame(b"") + frame(b"bcd")) == 3
    assert count_events(b"") == 0
    assert count_events(b"raw bytes of a byte stream") == 0
    assert count_events(frame(b"abc")[:-1]) == 0  # a part of an event
    assert count_events(struct.pack(">ii", 7, 0)) == 0  # not an event's header

    tally = StreamTally(limit=2)
    for segment in ("s/a/0.#epoch.0", "s/b/1.#epoch.1", "s/c/0.#epoch.0", "s/a/2.#epoch.1"):
        tally.add(segment, frame(b"x"))
    tally.add("_system/containers/metadata", frame(b"x"))  # the server's own: not a stream
    assert tally.get("s/a") == (2, 18) and tally.get("s/c") is None
    assert tally.labelled(1) == [("s/a", (2, 18)), (OTHER_STREAMS, (2, 18))]
