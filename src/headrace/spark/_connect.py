"""Clients of the headrace server for the data source, and the checks made at planning.

Everything here is blocking, built on the asyncio client (``asyncio.run`` on
a fresh :class:`PravegaClient` per call): Spark calls the data source from
plain threads and short-lived Python workers, so nothing is kept open
between calls.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import TypeVar

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
from headrace.errors import ConfigError, HeadraceError, ServerError

from .options import Connection, OptionError

__all__ = [
    "AUTH_REFUSALS",
    "TLS_CHECK_TIMEOUT_S",
    "Target",
    "check_connection",
    "ensure_stream",
    "make_client",
    "run",
    "split_name",
]

TLS_CHECK_TIMEOUT_S = 10.0
"""Bound on the TLS handshake :func:`check_connection` makes at planning time."""

AUTH_REFUSALS = frozenset({"UNAUTHENTICATED", "PERMISSION_DENIED"})
"""Controller status codes (``ServerError.code``) meaning the credentials were refused."""

Target = str | Connection
"""Where a function's clients connect: a plain controller URI, or a
:class:`Connection` (TLS and credentials, from the options)."""

T = TypeVar("T")


def make_client(target: Target) -> PravegaClient:
    """A client of ``target``, built on the running loop (grpc.aio binds to it).

    The credentials are read here, on the node that connects (``Connection.credentials``).
    """
    if isinstance(target, str):
        return PravegaClient(target)
    credentials = target.credentials()
    try:
        return PravegaClient(target.uri, tls=target.tls, credentials=credentials)
    except ConfigError as exc:  # a TLS file missing or bad on this node
        raise OptionError(
            f"options 'caFile'/'clientCert'/'clientKey' on host {os.uname().nodename}: {exc} "
            "(the files must be readable at that path on the driver and on every executor)"
        ) from None


def run(uri: Target, work: Callable[[PravegaClient], Awaitable[T]]) -> T:
    async def main() -> T:
        async with make_client(uri) as client:
            return await work(client)

    return asyncio.run(main())


def check_connection(conn: Connection, stream: str | None = None) -> None:
    """Fail fast, at planning time, on a controller certificate this node cannot
    verify, and (with ``stream`` and credentials) on credentials the server refuses.

    The controller client (gRPC) reports a failed TLS handshake like a server
    that is down, and retries it for about 20 s; one handshake here, with the
    same TLS settings and a bounded wait, tells the two apart. Does nothing
    without TLS. An unreachable controller is left to the clients (their
    retries cover a server restart).

    Raises:
        TlsCertificateError: the controller's certificate did not verify
            (names the ``caFile`` option).
        OptionError: the TLS files cannot be loaded.
        HeadraceError: the server refused the credentials for ``stream``
            (``UNAUTHENTICATED``: a wrong user or password; ``PERMISSION_DENIED``).
    """
    _check_tls(conn)
    if stream is not None and conn.credentials() is not None:
        scope, name = split_name(stream)

        async def work(client: PravegaClient) -> None:
            try:
                await client.controller.delegation_token(scope, name)
            except ServerError as exc:
                if exc.code not in AUTH_REFUSALS:
                    raise
                raise HeadraceError(
                    f"the server refused the credentials of user {conn.credentials_user()!r} "
                    f"for {stream} (options 'user'/'passwordFile' or the "
                    f"pravega_client_auth_* environment variables): {exc}"
                ) from exc

        run(conn, work)


def _check_tls(conn: Connection) -> None:
    from headrace.client.controller import parse_controller_uri
    from headrace.client.errors import TlsCertificateError

    if conn.tls is None:
        return
    try:
        context = conn.tls.ssl_context()
    except HeadraceError as exc:
        raise OptionError(f"options 'caFile'/'clientCert'/'clientKey': {exc}") from None
    context.set_alpn_protocols(["h2"])  # what the gRPC client offers
    host, _, port = parse_controller_uri(conn.uri).rpartition(":")
    try:
        with (
            socket.create_connection((host, int(port)), timeout=TLS_CHECK_TIMEOUT_S) as sock,
            context.wrap_socket(sock, server_hostname=host),
        ):
            pass
    except ssl.SSLCertVerificationError as exc:
        where = f"the CAs of {conn.tls.ca_file}" if conn.tls.ca_file else "the system's CAs"
        raise TlsCertificateError(
            f"controller {host}:{port}: its TLS certificate does not verify against {where}: "
            f"{exc.verify_message or exc}. Set option 'caFile' to the CA that signed it "
            "(the controller URI's host must be a name on the certificate)"
        ) from None
    except (OSError, ssl.SSLError):
        return  # not a certificate problem: the clients report it after their retries


def split_name(name: str) -> tuple[str, str]:
    scope, _, stream = name.partition("/")
    return scope, stream


def ensure_stream(uri: Target, name: str, segments: int) -> None:
    """Create ``scope/stream`` (and its scope) with ``segments`` fixed segments if missing."""
    scope, stream = split_name(name)

    async def work(client: PravegaClient) -> None:
        await client.controller.create_scope(scope)
        config = StreamConfig(ScalingPolicy.fixed(segments))
        await client.controller.create_stream(scope, stream, config)

    run(uri, work)
