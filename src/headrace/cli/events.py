"""``headrace write``, ``headrace read`` and ``headrace tail``: events in and records out."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO

import click

from headrace.client import Record, Segment

from ._client import controller_option, pravega_client, run, split_stream

if TYPE_CHECKING:
    from click._termui_impl import ProgressBar

__all__ = ["read", "tail", "write"]

PROGRESS_MIN_BYTES = 1024 * 1024
"""Inputs at least this large (known size) get a progress bar on a terminal."""


def _lines(source: BinaryIO) -> Iterator[bytes]:
    for line in source:
        yield line.rstrip(b"\r\n")


@click.command()
@controller_option
@click.argument("name", metavar="SCOPE/STREAM")
@click.argument("file", type=click.File("rb"), default="-")
@click.option("--routing-key", help="Routing key of every event (default: none, spread).")
def write(controller: str, name: str, file: BinaryIO, routing_key: str | None) -> None:
    """Write each line of FILE (default stdin) as one event to SCOPE/STREAM."""
    scope, st = split_stream(name)
    size = _size(file)
    show = size is not None and size >= PROGRESS_MIN_BYTES and sys.stderr.isatty()

    async def go() -> int:
        count = 0
        async with pravega_client(controller) as client:
            writer = await client.create_writer(scope, st)
            try:
                if show:
                    bar: ProgressBar[int]
                    with click.progressbar(length=size, label="writing", file=sys.stderr) as bar:
                        for line in _lines(file):
                            await writer.write(line, routing_key)
                            bar.update(len(line) + 1)
                            count += 1
                else:
                    for line in _lines(file):
                        await writer.write(line, routing_key)
                        count += 1
                await writer.flush()
            finally:
                await writer.aclose()
        return count

    count = run(go())
    click.echo(f"wrote {count} events to {scope}/{st}", err=True)


def _size(file: BinaryIO) -> int | None:
    try:
        return os.fstat(file.fileno()).st_size or None
    except (OSError, ValueError):
        return None


def _format(record: Record, fmt: str) -> bytes:
    if fmt == "raw":
        return record.value + b"\n"
    out: dict[str, object] = {
        "stream": record.stream,
        "segment": record.segment,
        "offset": record.offset,
    }
    if record.index:
        out["index"] = record.index
    if record.key is not None:
        _text_or_b64(record.key, "key", out)
    _text_or_b64(record.value, "value", out)
    if record.timestamp_ms is not None:
        out["timestamp_ms"] = record.timestamp_ms
    return json.dumps(out, ensure_ascii=False).encode() + b"\n"


def _text_or_b64(data: bytes, field: str, out: dict[str, object]) -> None:
    try:
        out[field] = data.decode("utf-8")
    except UnicodeDecodeError:
        out[f"{field}_b64"] = base64.b64encode(data).decode()


def _parse_from(value: str) -> dict[Segment, int] | str:
    if value in ("head", "tail"):
        return value
    start: dict[Segment, int] = {}
    for part in value.split(","):
        name, sep, offset = part.rpartition(":")
        try:
            if not sep:
                raise ValueError("no :OFFSET")
            start[Segment.parse(name)] = int(offset)
        except ValueError as exc:
            raise click.BadParameter(
                f"{part!r}: use head, tail, or SEGMENT:OFFSET[,SEGMENT:OFFSET...] "
                "(e.g. sc/st/0.#epoch.0:1024)",
                param_hint="--from",
            ) from exc
    return start


async def _stream_records(
    controller: str, scope: str, st: str, start: dict[Segment, int] | str, follow: bool,
    limit: int | None, fmt: str,
) -> None:  # fmt: skip
    out = sys.stdout.buffer
    async with pravega_client(controller) as client:
        positions: dict[Segment, int] | None = None
        if start == "tail":
            positions = {
                r.segment: (await client.segments.stat(r.segment)).length
                for r in await client.controller.get_current_segments(scope, st)
            }
        elif isinstance(start, dict):
            positions = start
        count = 0
        async with client.record_reader(scope, st, start=positions, follow=follow) as reader:
            async for record in reader:
                if limit is not None and count >= limit:
                    break
                out.write(_format(record, fmt))
                if follow:
                    out.flush()
                count += 1
            skipped = reader.skipped
    out.flush()
    if skipped:
        click.echo(f"skipped {skipped} events of {scope}/{st} that are not TANK bundles", err=True)


@click.command()
@controller_option
@click.argument("name", metavar="SCOPE/STREAM")
@click.option(
    "--from", "from_", default="head", show_default=True,
    help="head, tail, or SEGMENT:OFFSET[,...] (e.g. sc/st/0.#epoch.0:1024).",
)  # fmt: skip
@click.option(
    "--until", default="now", show_default=True,
    help="now (stop at the tail), never (keep following), or a number of records.",
)  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(["raw", "json"]), default="raw")
def read(controller: str, name: str, from_: str, until: str, fmt: str) -> None:
    """Print the records of SCOPE/STREAM (one line each; any stream, TANK topics unpacked)."""
    scope, st = split_stream(name)
    follow = until == "never"
    limit: int | None = None
    if until not in ("now", "never"):
        try:
            limit = int(until)
            if limit < 0:
                raise ValueError(until)
        except ValueError as exc:
            raise click.BadParameter("now, never, or a number", param_hint="--until") from exc
        follow = True
    run(_stream_records(controller, scope, st, _parse_from(from_), follow, limit, fmt))


@click.command()
@controller_option
@click.argument("name", metavar="SCOPE/STREAM")
@click.option("--format", "fmt", type=click.Choice(["raw", "json"]), default="raw")
def tail(controller: str, name: str, fmt: str) -> None:
    """Print records of SCOPE/STREAM as they are written (from now on; Ctrl-C to stop)."""
    scope, st = split_stream(name)
    with contextlib.suppress(KeyboardInterrupt):
        run(_stream_records(controller, scope, st, "tail", True, None, fmt))
