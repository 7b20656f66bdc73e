"""Catch-up reads of a stored stream, against loopback TCP measured in the same run.

The suite's catch-up shape (``suite.py``: 10 KiB events read back with 2 MiB
``ReadSegment``s through headrace's own client) on its own, so the read path
can be measured without the rest of the suite, plus two readers that show
where the time goes:

* ``client``: headrace's ``PravegaClient`` (``segments.read``), as the suite's
  client row, reading the stream ``--passes`` times;
* ``raw``: a plain socket that sends the ``ReadSegment``s and only walks the
  reply frames (``recv_into`` a reused buffer), one read at a time, in this
  process;
* ``reader_dN``: the suite's catch-up reader process (``suite_workers.py
  hr-catchup``, the row the suite's target uses): a bare socket with ``N``
  ``ReadSegment``s sent ahead of the reply being received (the next sent as a
  reply's header arrives), every event header of the stream checked, so the
  figure is the server's and the kernel's, not a client's decoding
  (``--depths``, ``--rcvbuf``);
* ``records``: headrace's ``RecordReader`` over the same stream (the CLI's,
  RS-IO's and the Spark source's reader: events cut out of the replies, one
  ``bytes`` each), MB/s of stored bytes;
* ``tank``: TANK consumes of the same amount stored as bundles (4 MiB
  fetches, the suite's TANK consume).

Prints a human summary and, as its last line, one JSON object.

    .venv/bin/python benchmarks/catchup.py            # about 40 s
    .venv/bin/python benchmarks/catchup.py --events 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import tempfile
import time
from pathlib import Path

import _common as common
from hrbench.config import SMALL
from hrbench.hr_client import hr_catchup, hr_produce, tank_produce
from hrbench.limits import loopback_tcp
from hrbench.measure import Profiler, run_group

EVENT_BYTES = 10 * 1024
READ_BYTES = 2 * 1024 * 1024
REPEATS = 3


def _raw_catchup(port: int, segment: str, end: int) -> float:
    """Read ``[0, end)`` of ``segment`` with pipelined-by-one ReadSegments over a bare socket."""
    from headrace.protocols import pravega as p

    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = bytearray(READ_BYTES + 1024 * 1024)
    view = memoryview(buffer)
    header = struct.Struct(">ii")

    def recv_frame() -> tuple[int, int]:
        """Receive one frame into ``buffer``; return (type, payload size)."""
        got = 0
        while got < 8:
            got += sock.recv_into(view[got:8])
        kind, size = header.unpack_from(buffer)
        total = 8 + size
        while got < total:
            n = sock.recv_into(view[got:total])
            if not n:
                raise ConnectionError("server closed")
            got += n
        return kind, size

    sock.sendall(p.encode_command(p.Hello(p.WIRE_VERSION, p.OLDEST_COMPATIBLE_VERSION)))
    recv_frame()
    offset = 0
    request_id = 1
    began = time.perf_counter()
    while offset < end:
        sock.sendall(p.encode_command(p.ReadSegment(segment, offset, READ_BYTES, "", request_id)))
        kind, _ = recv_frame()
        if kind != p.CommandType.SEGMENT_READ:
            raise SystemExit(f"unexpected reply type {kind}")
        name_size = int.from_bytes(buffer[8:10], "big")
        data_size_at = 10 + name_size + 8 + 2
        data_size = int.from_bytes(buffer[data_size_at : data_size_at + 4], "big", signed=True)
        offset += data_size
        request_id += 1
    seconds = time.perf_counter() - began
    sock.close()
    return seconds


def _reader_process(
    port: int, segment: str, end: int, depth: int, rcvbuf: int, passes: int
) -> float:
    """MB/s of the suite's catch-up reader process (``hr-catchup``) with ``depth``
    reads ahead, reading the stream ``passes`` times."""
    command = ["hr-catchup", str(port), segment, str(end), str(EVENT_BYTES), str(depth)]
    command += [str(READ_BYTES), str(rcvbuf), str(passes)]
    _, (out,) = run_group([command])
    if not out["complete"] or out["events"] * (8 + EVENT_BYTES) != end * passes:
        raise SystemExit(f"the reader did not get the whole stream: {out}")
    return float(out["bytes"]) / float(out["seconds"]) / 1e6


async def _records_catchup(uri: str, stream: str, end: int) -> float:
    """Read the whole stream as records; seconds taken (checks every stored byte came)."""
    from headrace.client import PravegaClient

    async with PravegaClient(uri) as client:
        began = time.perf_counter()
        stored = 0
        async with client.record_reader("bench", stream) as reader:
            async for record in reader:
                stored += 8 + len(record.value)
        seconds = time.perf_counter() - began
    assert stored == end, (stored, end)
    return seconds


async def _segment_end(uri: str, stream: str) -> tuple[str, int]:
    from headrace.client import PravegaClient

    async with PravegaClient(uri) as client:
        ranges = await client.controller.get_current_segments("bench", stream)
        segment = ranges[0].segment
        return segment.name, (await client.segments.stat(segment)).length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000, help="10 KiB events stored")
    parser.add_argument("--tank-messages", type=int, default=400_000, help="100 B TANK messages")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the data directory")
    parser.add_argument(
        "--depths", default="1,2,4", help="reads ahead of the reader process rows (comma list)"
    )
    parser.add_argument(
        "--passes", type=int, default=5, help="times each reader process reads the stream"
    )
    parser.add_argument(
        "--rcvbuf", type=int, default=0, help="SO_RCVBUF of the reader processes (0: autotuning)"
    )
    args = parser.parse_args()
    results: dict[str, object] = {"benchmark": "catchup", "machine": common.machine()}
    results["loadavg_1m_start"] = common.loadavg()
    tcp = loopback_tcp(3)
    results["loopback_tcp_mb_per_s"] = tcp
    print(f"loopback TCP (iperf3): {tcp} MB/s", flush=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        ports = {n: common.free_port() for n in ("controller", "segment-store", "tank")}
        proc = common.start_headrace(Path(tmp) / "data", ports)
        try:
            uri = f"tcp://127.0.0.1:{ports['controller']}"
            asyncio.run(hr_produce(uri, "p10k", EVENT_BYTES, args.events))
            segment, end = asyncio.run(_segment_end(uri, "p10k"))
            depths = [int(d) for d in args.depths.split(",") if d]
            rows: dict[str, list[float]] = {"client": [], "raw": [], "records": []}
            rows.update({f"reader_d{d}": [] for d in depths})
            for _ in range(REPEATS):
                for depth in depths:
                    rows[f"reader_d{depth}"].append(
                        _reader_process(
                            ports["segment-store"], segment, end, depth, args.rcvbuf, args.passes
                        )
                    )
                seconds, nbytes = asyncio.run(hr_catchup(uri, "p10k", args.passes))
                assert nbytes == end * args.passes
                rows["client"].append(nbytes / seconds / 1e6)
                rows["raw"].append(end / _raw_catchup(ports["segment-store"], segment, end) / 1e6)
                rows["records"].append(end / asyncio.run(_records_catchup(uri, "p10k", end)) / 1e6)
            for name, figures in rows.items():
                best = max(figures)
                results[f"{name}_mb_per_s"] = [round(f, 1) for f in figures]
                results[f"{name}_vs_tcp"] = round(best / tcp, 3) if tcp else None
                print(
                    f"catch-up ({name}): {', '.join(f'{f:.1f}' for f in figures)} MB/s;"
                    f" best / loopback TCP = {results[f'{name}_vs_tcp']}",
                    flush=True,
                )
            prof = Profiler(False, proc.pid, "tank", Path(tmp))
            _, _, consume_s = tank_produce(ports["tank"], args.tank_messages, prof, proc.pid)
            tank_mb = args.tank_messages * SMALL / consume_s / 1e6
            results["tank_consume_mb_per_s"] = round(tank_mb, 1)
            results["tank_vs_tcp"] = round(tank_mb / tcp, 3) if tcp else None
            print(f"TANK consume: {tank_mb:.1f} MB/s of messages", flush=True)
        finally:
            common.stop(proc)
    results["loadavg_1m_end"] = common.loadavg()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
