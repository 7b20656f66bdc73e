"""What the peers' shapes share: worker arguments, end-to-end rows, idle memory."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import _common as common

from hrbench.config import producers_label, read_batch, stamp_every
from hrbench.context import Context
from hrbench.measure import e2e_row, say
from hrbench.results import Memory


def worker_args(worker: str, port: int, stream: str, times: int = 1) -> list[str]:
    """A peer worker's first arguments: its name, the port, the stream ``times`` times."""
    return [worker, str(port), *([stream] * times)]


def peer_e2e_rows(
    ctx: Context,
    label: str,
    key: str,
    pid: int,
    *,
    producer: Callable[[str], list[str]],
    consumer: Callable[[str], list[str]],
    note: str,
    before: Callable[[str], object] | None = None,
    after: Callable[[str], object] | None = None,
) -> None:
    """A peer's end-to-end rows, every size, 1 and ``PRODUCERS`` producers.

    ``producer(stream)`` and ``consumer(stream)`` are a worker command's first
    arguments (size, count and stamping, or count, time limit and batch,
    follow); ``before``/``after`` run around each row (create the stream,
    drop it); ``note`` is formatted with the consumer's ``batch``.
    """
    sizes = ctx.sizes
    for shape, stream, size, total, producers in sizes.e2e_shapes(sizes.peer_e2e_events):
        if before is not None:
            before(stream)
        per = total // producers
        batch = read_batch(size)
        row = e2e_row(
            producers_label(label, producers),
            [*producer(stream), str(size), str(per), stamp_every(total)],
            producers,
            [*consumer(stream), str(per * producers), "300", str(batch)],
            size,
            per * producers,
            pid,
            note=note.format(batch=batch),
        )
        ctx.results.put(shape, key, row)
        if after is not None:
            after(stream)
        say(f"  {label}: end to end, {shape}: {row.mb_per_s} MB/s")


def idle_connection_memory(port: int, pid: int, count: int) -> Memory:
    """Server RSS growth per connected, silent TCP connection."""
    time.sleep(0.5)  # the server settles after its start
    before = common.memory_kib(pid).get("VmRSS", 0)
    socks = []
    try:
        for _ in range(count):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(1.5)  # every connection accepted and set up
        after = common.memory_kib(pid).get("VmRSS", 0)
    finally:
        for sock in socks:
            sock.close()
    return Memory(connections=count, kib_per_connection=round((after - before) / count, 2))
