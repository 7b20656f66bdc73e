"""``headrace stream create|list|info|delete``: stream administration through the client."""

from __future__ import annotations

import json

import click

from headrace.client import RetentionPolicy, ScalingPolicy, StreamConfig
from headrace.client.controller import RetentionType

from ._client import controller_option, pravega_client, run, split_stream

__all__ = ["stream"]


@click.group()
def stream() -> None:
    """Create, list, inspect and delete streams."""


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


@stream.command(name="list")
@controller_option
@click.argument("scope", required=False)
def list_(controller: str, scope: str | None) -> None:
    """List scopes, or the streams of SCOPE."""

    async def go() -> list[str]:
        async with pravega_client(controller) as client:
            if scope is None:
                return [s async for s in client.controller.list_scopes()]
            streams = [s async for s in client.controller.list_streams(scope)]
            if not streams and not await client.controller.scope_exists(scope):
                raise click.ClickException(
                    f"no scope {scope} (see the scopes with: headrace stream list)"
                )
            return streams

    for name in run(go()):
        click.echo(name)


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
