"""``headrace serve``: run the server until SIGTERM or SIGINT.

Every flag comes from one table, ``headrace.server.config.OPTIONS``: each
option can be set in a TOML file (``--config FILE``, keys as in the table),
by a ``HEADRACE_*`` environment variable, or by its flag, in that order of
increasing priority. The port flags are stable; 0 disables a listener.
``docs/configuration.md`` is generated from the same table (``render_docs``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import tomllib
from pathlib import Path
from typing import Any

import click

from headrace.errors import ConfigError, HeadraceError
from headrace.server.config import OPTIONS, Option, ServerConfig, build_config

__all__ = ["render_docs", "serve"]


async def _run(config: ServerConfig) -> None:
    from headrace.server.app import ServerApp

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


def _click_type(option: Option) -> click.ParamType[Any, Any]:
    if option.choices:
        return click.Choice(option.choices)
    if option.kind is Path:
        if option.existing_file:
            return click.Path(exists=True, dir_okay=False, path_type=Path)
        return click.Path(file_okay=False, path_type=Path)
    if option.kind is int:
        return click.IntRange(
            None if option.minimum is None else int(option.minimum),
            None if option.maximum is None else int(option.maximum),
        )
    if option.kind is float:
        return click.FloatRange(option.minimum, option.maximum)
    return click.STRING


def _click_option(option: Option) -> click.Option:
    if option.multiple:
        return click.Option(
            [option.flag, option.key],
            type=click.STRING,
            multiple=True,
            envvar=option.envvar,
            show_envvar=True,
            help=option.help,
        )
    return click.Option(
        [option.flag, *option.aliases, option.key],
        type=_click_type(option),
        default=option.default,
        show_default=option.default is not None,
        envvar=option.envvar,
        show_envvar=True,
        help=option.help,
    )


def _load_toml(ctx: click.Context, param: click.Parameter, path: Path | None) -> Path | None:
    """Read the ``--config`` file into the context's default map (below env and flags)."""
    if path is None:
        return None
    try:
        with path.open("rb") as file:
            table = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", ctx, param) from exc
    known = {option.key: option for option in OPTIONS}
    values: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in known:
            raise click.BadParameter(f"{path}: unknown option {key!r}", ctx, param)
        if known[name].multiple and isinstance(value, str):
            value = [value]
        if known[name].multiple and isinstance(value, list):
            if not all(isinstance(item, str) for item in value):
                raise click.BadParameter(
                    f"{path}: {key} ({known[name].flag}) takes strings", ctx, param
                )
            values[name] = tuple(value)
            continue
        if isinstance(value, dict | list):
            raise click.BadParameter(
                f"{path}: {key} ({known[name].flag}) takes a single value", ctx, param
            )
        values[name] = str(value) if isinstance(value, bool) else value
    ctx.default_map = {**(ctx.default_map or {}), **values}
    return path


@click.command(context_settings={"show_default": True, "max_content_width": 100})
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar="HEADRACE_CONFIG",
    show_envvar=True,
    is_eager=True,
    expose_value=False,
    callback=_load_toml,
    help="TOML file of options (keys as the flags without dashes, e.g. tank_port = 0); "
    "environment variables and flags override it.",
)
def serve(**values: Any) -> None:
    """Run the headrace server until SIGTERM or SIGINT.

    Options are read from the --config TOML file, then HEADRACE_* environment
    variables, then flags (later ones win). Every option is described in
    docs/configuration.md.
    """
    try:
        config = build_config(values)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    _check_data_dir(config.data_dir)
    from headrace.cli._logging import configure_logging

    configure_logging(logging.getLogger().level, config.log_format, access=True)
    try:
        asyncio.run(_run(config))
    except HeadraceError as exc:
        raise click.ClickException(str(exc)) from exc


def _check_data_dir(path: Path) -> None:
    """Refuse, in one line, a data dir that cannot be created or written.

    Only looks (the store creates the directory, with its own modes): the
    directory itself if it exists, else its nearest existing parent.

    Raises:
        click.ClickException: not a directory, or no write access.
    """
    fix = "choose another --data-dir (or HEADRACE_DATA_DIR)"
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise click.ClickException(
            f"cannot create the data dir {path}: {existing} is not a directory; {fix}"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "write to the data dir" if existing == path.absolute() else "create the data dir"
        raise click.ClickException(
            f"cannot {what} {path}: no write permission on {existing}; {fix}, "
            "or give this user write access to it"
        )


serve.params.extend(_click_option(option) for option in OPTIONS)


def render_docs() -> str:
    """``docs/configuration.md``, generated from ``OPTIONS``."""
    lines = [
        "# Configuration",
        "",
        "<!-- Generated from headrace.server.config.OPTIONS by "
        "`python -m headrace.cli.serve`; tests/ops/test_config_docs.py keeps it current. -->",
        "",
        "`headrace serve` takes every option from three places; a later one wins:",
        "",
        "1. a TOML file named by `--config FILE` (or `HEADRACE_CONFIG`), one key per",
        "   option (the key column below), e.g. `tank_port = 0`;",
        "2. the option's `HEADRACE_*` environment variable;",
        "3. the option's flag.",
        "",
        "A value out of range stops the server before it starts, with a message",
        "naming the option. A port of 0 disables that listener.",
        "",
        "```toml",
        "# headrace.toml",
        'data_dir = "/var/lib/headrace"',
        'host = "0.0.0.0"',
        "tank_port = 0          # no TANK listener",
        'listener = ["lumberjack=tls://0.0.0.0:5045", "rsio=plain://10.0.0.5:7070"]',
        'log_format = "json"',
        "max_connections = 1024",
        "```",
        "",
    ]
    sections: dict[str, list[Option]] = {}
    for option in OPTIONS:
        sections.setdefault(option.section, []).append(option)
    notes = {
        "Limits": [
            "Every TCP front door runs under these (the gRPC controller has gRPC's own).",
            "Each is a named constant with its reason in `headrace/server/_loop.py`",
            "(`ConnectionLimits`; the server-wide budget in `headrace/server/_budget.py`).",
            "A connection past a limit is closed and logged; its",
            "access line and `headrace_errors_total` say which limit. Protocols keep",
            "their own, tighter frame limits (see `docs/protocols/`).",
            "",
        ],
        "TLS": [
            "With `--tls-cert` and `--tls-key`, every port flag's listener serves TLS on its",
            "own port (the controller's gRPC, the segment store, TANK, RS-IO and HTTP);",
            "Lumberjack keeps its plain port beside the TLS one (`--lumberjack-tls-port`).",
            "A `--listener` says plain or TLS for itself (see Listeners). With",
            "`--tls-ca` as well, every TLS client must present a certificate signed by",
            "that CA (`--tls-verify-client optional`: may present one; Pravega clients",
            "cannot). With auth on, the names on a client certificate can identify a user",
            "of the password file. Clients check the server name against the certificate,",
            "so set `--advertise-host` to a DNS name on the certificate when `--host` is an",
            "address. See `docs/security.md`.",
            "",
        ],
    }
    notes["Listeners"] = [
        '<a id="listeners"></a>',
        "",
        "Each front door (a door: `controller`, `segment-store`, `tank`, `lumberjack`,",
        "`rsio`, `http`) listens where its port flag says, on `--host`, or where its",
        "`--listener DOOR=SCHEME://HOST:PORT` entries say: SCHEME `plain` or `tls`, and as",
        "many per door as wanted, each on its own address. A door named by `--listener`",
        "is served only by its entries (a port flag of 0 or its default beside it is",
        "ignored; another value is refused). For example TANK plain for its C++ client",
        "and Lumberjack over TLS for Beats:",
        "",
        "```sh",
        "headrace serve --tls-cert server.pem --tls-key server.key \\",
        "    --listener tank=plain://127.0.0.1:11011 --listener lumberjack=tls://0.0.0.0:5045",
        "```",
        "",
        "A door's first listener has the door's name (`segment_store`), its later ones",
        "`segment_store_2`, `segment_store_3`... in the ready line, `/health`, the access",
        "lines, the metrics' labels and `--auth-trust-unauthenticated`. A Pravega client",
        "is handed by `getURI` the first segment-store listener of the scheme of the",
        "controller listener it called, at that listener's `?advertise=` host, else",
        "`--advertise-host`, else the host it binds (a TLS client checks that name",
        "against the certificate). With `--cluster`, a node announces each door's",
        "first listener (see `cluster.md`). Two listeners on one port of a common",
        "address, an unknown door or scheme, and `tls` without `--tls-cert` stop the",
        "start. See `security.md`.",
        "",
    ]
    notes["HTTP"] = [
        "The HTTP port (`--http-port`) parses requests with `h11` and WebSockets with",
        "`wsproto`. A client gets `--http-header-timeout` from its connection, or from",
        "its previous response, to send a whole request (heads up to 16 KiB, bodies up",
        "to 64 KiB, read and thrown away; larger ones get 431 and 413); then the",
        "connection is closed, so half-sent requests and idle keep-alives give their",
        "`--max-connections` slot back; past half the slots waiting for a request, the",
        "longest-waiting connection is closed. `Connection: close` is honoured. A WebSocket",
        "upgrade on `/rsio` from a web page (it has an `Origin` header) is refused with",
        "403 unless the page is the server's own origin or listed in",
        "`--http-allowed-origins`; see `threat-model.md`.",
        "",
    ]
    notes["Auth"] = [
        "With `--auth-password-file`, every front door checks who its client is and",
        "that user's grants (`prn::` resources with READ or READ_UPDATE) before it",
        "reads or writes a stream. The controller checks Basic credentials on every",
        "call and signs delegation tokens (key: `auth-token.key` in the data directory,",
        "created at the first start, mode 0600); the segment store accepts only",
        "requests whose token covers their stream. TANK and Lumberjack clients are",
        "known by their TLS client certificate (a `cert:` name of a user in the",
        "password file: `headrace user add NAME --cert CN=NAME`); RS-IO clients (TCP",
        "and `/rsio`) by certificate or by logging in with Basic credentials or a",
        "delegation token (the `auth` extension, `docs/protocols/rsio.md`). A door",
        "that cannot tell who its client is refuses it, in the protocol's own terms,",
        "unless `--auth-trust-unauthenticated` names its listener. `/health` and",
        "`/metrics` stay open. Manage users with `headrace user add|remove|list",
        "--file F`. See `threat-model.md` and `security.md`.",
        "",
    ]
    notes["Cluster"] = [
        "With `--cluster`, several `headrace serve` nodes share one ZooKeeper ensemble",
        "and act as one service: the segment containers are spread over the live nodes,",
        "one owner each, and moved one at a time as nodes join, leave or are drained.",
        "The first node creates the cluster and fixes its container count. Each node",
        "needs a `--node-id` of its own that stays the same across restarts. See",
        "`cluster.md`.",
        "",
    ]
    for section, options in sections.items():
        lines += [f"## {section}", "", *notes.get(section, [])]
        lines += ["| key | flag | environment | default | meaning |"]
        lines += ["|---|---|---|---|---|"]
        for option in options:
            default = "—" if option.default in (None, "") else f"`{option.default}`"
            meaning = option.help.replace("|", "\\|")
            if option.multiple:
                meaning += " Repeatable (TOML: a list; environment: separated by spaces)."
            if option.choices:
                meaning += " One of: " + ", ".join(f"`{c}`" for c in option.choices) + "."
            elif option.minimum is not None and option.maximum is not None:
                meaning += f" Range: {option.minimum:g} to {option.maximum:g}."
            elif option.minimum is not None:
                meaning += f" At least {option.minimum:g}."
            lines.append(
                f"| `{option.key}` | `{option.flag}` | `{option.envvar}` | {default} | {meaning} |"
            )
        lines.append("")
    lines += [
        "## Observability",
        "",
        "The HTTP listener (`--http-port`, default 9100) serves `/health` (200 with a",
        "JSON body when every configured listener is up and the store takes writes, 503",
        "otherwise; `store` in the body says why the store stopped; with `--cluster`,",
        "`cluster` gives the node's view: its id, the leader, the live nodes and the",
        "containers it serves) and `/metrics`",
        "(Prometheus text format). `headrace status --http-port PORT` prints a summary",
        "of a running server from them.",
        "",
        "| metric | type | labels | meaning |",
        "|---|---|---|---|",
    ]
    from headrace.server.metrics import METRIC_DOCS

    for name, kind, labels, meaning in METRIC_DOCS:
        lines.append(f"| `{name}` | {kind} | {labels or '—'} | {meaning} |")
    lines += [
        "",
        "Logs go to stderr, as text or JSON lines (`--log-format json`). Each closed",
        "connection of a TCP front door logs one `headrace.access` line with its",
        "protocol, peer, requests, bytes each way, duration and the reason it closed",
        "(`eof`, `idle`, `protocol_error`, `handler_error`, `frame_too_large`,",
        "`partial_frame_timeout`, `not_reading`, `refused`, `tls_failed`, `access_denied`,",
        "`shutdown`, `closed`; HTTP also `header_timeout`: a request not complete in time,",
        "`evicted`: closed to make room for a newer connection, and `done`: ended by the",
        "protocol, as by `Connection: close` or a WebSocket closing handshake).",
        "A TANK connection with no request within `--tank-first-request-timeout` closes",
        "with `first_request_timeout`, as the TANK broker closes it. A Lumberjack",
        "connection whose window could not reach its stream's owner (another node)",
        "closes without the window's ack with `unavailable`: the client sends it again.",
        "The controller (gRPC) logs one line per call instead (at debug level, `-vv`).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":  # python -m headrace.cli.serve > docs/configuration.md
    print(render_docs(), end="")
