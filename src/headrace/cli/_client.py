"""What the client commands share: the controller option, ``SCOPE/STREAM``
arguments, running a coroutine with client errors shown as CLI errors.

TLS: ``tls_options`` adds ``--ca``, ``--client-cert``, ``--client-key`` and
``--insecure`` to a command (``controller_option`` adds them with
``--controller``); ``client_tls`` turns them into ``TlsOptions``. TLS is on
when the controller URI has a TLS scheme (``tls://``) or any of them is given.

Auth: ``controller_option`` also adds ``--user`` and ``--password-file`` (or
``HEADRACE_USER`` / ``HEADRACE_PASSWORD_FILE``); without them the real Pravega
client's variables (``pravega_client_auth_username`` / ``_password``) are
used if set. ``client_credentials`` turns them into ``(user, password)`` for a
server with ``--auth-password-file``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from headrace.errors import HeadraceError

if TYPE_CHECKING:  # imported when used: ``headrace status`` stays free of grpc without TLS
    from headrace.client import PravegaClient
    from headrace.client.tls import TlsOptions

__all__ = [
    "CONTROLLER_DEFAULT",
    "client_credentials",
    "client_tls",
    "controller_option",
    "pravega_client",
    "run",
    "split_stream",
    "tls_options",
]

_AUTH_META = "headrace.auth"
"""Key of the auth flags' values in the click context's ``meta``."""

_TLS_META = "headrace.tls"
"""Key of the TLS flags' values in the click context's ``meta``."""

CONTROLLER_DEFAULT = "tcp://127.0.0.1:9090"
"""``headrace serve``'s default controller port."""

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def controller_option(f: F) -> F:
    """``--controller URI`` and the TLS flags (``tls_options``)."""
    return click.option(
        "--controller",
        default=CONTROLLER_DEFAULT,
        show_default=True,
        envvar="HEADRACE_CONTROLLER",
        help="Controller URI (tls://host:port for TLS).",
    )(tls_options(auth_options(f)))


def _remember_auth(ctx: click.Context, param: click.Parameter, value: object) -> object:
    ctx.meta.setdefault(_AUTH_META, {})[param.name] = value
    return value


def auth_options(f: F) -> F:
    """``--user`` and ``--password-file``, read by ``client_credentials``."""
    f = click.option(
        "--password-file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        envvar="HEADRACE_PASSWORD_FILE",
        expose_value=False,
        callback=_remember_auth,
        help="Auth: file whose first line is the --user's password.",
    )(f)
    return click.option(
        "--user",
        envvar="HEADRACE_USER",
        expose_value=False,
        callback=_remember_auth,
        help="Auth: user name, for a server started with --auth-password-file.",
    )(f)


def client_credentials() -> tuple[str, str] | None:
    """The running command's ``(user, password)``; None: no credentials.

    Raises:
        click.UsageError: ``--user`` without ``--password-file`` or the reverse,
            or an unreadable password file.
    """
    from headrace.client.pravega import credentials_from_env

    values = click.get_current_context().meta.get(_AUTH_META, {})
    user, path = values.get("user"), values.get("password_file")
    if user is None and path is None:
        return credentials_from_env()
    if user is None or path is None:
        raise click.UsageError("--user and --password-file go together")
    try:
        with Path(path).open(encoding="utf-8") as f:
            password = f.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.UsageError(f"cannot read --password-file {path}: {exc}") from exc
    return str(user), password


def _remember(ctx: click.Context, param: click.Parameter, value: object) -> object:
    ctx.meta.setdefault(_TLS_META, {})[param.name] = value
    return value


def tls_options(f: F) -> F:
    """``--ca``, ``--client-cert``, ``--client-key``, ``--insecure``, read by ``client_tls``."""
    file = click.Path(exists=True, dir_okay=False, path_type=Path)
    for decorator in (
        click.option(
            "--ca",
            type=file,
            envvar="HEADRACE_CA",
            expose_value=False,
            callback=_remember,
            help="TLS: PEM file of the CA(s) to trust instead of the system's (turns TLS on).",
        ),
        click.option(
            "--client-cert",
            type=file,
            envvar="HEADRACE_CLIENT_CERT",
            expose_value=False,
            callback=_remember,
            help="TLS: PEM client certificate, for a server started with --tls-ca.",
        ),
        click.option(
            "--client-key",
            type=file,
            envvar="HEADRACE_CLIENT_KEY",
            expose_value=False,
            callback=_remember,
            help="TLS: PEM key of --client-cert.",
        ),
        click.option(
            "--insecure",
            is_flag=True,
            expose_value=False,
            callback=_remember,
            help="TLS without checking the server's certificate (testing only; "
            "not possible for the controller).",
        ),
    ):
        f = decorator(f)
    return f


def client_tls(uri: str = "") -> TlsOptions | None:
    """The TLS flags of the running command as ``TlsOptions``; None: plaintext.

    TLS is on when ``uri`` has a TLS scheme or any TLS flag was given.
    """
    from headrace.client.tls import TlsOptions, uri_wants_tls

    values = click.get_current_context().meta.get(_TLS_META, {})
    ca, cert, key = values.get("ca"), values.get("client_cert"), values.get("client_key")
    insecure = bool(values.get("insecure"))
    if not (uri_wants_tls(uri) or ca or cert or key or insecure):
        return None
    return TlsOptions(ca_file=ca, verify=not insecure, cert_file=cert, key_file=key)


def pravega_client(controller: str) -> PravegaClient:
    """A ``PravegaClient`` of ``controller`` with the command's TLS and auth flags."""
    from headrace.client import PravegaClient

    return PravegaClient(controller, tls=client_tls(controller), credentials=client_credentials())


def split_stream(value: str) -> tuple[str, str]:
    """``scope/stream`` -> ``(scope, stream)``."""
    scope, sep, stream = value.partition("/")
    if not sep or not scope or not stream or "/" in stream:
        raise click.BadParameter(f"expected SCOPE/STREAM, got {value!r}")
    return scope, stream


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a client coroutine; headrace errors become a clean CLI error (exit 1)."""
    try:
        return asyncio.run(coro)
    except HeadraceError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
