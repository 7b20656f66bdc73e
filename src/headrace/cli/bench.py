"""``headrace bench``: produce and consume events at a size and rate and print the
rates and the end-to-end latency (``nats bench`` style).

The producer writes ``--events`` events of ``--size`` bytes through one
:class:`~headrace.client.EventWriter` (paced to ``--rate`` if given); a record
reader follows the stream from its tail at the start and reads them back as
they come. Each event starts with a run id, its number and its send time, so
the consumer counts only this run's events and measures the time from write to
read; the consume rate counts from the first write to the last read. A stream
the bench creates is deleted at the end; one that existed is
left as it is (with the bench's events in it).
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Final

import click

from headrace.client import ScalingPolicy, StreamConfig

from ._client import controller_option, pravega_client, run, split_stream
from ._output import echo_json, json_option

if TYPE_CHECKING:
    from headrace.client import PravegaClient

__all__ = ["bench"]

_HEADER: Final = struct.Struct(">8sQQ")
"""Run id, event number, send time (``perf_counter_ns``) at the head of each event."""

MAX_BENCH_EVENT_BYTES: Final = 8 * 1024 * 1024
"""Largest ``--size``: beyond it a run measures large-event handling, not a rate."""

DRAIN_TIMEOUT_S: Final = 60.0
"""How long the consumer may trail the producer's end before the run fails."""


@dataclass(slots=True)
class Result:
    """What one run measured (``--json`` prints it as it is)."""

    stream: str
    events: int
    size: int
    produce_s: float
    produce_events_per_s: float
    produce_mib_per_s: float
    consumed: int
    consume_s: float | None
    consume_events_per_s: float | None
    latency_ms_p50: float | None
    latency_ms_p99: float | None
    latency_ms_max: float | None


def _percentile(sorted_values: list[float], share: float) -> float:
    index = min(len(sorted_values) - 1, round(share * (len(sorted_values) - 1)))
    return sorted_values[index]


async def _produce(
    client: PravegaClient, scope: str, st: str, run_id: bytes, events: int, size: int,
    rate: float | None,
) -> tuple[float, float]:  # fmt: skip
    """When producing started (``perf_counter``) and how long it took to the last ack."""
    padding = b"x" * (size - _HEADER.size)
    writer = await client.create_writer(scope, st)
    started = time.perf_counter()
    try:
        for number in range(events):
            if rate:
                delay = started + number / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            head = _HEADER.pack(run_id, number, time.perf_counter_ns())
            await writer.write(head + padding, routing_key=str(number))
        await writer.flush()
    finally:
        await writer.aclose()
    return started, time.perf_counter() - started


async def _consume(
    client: PravegaClient, scope: str, st: str, run_id: bytes, events: int,
    ready: asyncio.Event, latencies: list[float],
) -> float:  # fmt: skip
    """When (``perf_counter``) the last of this run's events was read."""
    start = {
        r.segment: (await client.segments.stat(r.segment)).length
        for r in await client.controller.get_current_segments(scope, st)
    }
    seen: set[int] = set()
    async with client.record_reader(scope, st, start=start, follow=True) as reader:
        ready.set()
        async for record in reader:
            if len(record.value) < _HEADER.size:
                continue
            rid, number, sent_ns = _HEADER.unpack_from(record.value)
            if rid != run_id or number in seen:
                continue
            seen.add(number)
            latencies.append((time.perf_counter_ns() - sent_ns) / 1e6)
            if len(seen) >= events:
                break
    return time.perf_counter()


async def _bench(
    controller: str, scope: str, st: str, events: int, size: int, rate: float | None,
    segments: int, consume: bool,
) -> Result:  # fmt: skip
    run_id = os.urandom(8)
    async with pravega_client(controller) as client:
        await client.controller.create_scope(scope)
        created = await client.controller.create_stream(
            scope, st, StreamConfig(ScalingPolicy.fixed(segments))
        )
        latencies: list[float] = []
        consume_s: float | None = None
        try:
            consumer: asyncio.Task[float] | None = None
            if consume:
                ready = asyncio.Event()
                consumer = asyncio.create_task(
                    _consume(client, scope, st, run_id, events, ready, latencies)
                )
                waiter = asyncio.create_task(ready.wait())
                await asyncio.wait({consumer, waiter}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if consumer.done():
                    consumer.result()  # raises what stopped it
            started, produce_s = await _produce(client, scope, st, run_id, events, size, rate)
            if consumer is not None:
                try:
                    async with asyncio.timeout(DRAIN_TIMEOUT_S):
                        consume_s = await consumer - started
                except TimeoutError:
                    consume_s = None
        finally:
            if created:
                await client.controller.seal_stream(scope, st)
                await client.controller.delete_stream(scope, st)
    latencies.sort()
    mib = events * size / (1024 * 1024)
    return Result(
        stream=f"{scope}/{st}",
        events=events,
        size=size,
        produce_s=produce_s,
        produce_events_per_s=events / produce_s if produce_s else 0.0,
        produce_mib_per_s=mib / produce_s if produce_s else 0.0,
        consumed=len(latencies),
        consume_s=consume_s,
        consume_events_per_s=(len(latencies) / consume_s) if consume_s else None,
        latency_ms_p50=_percentile(latencies, 0.5) if latencies else None,
        latency_ms_p99=_percentile(latencies, 0.99) if latencies else None,
        latency_ms_max=latencies[-1] if latencies else None,
    )


@click.command()
@controller_option
@click.argument("name", metavar="SCOPE/STREAM", default="bench/bench")
@click.option("-n", "--events", type=click.IntRange(min=1), default=10_000, show_default=True)
@click.option(
    "-s", "--size", type=click.IntRange(_HEADER.size, MAX_BENCH_EVENT_BYTES), default=128,
    show_default=True, help="Bytes per event.",
)  # fmt: skip
@click.option(
    "-r", "--rate", type=click.FloatRange(min=0, min_open=True),
    help="Events per second to produce (default: as fast as the writer goes).",
)  # fmt: skip
@click.option(
    "--segments", type=click.IntRange(1, 1024), default=1, show_default=True,
    help="Segments of the stream when the bench creates it.",
)  # fmt: skip
@click.option("--consume/--no-consume", default=True, show_default=True,
              help="Read the events back as they come (rates and latency).")  # fmt: skip
@json_option
def bench(
    controller: str, name: str, events: int, size: int, rate: float | None, segments: int,
    consume: bool, as_json: bool,
) -> None:  # fmt: skip
    """Produce EVENTS events of SIZE bytes to SCOPE/STREAM (default bench/bench),
    read them back, and print the rates and the latency.

    \b
    Examples:
      headrace bench                       # 10,000 events of 128 B, as fast as possible
      headrace bench -n 100000 -s 1024 -r 5000 --segments 4
    """
    scope, st = split_stream(name)
    result = run(_bench(controller, scope, st, events, size, rate, segments, consume))
    if as_json:
        echo_json(asdict(result))
    else:
        click.echo(
            f"produced {result.events} events of {size} B in {result.produce_s:.2f} s: "
            f"{result.produce_events_per_s:,.0f} events/s, {result.produce_mib_per_s:.2f} MiB/s"
        )
        if consume:
            if result.consume_s is not None and result.consume_events_per_s is not None:
                click.echo(
                    f"consumed {result.consumed} events in {result.consume_s:.2f} s: "
                    f"{result.consume_events_per_s:,.0f} events/s"
                )
            click.echo(
                f"latency (write to read): p50 {result.latency_ms_p50 or 0:.2f} ms, "
                f"p99 {result.latency_ms_p99 or 0:.2f} ms, max {result.latency_ms_max or 0:.2f} ms"
            )
    if consume and result.consumed < events:
        raise click.ClickException(
            f"the consumer read {result.consumed} of {events} events "
            f"within {DRAIN_TIMEOUT_S:.0f} s of the producer's end"
        )
