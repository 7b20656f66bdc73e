"""``headrace group list|describe|delete``: reader groups, where each stands in
each segment, and how far behind the tail it is (``kafka-consumer-groups``
style).

A group's state is the table its readers keep (``client/reader.py``): per
segment the offset read up to, the owning reader and whether it was read to
its sealed end; per reader its last heartbeat. Lag is, per segment, the bytes
from that offset to the segment's length now, and the events in them (counted
by reading them, up to ``COUNT_MAX_BYTES`` in all); segments that follow the
group's segments (after a scale) and that it has not reached yet count whole.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import click

from headrace.client import ReaderGroup, Segment
from headrace.client.errors import NoSuchSegmentError
from headrace.client.reader import list_groups

from ._client import controller_option, pravega_client, run, split_stream
from ._count import COUNT_MAX_BYTES, all_segments, count_events
from ._output import echo_json, echo_table, json_option

if TYPE_CHECKING:
    from headrace.client import PravegaClient

__all__ = ["describe_group", "group", "split_group"]


def split_group(value: str) -> tuple[str, str]:
    """``scope/group`` -> ``(scope, group)``."""
    try:
        return split_stream(value)
    except click.BadParameter as exc:
        raise click.BadParameter(f"expected SCOPE/GROUP, got {value!r}") from exc


@dataclass(slots=True)
class SegmentLag:
    """One segment of a group: where the group stands in it and what is left."""

    segment: str
    owner: str | None
    position: int
    tail: int
    done: bool
    lag_bytes: int
    lag_events: int | None = None


@dataclass(slots=True)
class GroupLag:
    """A group's positions and lag (``group describe``'s answer)."""

    group: str
    streams: list[str]
    readers: list[dict[str, Any]]
    segments: list[SegmentLag] = field(default_factory=list)
    lag_bytes: int = 0
    lag_events: int | None = 0


async def describe_group(
    client: PravegaClient, scope: str, name: str, *, count: bool = True
) -> GroupLag | None:
    """The positions and lag of group ``scope/name``; None if there is no such group."""
    try:
        state = await ReaderGroup(client, scope, name).state()
    except NoSuchSegmentError:
        return None
    if "config" not in state:
        return None
    config, _ = state["config"]
    now = int(time.time() * 1000)
    readers = [
        {"reader": k.removeprefix("reader/"), "seen_ms_ago": max(0, now - v["seen_ms"])}
        for k, (v, _) in sorted(state.items())
        if k.startswith("reader/")
    ]
    lag = GroupLag(f"{scope}/{name}", list(config.get("streams", [])), readers)
    known: dict[Segment, dict[str, Any]] = {
        Segment.parse(k.removeprefix("segment/")): v
        for k, (v, _) in state.items()
        if k.startswith("segment/")
    }
    ahead: list[Segment] = []  # segments the group will reach after a scale
    for qualified in lag.streams:
        sc, st = qualified.split("/", 1)
        epochs = [s.epoch for s in known if (s.scope, s.stream) == (sc, st)]
        newest = max(epochs, default=-1)
        ahead.extend(
            s for s in await all_segments(client, sc, st) if s.epoch > newest and s not in known
        )
    ranges: list[tuple[SegmentLag, Segment, int]] = []
    for segment, v in sorted(known.items(), key=lambda kv: kv[0].name):
        stat = await client.segments.stat(segment)
        position = int(v["offset"])
        start = max(position, stat.start_offset) if stat.exists else position
        tail = stat.length if stat.exists else position
        behind = 0 if v["done"] else max(0, tail - start)
        row = SegmentLag(segment.name, v["owner"], position, tail, bool(v["done"]), behind)
        lag.segments.append(row)
        ranges.append((row, segment, start))
    for segment in ahead:
        stat = await client.segments.stat(segment)
        if not stat.exists:
            continue
        row = SegmentLag(
            segment.name, None, stat.start_offset, stat.length, False,
            stat.length - stat.start_offset,
        )  # fmt: skip
        lag.segments.append(row)
        ranges.append((row, segment, stat.start_offset))
    lag.lag_bytes = sum(r.lag_bytes for r in lag.segments)
    if count and lag.lag_bytes <= COUNT_MAX_BYTES:
        for row, segment, start in ranges:
            row.lag_events = (
                await count_events(client, segment, start, row.tail) if row.lag_bytes else 0
            )
        lag.lag_events = sum(r.lag_events or 0 for r in lag.segments)
    else:
        lag.lag_events = None
    return lag


@click.group()
def group() -> None:
    """List, inspect and delete reader groups."""


@group.command(name="list")
@controller_option
@click.argument("scope")
@click.option("-q", "--names", is_flag=True, help="Only the names, one a line.")
@json_option
def list_(controller: str, scope: str, names: bool, as_json: bool) -> None:
    """List the reader groups of SCOPE with their streams, readers and lag in bytes."""

    async def go() -> list[GroupLag]:
        async with pravega_client(controller) as client:
            found = await list_groups(client, scope)
            if names:
                return [GroupLag(f"{scope}/{g}", s, []) for g, s in sorted(found.items())]
            out = []
            for name in sorted(found):
                lag = await describe_group(client, scope, name, count=False)
                if lag is not None:
                    out.append(lag)
            return out

    groups = run(go())
    if names:
        for g in groups:
            click.echo(g.group)
    elif as_json:
        echo_json(
            [
                {
                    "group": g.group,
                    "streams": g.streams,
                    "readers": len(g.readers),
                    "lag_bytes": g.lag_bytes,
                }
                for g in groups
            ]
        )
    else:
        echo_table(
            ["GROUP", "STREAMS", "READERS", "LAG BYTES"],
            [(g.group, ",".join(g.streams), len(g.readers), g.lag_bytes) for g in groups],
        )


@group.command()
@controller_option
@click.argument("name", metavar="SCOPE/GROUP")
@json_option
def describe(controller: str, name: str, as_json: bool) -> None:
    """Show where reader group SCOPE/GROUP stands in each segment, and its lag.

    LAG is events behind the segment's tail now (and bytes): counted by reading
    them, and left out (-) when more than 64 MiB are behind.
    """
    scope, gname = split_group(name)

    async def go() -> GroupLag | None:
        async with pravega_client(controller) as client:
            return await describe_group(client, scope, gname)

    lag = run(go())
    if lag is None:
        raise click.ClickException(f"no reader group {scope}/{gname}")
    if as_json:
        echo_json(asdict(lag))
        return
    click.echo(f"group {lag.group} on {', '.join(lag.streams)}")
    if lag.readers:
        seen = ", ".join(f"{r['reader']} ({r['seen_ms_ago'] / 1000:.0f}s ago)" for r in lag.readers)
        click.echo(f"readers: {seen}")
    else:
        click.echo("readers: none")
    echo_table(
        ["SEGMENT", "OWNER", "POSITION", "TAIL", "LAG", "LAG BYTES"],
        [
            (
                s.segment,
                s.owner,
                s.position,
                s.tail,
                "done" if s.done else s.lag_events,
                s.lag_bytes,
            )
            for s in lag.segments
        ],
    )
    events = "-" if lag.lag_events is None else lag.lag_events
    click.echo(f"lag: {events} events, {lag.lag_bytes} bytes")


@group.command()
@controller_option
@click.argument("name", metavar="SCOPE/GROUP")
def delete(controller: str, name: str) -> None:
    """Delete reader group SCOPE/GROUP (its positions are lost; its streams stay)."""
    scope, gname = split_group(name)

    async def go() -> bool:
        async with pravega_client(controller) as client:
            return await ReaderGroup(client, scope, gname).delete()

    if not run(go()):
        raise click.ClickException(f"no reader group {scope}/{gname}")
    click.echo(f"deleted: {scope}/{gname}")
