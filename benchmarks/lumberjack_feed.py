"""Lumberjack decoding and routing alone: ``LumberjackHandler.feed`` without sockets or storage.

Run: ``.venv/bin/python benchmarks/lumberjack_feed.py [--windows N] [--rounds N]``.

``benchmarks/lumberjack_ingest.py`` measures the whole round trip through a
``headrace serve`` child; this script measures only the part that bounds it on
one core: the sans-I/O codec, the window state machine and the routing key,
as ``LumberjackHandler.feed`` runs them for each read. It builds the same
libbeat-like windows (2048 ~310-byte Filebeat events, ``W`` then bare ``J``
frames or one ``C`` frame at zlib level 3), cuts them into 256 KiB reads (the
server's read size) and feeds them to a handler whose target stream never
gets a byte: closed windows are counted and dropped. It also times the same
windows with routing turned off (no routing-key fields), which shows what the
routing key costs, and the same events as v1 ``D`` frames (logstash-forwarder's
four pairs), and reports each configuration's best round.

As a baseline measured in the same run, ``--baseline SRC`` times the handler
of another source tree (for example an older checkout's ``src``) in a child
process, interleaved round by round with this tree's, and prints the ratios.

Nothing here asserts speed; it is a measuring tool, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lumberjack_ingest import COMPRESS_LEVEL, WINDOW_EVENTS, _event, _window  # same windows

READ_BYTES = 256 * 1024
"""Bytes per ``feed`` call: the server's read size (``READ_CHUNK_BYTES``)."""

DEFAULT_WINDOWS = 8
DEFAULT_ROUNDS = 5
CHILD_ROUNDS = 3
"""Rounds each child process times per configuration (its best counts)."""
CHILD_TIMEOUT_S = 600.0


async def _feed_round(reads: list[bytes], routing: bool) -> float:
    """Seconds to feed ``reads`` through one fresh handler."""
    from headrace.server.lumberjack import LumberjackHandler
    from headrace.server.lumberjack_config import LumberjackConfig
    from headrace.server.lumberjack_target import LumberjackTarget

    config = LumberjackConfig() if routing else LumberjackConfig(routing_key_fields=())
    target = LumberjackTarget(None, config, "bench")  # type: ignore[arg-type]  # never stores
    handler = LumberjackHandler(target, config, "bench")
    windows = 0
    started = time.perf_counter()
    for data in reads:
        for window in handler.feed(data):
            windows += 1
            window.issued.set_result(None)
            handler._windows.clear()  # acked at once: keep memory flat
            handler._pending_bytes = 0
    seconds = time.perf_counter() - started
    if windows == 0:
        raise RuntimeError("no window closed: the benchmark fed nothing useful")
    return seconds


def _v1_window(first: int, compressed: bool) -> bytes:
    """The same events as logstash-forwarder sends them: ``D`` frames of
    ``file``, ``host``, ``offset``, ``line`` (v1), bare or in one ``C`` frame."""
    frames = []
    for i in range(WINDOW_EVENTS):
        event = json.loads(_event(first + i))
        pairs = [
            (b"file", b"/var/log/nginx/access.log"),
            (b"host", event["host"]["name"].encode()),
            (b"offset", str(event["log"]["offset"]).encode()),
            (b"line", event["message"].encode()),
        ]
        body = b"".join(
            struct.pack(">I", len(k)) + k + struct.pack(">I", len(v)) + v for k, v in pairs
        )
        frames.append(b"1D" + struct.pack(">II", i + 1, len(pairs)) + body)
    data = b"".join(frames)
    if compressed:
        packed = zlib.compress(data, COMPRESS_LEVEL)
        data = b"1C" + struct.pack(">I", len(packed)) + packed
    return b"1W" + struct.pack(">I", WINDOW_EVENTS) + data


def _reads(windows: int, compressed: bool, v1: bool = False) -> tuple[list[bytes], int]:
    if v1:
        stream = b"".join(_v1_window(w * WINDOW_EVENTS, compressed) for w in range(windows))
    else:
        stream = b"".join(_window(w * WINDOW_EVENTS, compressed)[0] for w in range(windows))
    return [stream[i : i + READ_BYTES] for i in range(0, len(stream), READ_BYTES)], (
        windows * WINDOW_EVENTS
    )


def _measure(windows: int, rounds: int) -> dict[str, float]:
    """events/s (best of ``rounds``) for bare/compressed, routing on/off, in this process."""
    figures: dict[str, float] = {}
    for compressed in (False, True):
        reads, events = _reads(windows, compressed)
        for routing in (True, False):
            best = min(asyncio.run(_feed_round(reads, routing)) for _ in range(rounds))
            name = f"{'compressed' if compressed else 'bare'}{'' if routing else ' no-routing'}"
            figures[name] = round(events / best)
        reads, events = _reads(windows, compressed, v1=True)
        best = min(asyncio.run(_feed_round(reads, True)) for _ in range(rounds))
        figures[f"v1 D {'compressed' if compressed else 'bare'}"] = round(events / best)
    return figures


def _child(src: str, windows: int, rounds: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=src)
    command = [sys.executable, __file__, "--windows", str(windows), "--rounds", str(rounds)]
    done = subprocess.run(
        [*command, "--json-only"],
        env=env,
        capture_output=True,
        timeout=CHILD_TIMEOUT_S,
        check=True,
        text=True,
    )
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=DEFAULT_WINDOWS)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--baseline", help="another source tree's src/ to compare with")
    parser.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json_only:
        print(json.dumps(_measure(args.windows, args.rounds)))
        return
    here = str(Path(__file__).resolve().parent.parent / "src")
    trees = {"this": here} if args.baseline is None else {"baseline": args.baseline, "this": here}
    best: dict[str, dict[str, float]] = {name: {} for name in trees}
    for _ in range(args.rounds):  # interleaved, so both trees see the same machine load
        for name, src in trees.items():
            for key, value in _child(src, args.windows, CHILD_ROUNDS).items():
                best[name][key] = max(best[name].get(key, 0.0), value)
    for key in best["this"]:
        line = f"{key:>22}: " + "  ".join(f"{name} {best[name][key]:>9,.0f} ev/s" for name in trees)
        if "baseline" in trees:
            line += f"  ratio {best['this'][key] / best['baseline'][key]:.2f}x"
        print(line)
    print(json.dumps({"benchmark": "lumberjack_feed", "windows": args.windows, "best": best}))


if __name__ == "__main__":
    main()
