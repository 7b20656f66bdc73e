"""The demo's log shipper: a process of its own, as a Beat is.

``python -m headrace.cli._shipper FILE`` reads the lines of ``FILE`` (one
event a line), prints ``ready``, then waits for the Lumberjack port of the
server on 127.0.0.1 on its standard input (an empty line or end of input:
nothing to do). It ships the lines with ``ship_lumberjack``, printing the
size of each acknowledged window, then ``done N`` with the events acknowledged.
A failure is one line on standard error and exit status 1.

Its own process keeps the encoding of the frames off the demo's process,
whose one event-loop thread serves the Lumberjack door and Spark's reads.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from headrace.cli.demo import ship_lumberjack

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Run the shipper on ``argv[0]``; returns the exit status."""
    lines = Path(argv[0]).read_text(encoding="utf-8").split("\n")
    out = sys.stdout
    print("ready", file=out, flush=True)
    port = sys.stdin.readline().strip()
    if not port:
        return 0

    def progress(n: int) -> None:
        out.write(f"{n}\n")
        out.flush()

    try:
        acked = asyncio.run(ship_lumberjack("127.0.0.1", int(port), lines, progress))
    except click.ClickException as exc:
        print(exc.format_message(), file=sys.stderr, flush=True)
        return 1
    except (OSError, TimeoutError, ValueError) as exc:
        print(f"shipping failed: {exc!r}", file=sys.stderr, flush=True)
        return 1
    print(f"done {acked}", file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
