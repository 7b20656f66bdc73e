"""``headrace serve``: run the server until SIGTERM or SIGINT.

Every option can also come from a ``HEADRACE_*`` environment variable (the
flag wins). The port flags are stable; 0 disables a listener.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import click

from headrace.errors import HeadraceError
from headrace.server.app import ServerApp
from headrace.server.config import DEFAULT_PORTS, ServerConfig
from headrace.store.api import FsyncPolicy

__all__ = ["serve"]


def _port_option(name: str, default: int) -> click.Option:
    flag = f"--{name.replace('_', '-')}-port"
    return click.Option(
        [flag, f"{name}_port"],
        type=click.IntRange(0, 65535),
        default=default,
        show_default=True,
        envvar=f"HEADRACE_{name.upper()}_PORT",
        help=f"Port of the {name.replace('_', ' ')} listener (0 disables it).",
    )


async def _run(config: ServerConfig) -> None:
    app = ServerApp(config)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, app.request_stop)
    try:
        await app.start()
        ports = ", ".join(f"{name}={port}" for name, port in app.ports.items()) or "none yet"
        click.echo(f"headrace ready: data in {config.data_dir}, listeners: {ports}", err=True)
        await app.serve_until_stopped()
        click.echo("headrace stopping: finishing in-flight appends", err=True)
    finally:
        await app.aclose()
    click.echo("headrace stopped", err=True)


@click.command(context_settings={"show_default": True})
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("headrace-data"),
    envvar="HEADRACE_DATA_DIR",
    help="Directory holding all stored data.",
)
@click.option(
    "--fsync",
    type=click.Choice([p.value for p in FsyncPolicy]),
    default=FsyncPolicy.ALWAYS.value,
    envvar="HEADRACE_FSYNC",
    help="always: ack after fsync (group commit); interval: fsync every --fsync-interval; "
    "never: leave it to the OS.",
)
@click.option(
    "--fsync-interval",
    type=click.FloatRange(min=0.001),
    default=1.0,
    envvar="HEADRACE_FSYNC_INTERVAL",
    help="Seconds between fsyncs under --fsync interval.",
)
@click.option("--host", default="127.0.0.1", envvar="HEADRACE_HOST", help="Address to listen on.")
def serve(data_dir: Path, fsync: str, fsync_interval: float, host: str, **ports: int) -> None:
    """Run the headrace server until SIGTERM or SIGINT."""
    config = ServerConfig(
        data_dir=data_dir,
        host=host,
        fsync=FsyncPolicy(fsync),
        fsync_interval_s=fsync_interval,
        ports={name: ports[f"{name}_port"] for name in DEFAULT_PORTS},
    )
    try:
        asyncio.run(_run(config))
    except HeadraceError as exc:
        raise click.ClickException(str(exc)) from exc


for _name, _port in DEFAULT_PORTS.items():
    serve.params.append(_port_option(_name, _port))
