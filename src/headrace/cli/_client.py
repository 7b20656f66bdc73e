"""What the client commands share: the controller option, ``SCOPE/STREAM``
arguments, running a coroutine with client errors shown as CLI errors.

Errors: a mistake ends in one ``Error:`` line naming the cause and the fix,
never a traceback. Flags and arguments are checked when parsed (a
``--controller`` that is not a URI, a scope or stream name the controller
would refuse: ``click.BadParameter``, exit 2). ``pravega_client`` gives a
client that, on entry, waits at most 2 s for the controller and otherwise
says why it cannot reach it (``_reach.py``). ``run`` turns every headrace
error into one line through ``user_message``, the one table from client
errors to the words a person reads (exit 1). A command that meets a refusal
of its own raises ``click.ClickException`` with the same kind of line.
Retries that take a while print ``headrace: ... retrying`` lines
(``_show_retries``).

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

_CREDENTIALS_META = "headrace.credentials"
"""Key of whether the running command sends credentials (flags or environment)."""

CONTROLLER_DEFAULT = "tcp://127.0.0.1:9090"
"""``headrace serve``'s default controller port."""

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def _check_controller(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from headrace.client.controller import parse_controller_uri

    try:
        parse_controller_uri(value)
    except ValueError as exc:
        raise click.BadParameter(
            f"{exc}; use tcp://HOST:PORT, or tls://HOST:PORT for TLS", ctx, param
        ) from exc
    return value


def controller_option(f: F) -> F:
    """``--controller URI`` (checked when parsed) and the TLS flags (``tls_options``,
    without ``--insecure``: the controller's gRPC client cannot skip the check)."""
    return click.option(
        "--controller",
        default=CONTROLLER_DEFAULT,
        show_default=True,
        envvar="HEADRACE_CONTROLLER",
        callback=_check_controller,
        help="Controller URI (tls://host:port for TLS).",
    )(tls_options(auth_options(f), insecure=False))


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


def tls_options(f: F, *, insecure: bool = True) -> F:
    """``--ca``, ``--client-cert``, ``--client-key`` and, where the client can
    honour it, ``--insecure``; read by ``client_tls``."""
    file = click.Path(exists=True, dir_okay=False, path_type=Path)
    decorators = [
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
    ]
    if insecure:
        decorators.append(
            click.option(
                "--insecure",
                is_flag=True,
                expose_value=False,
                callback=_remember,
                help="TLS without checking the server's certificate (testing only).",
            )
        )
    for decorator in decorators:
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
    """A ``PravegaClient`` of ``controller`` with the command's TLS and auth flags.

    Entering it (``async with``) waits at most ``CONTROLLER_PROBE_TIMEOUT_S``
    for the controller, then fails with one line naming the cause (nothing
    listening, TLS mismatch, untrusted certificate...) and the fix.
    """
    from ._reach import CliPravegaClient

    _show_retries()
    credentials = client_credentials()
    click.get_current_context().meta[_CREDENTIALS_META] = credentials is not None
    return CliPravegaClient(controller, tls=client_tls(controller), credentials=credentials)


def _show_retries() -> None:
    """Print the client's retry notices (``headrace.client.retry``) as plain
    ``headrace: ...`` lines: a person waiting sees that the command is retrying."""
    import logging
    import sys

    retry_log = logging.getLogger("headrace.client.retry")
    if not retry_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("headrace: %(message)s"))
        retry_log.addHandler(handler)
        retry_log.propagate = False


NAME_RULE = "letters, digits, '.' and '-' (at most 255; not starting with '_')"
"""Which scope and stream names the controller takes (``controller.naming``)."""


def split_stream(value: str) -> tuple[str, str]:
    """``scope/stream`` -> ``(scope, stream)``, each a valid name."""
    from headrace.controller.naming import is_valid_name

    scope, sep, stream = value.partition("/")
    if not sep or not scope or not stream or "/" in stream:
        raise click.BadParameter(f"expected SCOPE/STREAM, got {value!r}")
    for kind, name in (("scope", scope), ("stream", stream)):
        if not is_valid_name(name):
            raise click.BadParameter(f"{kind} name {name!r} is not allowed: use {NAME_RULE}")
    return scope, stream


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a client coroutine; headrace errors become one ``Error:`` line (exit 1)
    that says what went wrong and what to do (``user_message``)."""
    try:
        return asyncio.run(coro)
    except HeadraceError as exc:
        raise click.ClickException(user_message(exc)) from exc


def user_message(exc: HeadraceError) -> str:
    """What a person should read for ``exc``: the cause in their terms, and the fix.

    The one place where client errors become CLI text; commands raise or let
    through headrace errors and ``run`` calls this.
    """
    from headrace.client.errors import (
        ReplyError,
        StreamNotFoundError,
        TlsCertificateError,
    )
    from headrace.errors import ConnectionLost, ControllerError, RequestTimeout, ServerError
    from headrace.protocols import pravega as p

    if isinstance(exc, StreamNotFoundError):
        name = f"{exc.scope}/{exc.stream}"
        return f"no stream {name} (create it with: headrace stream create {name})"
    if isinstance(exc, ControllerError):
        if exc.status in ("INVALID_SCOPE_NAME", "INVALID_STREAM_NAME"):
            return f"{exc}: names may use {NAME_RULE}"
        return str(exc)
    if isinstance(exc, ReplyError) and isinstance(exc.reply, p.AuthTokenCheckFailed):
        return _not_allowed(exc.reply.server_stack_trace)
    if isinstance(exc, ServerError) and exc.code == "UNAUTHENTICATED":
        context = click.get_current_context(silent=True)
        if context is None or not context.meta.get(_CREDENTIALS_META):
            return (
                f"the server wants credentials ({exc.detail}): pass --user and "
                "--password-file (or HEADRACE_USER / HEADRACE_PASSWORD_FILE)"
            )
        return (
            f"the server refused the credentials ({exc.detail}): check --user and "
            "--password-file (or pravega_client_auth_username / _password)"
        )
    if isinstance(exc, ServerError) and exc.code == "PERMISSION_DENIED":
        return _not_allowed(exc.detail)
    if isinstance(exc, TlsCertificateError):
        return f"{exc}: pass --ca with the CA that signed the server's certificate"
    if isinstance(exc, ConnectionLost | RequestTimeout):
        return f"{exc}: is headrace serve running and reachable at the address it advertises?"
    return str(exc)


def _not_allowed(detail: str) -> str:
    return (
        f"not allowed: {detail}; ask for that grant in the server's password file "
        "(headrace user add NAME --permission RESOURCE,PERMISSION --replace), "
        "or use another --user"
    )
