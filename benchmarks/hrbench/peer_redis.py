"""Redis Streams (``appendonly yes``; ``appendfsync everysec``, then ``always``)
through redis-py, ``redis-benchmark`` (Redis's own ceiling with a C client) and
the suite's raw-socket paced writer."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import subprocess
import time
from pathlib import Path

import _common as common

from hrbench.config import HUGE, LARGE, OFFERED_RATE, PRODUCERS, SMALL, producers_label, read_batch
from hrbench.context import Context
from hrbench.limits import ensure_debian
from hrbench.measure import Measured, latency_row, producers_row, rate_row, run_group, say
from hrbench.peers import idle_connection_memory, peer_e2e_rows, worker_args
from hrbench.results import Row


def start_redis(
    binary: str, directory: Path, appendfsync: str
) -> tuple[subprocess.Popen[bytes], int]:
    port = common.free_port()
    proc = subprocess.Popen(
        [
            *(binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory)),
            *("--appendonly", "yes", "--appendfsync", appendfsync, "--save", ""),
            *("--protected-mode", "no", "--daemonize", "no", "--maxclients", "20000"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    common.wait_connectable(proc, port, time.monotonic() + common.START_TIMEOUT_S)
    return proc, port


async def redis_produce(port: int, key: str, size: int, count: int, batch: int = 1000) -> float:
    import redis.asyncio as aioredis

    client = aioredis.Redis(host="127.0.0.1", port=port)
    payload = os.urandom(size)
    began = time.perf_counter()
    for start in range(0, count, batch):
        pipe = client.pipeline(transaction=False)
        for _ in range(min(batch, count - start)):
            pipe.xadd(key, {"v": payload})
        await pipe.execute()
    seconds = time.perf_counter() - began
    await client.aclose()
    return seconds


async def redis_range(port: int, key: str, count: int, batch: int = 1000) -> float:
    """Read ``count`` stored entries with ``XRANGE`` of ``batch`` (redis-py)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis(host="127.0.0.1", port=port)
    began = time.perf_counter()
    got = 0
    last: bytes | str = "-"
    while got < count:
        entries = await client.xrange(key, min=last, max="+", count=batch) or []
        if last != "-":
            entries = entries[1:]
        if not entries:
            break
        got += len(entries)
        last = entries[-1][0] or last
    seconds = time.perf_counter() - began
    await client.aclose()
    return seconds


def redis_delete(port: int, key: str) -> None:
    """Drop a stream a shape is done with: Redis holds every stream in memory."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    client.delete(key)
    client.close()


def redis_benchmark(port: int, count: int, label: str) -> Row | str:
    """``redis-benchmark -P 64`` of 100 B ``XADD``s: its row, or why there is none."""
    tool = shutil.which("redis-benchmark")
    if tool is None:
        return "redis-benchmark not installed"
    value = "x" * (SMALL - 1)
    command = [tool, "-p", str(port), "-n", str(count), "-P", "64", "--csv"]
    out = subprocess.run(
        [*command, "XADD", "rb", "*", "v", value],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    ).stdout
    for line in out.splitlines():
        cells = [c.strip('"') for c in line.split(",")]
        if len(cells) > 1 and cells[0].startswith("XADD"):
            events_per_s = float(cells[1])
            system = f"{label}, redis-benchmark -P 64"
            return rate_row(system, count, SMALL, count / events_per_s, note="C client, pipelined")
    return f"unparsed redis-benchmark output: {out[-200:]!r}"


def run_redis(ctx: Context) -> None:
    binary = ensure_debian("redis-server", "redis-server")
    if binary is None:
        return
    for appendfsync in ("everysec", "always"):
        key = f"redis_{appendfsync}"
        directory = ctx.scratch / key
        directory.mkdir()
        proc, port = start_redis(binary, directory, appendfsync)
        try:
            RedisPolicy(ctx, appendfsync, port, proc.pid).run()
        finally:
            common.stop(proc)


class RedisPolicy:
    """The shapes on one Redis server. ``everysec`` gets every shape; ``always``
    the producer and latency shapes only."""

    def __init__(self, ctx: Context, appendfsync: str, port: int, pid: int) -> None:
        self.ctx = ctx
        self.sizes = ctx.sizes
        self.first = appendfsync == "everysec"
        self.key = f"redis_{appendfsync}"
        self.label = f"Redis Streams (appendfsync {appendfsync})"
        self.port = port
        self.pid = pid

    def run(self) -> None:
        want = self.ctx.want
        if self.first and want("memory"):  # memory first, on the fresh server
            self.ctx.results.memory[self.key] = idle_connection_memory(
                self.port, self.pid, self.sizes.idle_connections
            )
        if want("produce") or want("consume"):
            self.produce_small()
        if want("producers4"):
            self.producers4()
        if want("consume") and self.first:
            self.consume_small()
        if want("e2e") and self.first:
            peer_e2e_rows(
                self.ctx,
                self.label,
                self.key,
                self.pid,
                producer=functools.partial(worker_args, "redis-produce", self.port),
                consumer=functools.partial(worker_args, "redis-consume", self.port),
                note="redis-py, XREAD BLOCK {batch:,}",
                after=functools.partial(redis_delete, self.port),
            )
        if want("large"):
            self.large()
        if want("latency"):
            self.latency()

    def produce_small(self) -> None:
        count = self.sizes.peer_small_events
        with Measured(self.pid) as m:
            seconds = asyncio.run(redis_produce(self.port, "p100", SMALL, count))
        row = rate_row(
            self.label, count, SMALL, seconds, pid=self.pid, cpu_s=m.cpu, note="redis-py pipelined"
        )
        self.ctx.results.put("produce_100b", self.key, row)
        ceiling = redis_benchmark(self.port, count, self.label)
        if isinstance(ceiling, Row):
            self.ctx.results.put("produce_100b", f"{self.key}_redis_benchmark", ceiling)
            best: object = f"{ceiling.events_per_s:,}"
        else:
            best = ceiling
        say(f"  {self.label}: 100 B {row.events_per_s:,} events/s (redis-benchmark -P 64: {best})")

    def producers4(self) -> None:
        label4 = producers_label(self.label, PRODUCERS)
        shapes = [("produce_100b_4", "p100x4", SMALL, self.sizes.peer_small_events)]
        if self.first:
            shapes += self.sizes.producers4_large()
        for shape, stream, size, total in shapes:
            per = total // PRODUCERS
            command = ["redis-produce", str(self.port), stream, str(size), str(per)]
            note = (
                "redis-py pipelines of 1,000 each" if size == SMALL else "redis-py pipelines each"
            )
            row = producers_row(label4, command, PRODUCERS, size, self.pid, note)
            self.ctx.results.put(shape, self.key, row)
            if size != SMALL:
                redis_delete(self.port, stream)
            say(
                f"  {self.label}: {PRODUCERS} producers, {size} B {row.events_per_s:,} events/s,"
                f" {row.mb_per_s} MB/s"
            )

    def consume_small(self) -> None:
        count = self.sizes.peer_small_events
        with Measured(self.pid) as m:
            seconds = asyncio.run(redis_range(self.port, "p100", count))
        note = "redis-py XRANGE 1,000"
        row = rate_row(self.label, count, SMALL, seconds, pid=self.pid, cpu_s=m.cpu, note=note)
        self.ctx.results.put("consume_100b", self.key, row)
        say(f"  {self.label}: consume {row.events_per_s:,} events/s")

    def large(self) -> None:
        for shape, consumed, stream, size, count, batch in (
            ("produce_10k", "catchup", "p10k", LARGE, self.sizes.large_events, 100),
            ("produce_1mib", "consume_1mib", "p1m", HUGE, self.sizes.huge_events, 10),
        ):
            seconds = asyncio.run(redis_produce(self.port, stream, size, count, batch=batch))
            row = rate_row(self.label, count, size, seconds, pid=self.pid)
            self.ctx.results.put(shape, self.key, row)
            say(f"  {self.label}: {shape} {row.mb_per_s} MB/s")
            if not self.first:
                continue
            read = read_batch(size)
            seconds = asyncio.run(redis_range(self.port, stream, count, read))
            note = "" if size == LARGE else f"XRANGE {read}"
            row = rate_row(self.label, count, size, seconds, pid=self.pid, note=note)
            self.ctx.results.put(consumed, self.key, row)
            say(f"  {self.label}: {consumed} {row.mb_per_s} MB/s")

    def latency(self) -> None:
        command = [
            *("lat-redis", str(self.port), "lat", str(OFFERED_RATE)),
            *(str(self.sizes.latency_s), self.sizes.flush_s),
        ]
        _, (out,) = run_group([command])
        note = "raw-socket paced writer, pipelined XADD"
        row = latency_row(f"{self.label} ack", out, note=note)
        self.ctx.results.put("latency", self.key, row)
        say(f"  {self.label}: ack at 10k/s p99 {row.p99_ms} ms")
