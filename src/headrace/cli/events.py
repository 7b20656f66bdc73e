"""``headrace write``, ``headrace read`` and ``headrace tail``: events in and records out."""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Final

import click

from headrace.client import Record, Segment

from ._client import controller_option, pravega_client, run, split_stream

if TYPE_CHECKING:
    from click._termui_impl import ProgressBar

    from headrace.client import PravegaClient

__all__ = ["read", "tail", "write"]

PROGRESS_MIN_BYTES = 1024 * 1024
"""Inputs at least this large (known size) get a progress bar on a terminal."""


READ_CHUNK_BYTES: Final = 64 * 1024
"""Bytes of input read at a time while splitting it into events."""

MAX_LINE_BYTES: Final = 64 * 1024 * 1024
"""Longest event ``write`` takes from its input: input with no delimiter for this
long is refused, rather than held in memory until it ends."""

_ESCAPES: Final = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\"}
"""Backslash escapes understood in ``--delimiter``, ``--key-separator`` and ``-f``."""


def unescape(value: str) -> str:
    """``\\n``, ``\\t``, ``\\r``, ``\\0`` and ``\\\\`` as the characters they name (as kcat)."""
    out: list[str] = []
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "\\" and i + 1 < len(value) and value[i + 1] in _ESCAPES:
            out.append(_ESCAPES[value[i + 1]])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _events(source: BinaryIO, delimiter: bytes) -> Iterator[bytes]:
    """The pieces of ``source`` between ``delimiter`` s (a trailing one ends the last).

    With the default newline delimiter a ``\\r`` before it is dropped too.
    """
    strip = delimiter == b"\n"
    buf = bytearray()
    read = getattr(source, "read1", source.read)
    while chunk := read(READ_CHUNK_BYTES):
        search = max(0, len(buf) - len(delimiter) + 1)  # a delimiter split between chunks
        buf += chunk
        start = 0
        while (end := buf.find(delimiter, search)) >= 0:
            piece = bytes(buf[start:end])
            yield piece.removesuffix(b"\r") if strip else piece
            start = search = end + len(delimiter)
        del buf[:start]
        if len(buf) > MAX_LINE_BYTES:
            raise click.ClickException(
                f"no delimiter within {MAX_LINE_BYTES} bytes of input (see --delimiter)"
            )
    if buf:
        yield bytes(buf).removesuffix(b"\r") if strip else bytes(buf)


def _split_key(event: bytes, separator: bytes | None) -> tuple[str | None, bytes]:
    if separator is None:
        return None, event
    key, sep, value = event.partition(separator)
    if not sep:
        return None, event
    try:
        return key.decode("utf-8"), value
    except UnicodeDecodeError as exc:
        raise click.ClickException(f"a key is not UTF-8: {key[:40]!r}") from exc


@click.command()
@controller_option
@click.argument("name", metavar="SCOPE/STREAM")
@click.argument("file", type=click.File("rb"), default="-")
@click.option("--routing-key", help="Routing key of every event (default: none, spread).")
@click.option(
    "-K", "--key-separator",
    help="Each event is KEY<SEP>VALUE: the key routes it (events of one key keep "
    "their order); an event without SEP has no key. E.g. -K : or -K '\\t'.",
)  # fmt: skip
@click.option(
    "-D", "--delimiter", default="\\n", show_default=True,
    help="What ends each event in the input (escapes: \\n \\t \\r \\0).",
)  # fmt: skip
def write(
    controller: str,
    name: str,
    file: BinaryIO,
    routing_key: str | None,
    key_separator: str | None,
    delimiter: str,
) -> None:
    """Write each line of FILE (default stdin) as one event to SCOPE/STREAM.

    Pravega events have no headers and do not keep their routing key: a key
    chooses the segment (and so the order) and is not stored.
    """
    scope, st = split_stream(name)
    delim = unescape(delimiter).encode()
    if not delim:
        raise click.BadParameter("must not be empty", param_hint="--delimiter")
    separator = None if key_separator is None else unescape(key_separator).encode()
    if separator == b"":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    if separator is not None and routing_key is not None:
        raise click.UsageError("--routing-key and --key-separator exclude each other")
    size = _size(file)
    show = size is not None and size >= PROGRESS_MIN_BYTES and sys.stderr.isatty()

    async def go() -> int:
        count = 0
        async with pravega_client(controller) as client:
            writer = await client.create_writer(scope, st)
            try:
                bar: ProgressBar[int] | None = None
                with contextlib.ExitStack() as stack:
                    if show:
                        bar = stack.enter_context(
                            click.progressbar(length=size, label="writing", file=sys.stderr)
                        )
                    for event in _events(file, delim):
                        key, value = _split_key(event, separator)
                        await writer.write(value, routing_key if key is None else key)
                        if bar is not None:
                            bar.update(len(event) + len(delim))
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


FORMAT_FIELDS: Final = {
    "t": "stream (scope/stream)",
    "s": "segment (qualified name)",
    "o": "offset of the event in its segment",
    "i": "index of the record in its TANK bundle (0 otherwise)",
    "k": "key (empty when none: Pravega events keep no key)",
    "v": "value",
    "T": "timestamp in ms (-1 when none)",
    "K": "key length in bytes (-1 when none)",
    "S": "value length in bytes",
    "F": "format: event, bundle (a TANK message) or bytes (a byte stream's raw bytes)",
    "%": "a percent sign",
}
"""What each ``%`` letter of a ``read -f`` format string prints (kcat's letters
where they mean the same; ``%s`` is the segment, ``%v`` the value)."""

JSON_FIELDS: Final = (
    "stream", "segment", "offset", "index", "timestamp_ms", "key", "value", "encoding",
    "format",
)  # fmt: skip
"""The keys of every ``read -f json`` line, always all of them, in this order.
``encoding`` is ``utf-8``, or ``base64`` when the key or the value is not
UTF-8 (both are then base64); ``format`` is what the stored bytes were
(``docs/interop.md``)."""


class RecordFormat:
    """How ``read`` prints a record: ``raw`` (the value), ``json``, or a ``%`` string."""

    def __init__(self, spec: str) -> None:
        self.kind = spec if spec in ("raw", "json") else "template"
        self._parts: list[str] = []  # literal text and "%x" fields, alternating freely
        if self.kind != "template":
            return
        text = unescape(spec)
        i = 0
        literal: list[str] = []
        while i < len(text):
            ch = text[i]
            if ch != "%":
                literal.append(ch)
                i += 1
                continue
            if i + 1 >= len(text) or text[i + 1] not in FORMAT_FIELDS:
                letters = " ".join(f"%{k}" for k in FORMAT_FIELDS)
                raise click.BadParameter(
                    f"unknown field {text[i : i + 2]!r} (known: {letters})", param_hint="-f"
                )
            if text[i + 1] == "%":
                literal.append("%")
            else:
                self._parts.append("".join(literal))
                literal = []
                self._parts.append("%" + text[i + 1])
            i += 2
        if not text.endswith(("\n", "\0")):
            literal.append("\n")
        self._parts.append("".join(literal))

    def __call__(self, record: Record) -> bytes:
        if self.kind == "raw":
            return record.value + b"\n"
        if self.kind == "json":
            return _json(record)
        out = bytearray()
        for part in self._parts:
            if part.startswith("%") and len(part) == 2:
                out += _field(record, part[1])
            else:
                out += part.encode()
        return bytes(out)


def _field(record: Record, letter: str) -> bytes:
    match letter:
        case "t":
            return record.stream.encode()
        case "s":
            return record.segment.encode()
        case "o":
            return str(record.offset).encode()
        case "i":
            return str(record.index).encode()
        case "k":
            return record.key or b""
        case "v":
            return record.value
        case "T":
            return str(-1 if record.timestamp_ms is None else record.timestamp_ms).encode()
        case "K":
            return str(-1 if record.key is None else len(record.key)).encode()
        case "F":
            return record.format.encode()
        case _:
            return str(len(record.value)).encode()


def _json(record: Record) -> bytes:
    key, value = record.key, record.value
    try:
        shown_key = None if key is None else key.decode("utf-8")
        shown_value = value.decode("utf-8")
        encoding = "utf-8"
    except UnicodeDecodeError:
        shown_key = None if key is None else base64.b64encode(key).decode()
        shown_value = base64.b64encode(value).decode()
        encoding = "base64"
    out = dict(
        zip(
            JSON_FIELDS,
            (
                record.stream,
                record.segment,
                record.offset,
                record.index,
                record.timestamp_ms,
                shown_key,
                shown_value,
                encoding,
                record.format,
            ),
            strict=True,
        )
    )
    return json.dumps(out, ensure_ascii=False).encode() + b"\n"


_UNITS_MS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_time_ms(value: str, now_ms: int | None = None, *, hint: str = "--since") -> int:
    """``--since``: a duration ago (``90s``, ``15m``, ``2h``, ``1d``), epoch
    milliseconds, or an ISO 8601 time (``2026-01-31T12:00:00Z``; local time
    without a zone) -> epoch milliseconds."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    text = value.strip()
    for unit in sorted(_UNITS_MS, key=len, reverse=True):
        number = text.removesuffix(unit)
        if number != text and number.replace(".", "", 1).isdigit():
            return now - int(float(number) * _UNITS_MS[unit])
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise click.BadParameter(
            "a duration ago (30s, 15m, 2h, 1d), epoch ms, or an ISO time (2026-01-31T12:00:00Z)",
            param_hint=hint,
        ) from exc
    return int(when.timestamp() * 1000)


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


@dataclass(frozen=True, slots=True)
class _Start:
    """Where ``read`` begins: head, tail, given positions, a time, or the last N records;
    and the time it ends at, if any (``--until-time``)."""

    kind: str  # "head", "tail", "at", "since", "last"
    positions: dict[Segment, int] | None = None
    since_ms: int = 0
    last: int = 0
    until_ms: int | None = None


async def _since_positions(
    client: PravegaClient, scope: str, st: str, since_ms: int
) -> dict[Segment, int]:
    """The segments open at ``since_ms``, each from its first event appended at
    or after it (the controller looks it up in the store's time index); a
    segment not written since starts at its end."""
    start = await client.controller.get_segments_at(scope, st, since_ms)
    for segment in list(start):
        stat = await client.segments.stat(segment)
        if stat.last_modified_ms < since_ms:
            start[segment] = max(start[segment], stat.length)
    return start


async def _last_records(
    client: PravegaClient, scope: str, st: str, count: int
) -> tuple[list[Record], dict[Segment, int]]:
    """The last ``count`` records of each segment of the stream's last epoch (its
    open segments; the last sealed ones of a sealed stream), and where each
    segment's reading stopped. Each of those segments is read from its start:
    Pravega events can only be found walking forward."""
    now_ms = int(time.time() * 1000)
    last_epoch = await client.controller.get_segments_at(scope, st, now_ms)
    start = {seg: (await client.segments.stat(seg)).start_offset for seg in last_epoch}
    kept: dict[str, deque[Record]] = {}
    async with client.record_reader(scope, st, start=start) as reader:
        async for record in reader:
            kept.setdefault(record.segment, deque(maxlen=count)).append(record)
        positions = dict(reader.positions)
    records = [r for segment in sorted(kept) for r in kept[segment]]
    return records, positions


async def _stream_records(
    controller: str, scope: str, st: str, start: _Start, follow: bool,
    limit: int | None, fmt: RecordFormat,
) -> None:  # fmt: skip
    out = sys.stdout.buffer
    count = 0
    skipped = 0
    async with pravega_client(controller) as client:
        positions: dict[Segment, int] | None = start.positions
        if start.kind == "tail":
            positions = {
                r.segment: (await client.segments.stat(r.segment)).length
                for r in await client.controller.get_current_segments(scope, st)
            }
        elif start.kind == "since":
            positions = await _since_positions(client, scope, st, start.since_ms)
        elif start.kind == "last":
            records, positions = await _last_records(client, scope, st, start.last)
            for record in records[:limit]:
                out.write(fmt(record))
            count = min(len(records), limit if limit is not None else len(records))
            out.flush()
            if not follow or (limit is not None and count >= limit):
                return
        until: dict[Segment, int] | None = None
        if start.until_ms is not None:  # the cut where the events of that time begin
            until = await client.controller.get_segments_at(scope, st, start.until_ms)
        async with client.record_reader(
            scope, st, start=positions, follow=follow, until=until
        ) as reader:
            async for record in reader:
                if limit is not None and count >= limit:
                    break
                if (
                    start.kind == "since"
                    and (record.timestamp_ms or start.since_ms) < start.since_ms
                ):
                    continue
                out.write(fmt(record))
                if follow:
                    out.flush()
                count += 1
            skipped = reader.skipped
    out.flush()
    if skipped:
        click.echo(f"skipped {skipped} events of {scope}/{st} that are not TANK bundles", err=True)


GROUP_IDLE_S: Final = 1.0
"""``read --group --until now`` ends once no event came for this long: a group
reader cannot see a tail, only that nothing more arrives."""


async def _group_records(
    controller: str, scope: str, st: str, group: str, reader_name: str, follow: bool,
    limit: int | None, fmt: RecordFormat,
) -> None:  # fmt: skip
    """Read as reader ``reader_name`` of group ``group`` (created over the stream
    if new): each event once across the group's readers, positions kept."""
    out = sys.stdout.buffer
    async with pravega_client(controller) as client:
        if not await client.controller.stream_exists(scope, st):
            raise click.ClickException(f"no stream {scope}/{st}")
        rg = await client.reader_group(scope, group, [f"{scope}/{st}"])
        reader = await rg.create_reader(reader_name)
        try:
            count = 0
            while limit is None or count < limit:
                event = await reader.read_next(timeout_s=GROUP_IDLE_S)
                if event is None:
                    if follow:
                        continue
                    break
                record = Record(
                    f"{scope}/{st}", event.segment, event.offset, None, event.data, None
                )
                out.write(fmt(record))
                if follow:
                    out.flush()
                count += 1
        finally:
            await reader.aclose()
    out.flush()


_FORMAT_HELP: Final = (
    "raw (the value), json (one object a line, fields: " + ", ".join(JSON_FIELDS) + "), "
    "or a format string: "
    + ", ".join(f"%{k} {v}" for k, v in FORMAT_FIELDS.items())
    + r"; \n \t \0 escapes; a newline ends each record unless the string ends in \n or \0."
)


@click.command()
@controller_option
@click.argument("name", metavar="SCOPE/STREAM")
@click.option(
    "--from", "from_", default="head", show_default=True,
    help="head, tail, or SEGMENT:OFFSET[,...] (e.g. sc/st/0.#epoch.0:1024).",
)  # fmt: skip
@click.option(
    "--since", metavar="TIME",
    help="Start at TIME: 15m, 2h, 1d ago, epoch ms, or ISO 8601: the first events "
    "appended at or after it (exact to the ms); TANK records whose own time is older "
    "are left out too.",
)  # fmt: skip
@click.option(
    "--until-time", metavar="TIME",
    help="Stop before the events appended at or after TIME (same forms as --since).",
)  # fmt: skip
@click.option(
    "--last", type=click.IntRange(min=1), metavar="N",
    help="Only the last N records of each open segment (kcat's -o -N).",
)  # fmt: skip
@click.option(
    "--until", default="now", show_default=True,
    help="now (stop at the tail), never (keep following), or a number of records.",
)  # fmt: skip
@click.option(
    "-G", "--group", metavar="GROUP",
    help="Read as a reader of reader group GROUP (created if new): each event once "
    "across its readers, and the group remembers where it stopped.",
)  # fmt: skip
@click.option("--reader", help="Reader name within --group (default: HOST-PID).")
@click.option("-f", "--format", "fmt", default="raw", show_default=True, help=_FORMAT_HELP)
def read(
    controller: str, name: str, from_: str, since: str | None, until_time: str | None,
    last: int | None, until: str, group: str | None, reader: str | None, fmt: str,
) -> None:  # fmt: skip
    """Print the records of SCOPE/STREAM (one line each; any stream, TANK topics unpacked).

    \b
    Examples:
      headrace read sc/st -f '%s %o %k %v'
      headrace read sc/st --last 10 --until never
      headrace read sc/st --since 15m -f json
      headrace read sc/st --since 2026-01-31T12:00:00Z --until-time 2026-01-31T13:00:00Z
      headrace read sc/st --group g1 --until 100
    """
    scope, st = split_stream(name)
    formatter = RecordFormat(fmt)
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
    chosen = [flag for flag, given in (("--from", from_ != "head"), ("--since", since),
                                       ("--last", last), ("--group", group)) if given]  # fmt: skip
    if len(chosen) > 1:
        raise click.UsageError(f"{' and '.join(chosen)} exclude each other")
    if reader is not None and group is None:
        raise click.UsageError("--reader needs --group")
    if until_time is not None and (group is not None or follow):
        raise click.UsageError("--until-time ends the read: not with --group or --until")
    until_ms = None if until_time is None else parse_time_ms(until_time, hint="--until-time")
    if group is not None:
        reader_name = reader or f"{socket.gethostname()}-{os.getpid()}"
        run(_group_records(controller, scope, st, group, reader_name, follow, limit, formatter))
        return
    start: _Start
    if since is not None:
        start = _Start("since", since_ms=parse_time_ms(since), until_ms=until_ms)
    elif last is not None:
        start = _Start("last", last=last, until_ms=until_ms)
    else:
        parsed = _parse_from(from_)
        start = (
            _Start(parsed, until_ms=until_ms)
            if isinstance(parsed, str)
            else _Start("at", parsed, until_ms=until_ms)
        )
    run(_stream_records(controller, scope, st, start, follow, limit, formatter))


@click.command()
@controller_option
@click.argument("name", metavar="SCOPE/STREAM")
@click.option("-f", "--format", "fmt", default="raw", show_default=True, help=_FORMAT_HELP)
def tail(controller: str, name: str, fmt: str) -> None:
    """Print records of SCOPE/STREAM as they are written (from now on; Ctrl-C to stop)."""
    scope, st = split_stream(name)
    formatter = RecordFormat(fmt)
    with contextlib.suppress(KeyboardInterrupt):
        run(_stream_records(controller, scope, st, _Start("tail"), True, None, formatter))
