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
from headrace.protocols.lumberjack import (
    MAX_DECOMPRESSED_BYTES,
    MAX_FRAME_BYTES,
    MAX_WINDOW_COUNT,
)
from headrace.server.app import ServerApp
from headrace.server.config import (
    DEFAULT_AUTO_SCALE_INTERVAL_S,
    DEFAULT_PORTS,
    DEFAULT_RETENTION_INTERVAL_S,
    ServerConfig,
)
from headrace.server.lumberjack_config import (
    DEFAULT_ROUTING_KEY_FIELDS,
    DEFAULT_STREAM,
    IDLE_TIMEOUT_S,
    KEEPALIVE_INTERVAL_S,
    MAX_PENDING_BYTES,
    WINDOW_LINGER_S,
    LumberjackConfig,
)
from headrace.server.tls import TlsConfig
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
        for name, reason in config.inactive_listeners().items():
            click.echo(f"headrace: {name} listener not started: {reason}", err=True)
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
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar="HEADRACE_TLS_CERT",
    help="PEM certificate chain for TLS listeners (with --tls-key).",
)
@click.option(
    "--tls-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar="HEADRACE_TLS_KEY",
    help="PEM private key of --tls-cert.",
)
@click.option(
    "--tls-ca",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar="HEADRACE_TLS_CA",
    help="PEM CA bundle: TLS clients must present a certificate it signed.",
)
@click.option(
    "--lumberjack-stream",
    default=DEFAULT_STREAM,
    envvar="HEADRACE_LUMBERJACK_STREAM",
    help="scope/stream that Lumberjack events go to (created with 4 segments).",
)
@click.option(
    "--lumberjack-routing-key-fields",
    default=",".join(DEFAULT_ROUTING_KEY_FIELDS),
    envvar="HEADRACE_LUMBERJACK_ROUTING_KEY_FIELDS",
    help="Comma-separated event fields tried for the routing key ([a][b] for nested); "
    "empty: no key.",
)
@click.option(
    "--lumberjack-keepalive-interval",
    type=click.FloatRange(min=0.001),
    default=KEEPALIVE_INTERVAL_S,
    envvar="HEADRACE_LUMBERJACK_KEEPALIVE_INTERVAL",
    help="v2: seconds without a write before an Ack(0) keepalive while a window waits.",
)
@click.option(
    "--lumberjack-window-linger",
    type=click.FloatRange(min=0),
    default=WINDOW_LINGER_S,
    envvar="HEADRACE_LUMBERJACK_WINDOW_LINGER",
    help="Seconds an incomplete window may receive nothing before its events so far are "
    "stored (for clients that send W once); 0: store windows only whole.",
)
@click.option(
    "--lumberjack-idle-timeout",
    type=click.FloatRange(min=0.001),
    default=IDLE_TIMEOUT_S,
    envvar="HEADRACE_LUMBERJACK_IDLE_TIMEOUT",
    help="Seconds a Lumberjack connection may send nothing before it is closed.",
)
@click.option(
    "--lumberjack-max-window",
    type=click.IntRange(1, 2**32 - 1),
    default=MAX_WINDOW_COUNT,
    envvar="HEADRACE_LUMBERJACK_MAX_WINDOW",
    help="Largest W (window) count accepted.",
)
@click.option(
    "--lumberjack-max-frame-bytes",
    type=click.IntRange(min=1024),
    default=MAX_FRAME_BYTES,
    envvar="HEADRACE_LUMBERJACK_MAX_FRAME_BYTES",
    help="Largest Lumberjack frame.",
)
@click.option(
    "--retention-interval",
    type=click.FloatRange(min=0.001),
    default=DEFAULT_RETENTION_INTERVAL_S,
    envvar="HEADRACE_RETENTION_INTERVAL",
    help="Seconds between enforcements of stream retention policies.",
)
@click.option(
    "--auto-scale-interval",
    type=click.FloatRange(min=0.001),
    default=DEFAULT_AUTO_SCALE_INTERVAL_S,
    envvar="HEADRACE_AUTO_SCALE_INTERVAL",
    help="Seconds between checks of auto-scaling stream policies.",
)
@click.option(
    "--tank-scope",
    default="tank",
    envvar="HEADRACE_TANK_SCOPE",
    help="Scope whose streams are the TANK topics.",
)
@click.option(
    "--lumberjack-max-decompressed-bytes",
    type=click.IntRange(min=1024),
    default=MAX_DECOMPRESSED_BYTES,
    envvar="HEADRACE_LUMBERJACK_MAX_DECOMPRESSED_BYTES",
    help="Inflated bytes allowed per compressed frame (zlib bombs are refused).",
)
@click.option(
    "--lumberjack-max-pending-bytes",
    type=click.IntRange(min=1024),
    default=MAX_PENDING_BYTES,
    envvar="HEADRACE_LUMBERJACK_MAX_PENDING_BYTES",
    help="Unacknowledged event bytes one Lumberjack connection may hold.",
)
def serve(
    data_dir: Path,
    fsync: str,
    fsync_interval: float,
    host: str,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_ca: Path | None,
    **options: int | float | str,
) -> None:
    """Run the headrace server until SIGTERM or SIGINT."""
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if tls_ca is not None and tls_cert is None:
        raise click.UsageError("--tls-ca needs --tls-cert and --tls-key")
    fields = str(options.pop("lumberjack_routing_key_fields"))
    lumberjack = LumberjackConfig(
        stream=str(options.pop("lumberjack_stream")),
        routing_key_fields=tuple(f.strip() for f in fields.split(",") if f.strip()),
        keepalive_interval_s=float(options.pop("lumberjack_keepalive_interval")),
        window_linger_s=float(options.pop("lumberjack_window_linger")),
        idle_timeout_s=float(options.pop("lumberjack_idle_timeout")),
        max_window_count=int(options.pop("lumberjack_max_window")),
        max_frame_bytes=int(options.pop("lumberjack_max_frame_bytes")),
        max_decompressed_bytes=int(options.pop("lumberjack_max_decompressed_bytes")),
        max_pending_bytes=int(options.pop("lumberjack_max_pending_bytes")),
    )
    config = ServerConfig(
        data_dir=data_dir,
        host=host,
        fsync=FsyncPolicy(fsync),
        fsync_interval_s=fsync_interval,
        tank_scope=str(options.pop("tank_scope")),
        retention_interval_s=float(options.pop("retention_interval")),
        auto_scale_interval_s=float(options.pop("auto_scale_interval")),
        ports={name: int(options[f"{name}_port"]) for name in DEFAULT_PORTS},
        tls=None if tls_cert is None or tls_key is None else TlsConfig(tls_cert, tls_key, tls_ca),
        lumberjack=lumberjack,
    )
    try:
        asyncio.run(_run(config))
    except HeadraceError as exc:
        raise click.ClickException(str(exc)) from exc


for _name, _port in DEFAULT_PORTS.items():
    serve.params.append(_port_option(_name, _port))
