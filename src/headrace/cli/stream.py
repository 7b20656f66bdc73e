"""``headrace stream create|list|info|update|seal|truncate|scale|delete``: stream
administration through the client."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Final

import click

from headrace.client import ReaderGroup, RetentionPolicy, ScalingPolicy, Segment, StreamConfig
from headrace.client.controller import RetentionType, ScalingType
from headrace.client.errors import NoSuchSegmentError

from ._client import controller_option, pravega_client, run, split_stream
from ._count import COUNT_MAX_BYTES, all_segments, count_events
from ._output import echo_json, echo_table, human_bytes, json_option

if TYPE_CHECKING:
    from headrace.client import PravegaClient

__all__ = ["MAX_SCALE_SEGMENTS", "stream"]

MAX_SCALE_SEGMENTS: Final = 1024
"""Most segments ``stream scale`` asks for; more would be a typo, not a plan."""


@click.group()
def stream() -> None:
    """Create, list, inspect, change, seal, truncate, scale and delete streams."""


@stream.command()
@controller_option
@click.argument("name", metavar="SCOPE/STREAM")
@click.option(
    "--segments", type=click.IntRange(min=1), default=1, show_default=True,
    help="Number of segments.",
)  # fmt: skip
@click.option("--tag", "tags", multiple=True, help="A tag (repeatable).")
@click.option("--retention-bytes", type=click.IntRange(min=1), help="Keep about this many bytes.")
@click.option(
    "--retention-ms", type=click.IntRange(min=1), help="Keep about this many milliseconds."
)
def create(
    controller: str,
    name: str,
    segments: int,
    tags: tuple[str, ...],
    retention_bytes: int | None,
    retention_ms: int | None,
) -> None:
    """Create SCOPE/STREAM (and its scope if needed)."""
    scope, st = split_stream(name)
    if retention_bytes is not None and retention_ms is not None:
        raise click.UsageError(
            "--retention-bytes and --retention-ms cannot go together: a stream keeps "
            "data by size or by time; choose one"
        )
    retention = RetentionPolicy()
    if retention_bytes is not None:
        retention = RetentionPolicy(RetentionType.SIZE, retention_bytes)
    elif retention_ms is not None:
        retention = RetentionPolicy(RetentionType.TIME, retention_ms)
    config = StreamConfig(ScalingPolicy.fixed(segments), retention, tags)

    async def go() -> bool:
        async with pravega_client(controller) as client:
            await client.controller.create_scope(scope)
            return await client.controller.create_stream(scope, st, config)

    created = run(go())
    click.echo(f"{'created' if created else 'exists'}: {scope}/{st}")


@dataclass(slots=True)
class _Usage:
    """What ``stream list`` says of one stream."""

    stream: str
    open_segments: int
    bytes: int
    events: int | None


async def _usage(client: PravegaClient, scope: str, st: str) -> _Usage:
    open_segments = len(await client.controller.get_current_segments(scope, st))
    ranges: list[tuple[Segment, int, int]] = []
    for segment in await all_segments(client, scope, st):
        stat = await client.segments.stat(segment)
        if stat.exists:
            ranges.append((segment, stat.start_offset, stat.length))
    size = sum(end - start for _, start, end in ranges)
    events: int | None = None
    if size <= COUNT_MAX_BYTES:
        events = 0
        for segment, start, end in ranges:
            events += await count_events(client, segment, start, end)
    return _Usage(f"{scope}/{st}", open_segments, size, events)


@stream.command(name="list")
@controller_option
@click.argument("scope", required=False)
@click.option("-q", "--names", is_flag=True, help="Only the names, one a line.")
@click.option(
    "-a",
    "--all",
    "show_all",
    is_flag=True,
    help="Also the controller's own streams (_RG<group>, _MARK<stream>).",
)
@json_option
def list_(controller: str, scope: str | None, names: bool, show_all: bool, as_json: bool) -> None:
    """List the streams of SCOPE (default: of every scope) with their sizes.

    BYTES is what the stream holds now (after truncation); EVENTS is counted by
    reading the stream, and left out (-) for one larger than 64 MiB. Streams
    whose names begin with _ (a reader group's state, a stream's watermarks)
    are left out unless --all.
    """

    async def go() -> list[_Usage] | list[str]:
        async with pravega_client(controller) as client:
            if scope is not None and not await client.controller.scope_exists(scope):
                raise click.ClickException(
                    f"no scope {scope} (see the scopes with: headrace scope list)"
                )
            scopes = [scope] if scope else [s async for s in client.controller.list_scopes()]
            found = [(sc, st) for sc in scopes async for st in client.controller.list_streams(sc)]
            if not show_all:
                found = [(sc, st) for sc, st in found if not st.startswith("_")]
            if names:
                return [f"{sc}/{st}" for sc, st in found]
            return [await _usage(client, sc, st) for sc, st in found]

    rows = run(go())
    if names:
        for row in rows:
            click.echo(row)
        return
    usages = [u for u in rows if isinstance(u, _Usage)]
    if as_json:
        echo_json([asdict(u) for u in usages])
        return
    echo_table(
        ["STREAM", "SEGMENTS", "SIZE", "BYTES", "EVENTS"],
        [(u.stream, u.open_segments, human_bytes(u.bytes), u.bytes, u.events) for u in usages],
    )


@stream.command()
@controller_option
@click.argument("name", metavar="SCOPE/STREAM")
def info(controller: str, name: str) -> None:
    """Show a stream's configuration and its open segments (as JSON)."""
    scope, st = split_stream(name)

    async def go() -> dict[str, object]:
        async with pravega_client(controller) as client:
            config = await client.controller.get_stream_config(scope, st)
            segments = []
            for r in await client.controller.get_current_segments(scope, st):
                stat = await client.segments.stat(r.segment)
                segments.append(
                    {
                        "segment": r.segment.name,
                        "key_range": [r.min_key, r.max_key],
                        "start_offset": stat.start_offset,
                        "length": stat.length,
                    }
                )
            return {
                "stream": f"{scope}/{st}",
                "segments_min": config.scaling.min_num_segments,
                "retention": {
                    "type": config.retention.retention_type.name,
                    "param": config.retention.retention_param,
                },
                "tags": list(config.tags),
                "sealed": not segments,
                "open_segments": segments,
            }

    click.echo(json.dumps(run(go()), indent=2))


@stream.command()
@controller_option
@click.argument("name", metavar="SCOPE/STREAM")
def delete(controller: str, name: str) -> None:
    """Seal SCOPE/STREAM, then delete it."""
    scope, st = split_stream(name)

    async def go() -> bool:
        async with pravega_client(controller) as client:
            if not await client.controller.stream_exists(scope, st):
                return False
            await client.controller.seal_stream(scope, st)
            return await client.controller.delete_stream(scope, st)

    if not run(go()):
        raise click.ClickException(f"no stream {scope}/{st}")
    click.echo(f"deleted: {scope}/{st}")


@stream.command()
@controller_option
@click.argument("name", metavar="SCOPE/STREAM")
def seal(controller: str, name: str) -> None:
    """Seal SCOPE/STREAM: writes fail from now on, readers reach its end."""
    scope, st = split_stream(name)

    async def go() -> None:
        async with pravega_client(controller) as client:
            await client.controller.seal_stream(scope, st)

    run(go())
    click.echo(f"sealed: {scope}/{st}")


def _parse_cut(value: str) -> dict[Segment, int]:
    cut: dict[Segment, int] = {}
    for part in value.split(","):
        name, sep, offset = part.rpartition(":")
        if not sep or not offset.isdigit():
            raise click.BadParameter("tail, or SEGMENT:OFFSET[,SEGMENT:OFFSET...]")
        try:
            cut[Segment.parse(name)] = int(offset)
        except ValueError as exc:
            raise click.BadParameter(f"not a segment name: {name!r}") from exc
    return cut


@stream.command()
@controller_option
@click.argument("name", metavar="SCOPE/STREAM")
@click.argument("cut", required=False)
@click.option(
    "--group", metavar="GROUP",
    help="Truncate what reader group GROUP (of the same scope) has read.",
)  # fmt: skip
def truncate(controller: str, name: str, cut: str | None, group: str | None) -> None:
    """Drop the data of SCOPE/STREAM before CUT.

    CUT is ``tail`` (everything written so far) or SEGMENT:OFFSET[,...] naming an
    offset in every open segment (as ``read -f '%s:%o'`` prints them); or give
    --group to drop what that reader group has read.

    \b
    Examples:
      headrace stream truncate sc/st tail
      headrace stream truncate sc/st sc/st/0.#epoch.0:1024,sc/st/1.#epoch.0:0
      headrace stream truncate sc/st --group g1
    """
    scope, st = split_stream(name)
    if (cut is None) == (group is None):
        raise click.UsageError("give CUT or --group (one of them)")
    given = None if cut in (None, "tail") else _parse_cut(cut)

    async def go() -> dict[int, int]:
        async with pravega_client(controller) as client:
            if group is not None:
                try:
                    state = await ReaderGroup(client, scope, group).state()
                except NoSuchSegmentError:
                    state = {}
                if not state:
                    raise click.ClickException(f"no reader group {scope}/{group}")
                points = {
                    Segment.parse(k.removeprefix("segment/")): v["offset"]
                    for k, (v, _) in state.items()
                    if k.startswith("segment/") and not v["done"]
                }
                chosen = {
                    s.segment_id: o for s, o in points.items() if (s.scope, s.stream) == (scope, st)
                }
                if not chosen:
                    raise click.ClickException(
                        f"reader group {scope}/{group} holds no position in {scope}/{st}"
                    )
            elif given is None:
                chosen = {
                    r.segment.segment_id: (await client.segments.stat(r.segment)).length
                    for r in await client.controller.get_current_segments(scope, st)
                }
                if not chosen:
                    raise click.ClickException(f"{scope}/{st} is sealed: give SEGMENT:OFFSET")
            else:
                chosen = {s.segment_id: o for s, o in given.items()}
            await client.controller.truncate_stream(scope, st, chosen)
            return chosen

    chosen = run(go())
    at = ", ".join(f"{Segment(scope, st, sid).name}:{off}" for sid, off in sorted(chosen.items()))
    click.echo(f"truncated: {scope}/{st} at {at}")


@stream.command()
@controller_option
@click.argument("name", metavar="SCOPE/STREAM")
@click.option(
    "--segments", type=click.IntRange(1, MAX_SCALE_SEGMENTS), required=True,
    help="Number of segments after scaling (equal key ranges).",
)  # fmt: skip
def scale(controller: str, name: str, segments: int) -> None:
    """Replace the open segments of SCOPE/STREAM by SEGMENTS new ones.

    Writers move to the new segments; readers finish the old ones first, so
    the events of one routing key stay in order. A stream with a fixed number
    of segments keeps the new number.
    """
    scope, st = split_stream(name)
    ranges = [(i / segments, (i + 1) / segments) for i in range(segments)]

    async def go() -> list[str]:
        async with pravega_client(controller) as client:
            current = await client.controller.get_current_segments(scope, st)
            if not current:
                raise click.ClickException(f"{scope}/{st} is sealed: nothing to scale")
            new = await client.controller.scale_stream(
                scope, st, [r.segment.segment_id for r in current], ranges
            )
            config = await client.controller.get_stream_config(scope, st)
            if config.scaling.scale_type == ScalingType.FIXED_NUM_SEGMENTS:
                # A fixed policy is the count the controller keeps: make it this one,
                # or the next ``stream update`` would scale the stream back.
                scaling = replace(config.scaling, min_num_segments=segments)
                await client.controller.update_stream(scope, st, replace(config, scaling=scaling))
            return [r.segment.name for r in new]

    names = run(go())
    click.echo(f"scaled: {scope}/{st} to {len(names)} segments ({', '.join(names)})")


@stream.command()
@controller_option
@click.argument("name", metavar="SCOPE/STREAM")
@click.option("--tag", "tags", multiple=True, help="Replace the tags by these (repeatable).")
@click.option("--no-tags", is_flag=True, help="Remove every tag.")
@click.option("--retention-bytes", type=click.IntRange(min=0), help="Keep about this many bytes.")
@click.option("--retention-ms", type=click.IntRange(min=0), help="Keep about this many ms.")
@click.option("--no-retention", is_flag=True, help="Keep everything.")
def update(
    controller: str,
    name: str,
    tags: tuple[str, ...],
    no_tags: bool,
    retention_bytes: int | None,
    retention_ms: int | None,
    no_retention: bool,
) -> None:
    """Change the tags or the retention of SCOPE/STREAM (what is not given stays)."""
    scope, st = split_stream(name)
    retentions = [
        flag
        for flag, given in (
            ("--retention-bytes", retention_bytes is not None),
            ("--retention-ms", retention_ms is not None),
            ("--no-retention", no_retention),
        )
        if given
    ]
    if len(retentions) > 1:
        raise click.UsageError(f"{' and '.join(retentions)} exclude each other")
    if tags and no_tags:
        raise click.UsageError("--tag and --no-tags exclude each other")
    if not (retentions or tags or no_tags):
        raise click.UsageError("nothing to change (see --help)")

    async def go() -> StreamConfig:
        async with pravega_client(controller) as client:
            config = await client.controller.get_stream_config(scope, st)
            retention = config.retention
            if retention_bytes is not None:
                retention = RetentionPolicy(RetentionType.SIZE, retention_bytes)
            elif retention_ms is not None:
                retention = RetentionPolicy(RetentionType.TIME, retention_ms)
            elif no_retention:
                retention = RetentionPolicy()
            new_tags = () if no_tags else (tags or config.tags)
            config = replace(config, retention=retention, tags=tuple(new_tags))
            await client.controller.update_stream(scope, st, config)
            return config

    config = run(go())
    shown = config.retention.retention_type.name.lower()
    if config.retention.retention_type != RetentionType.UNKNOWN:
        shown += f" {config.retention.retention_param}"
    else:
        shown = "none"
    click.echo(
        f"updated: {scope}/{st} (retention {shown}; tags {', '.join(config.tags) or 'none'})"
    )
