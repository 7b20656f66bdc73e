"""Reaching the controller from a CLI command, and saying why not in one line.

A command first waits ``CONTROLLER_PROBE_TIMEOUT_S`` for its gRPC channel to
be ready. If it is not, the client would retry for about 20 s and then report
gRPC's last error (often about ``[::1]`` when the server listens on
127.0.0.1). Instead, ``why_unreachable`` looks at the port with plain sockets
and names the cause and the fix: nothing listening, a TLS port reached
without TLS, TLS on a plain port, a certificate not trusted or not naming the
host, or a port that is not a controller.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from typing import TYPE_CHECKING, Final

import click

from headrace.client import PravegaClient
from headrace.client.controller import parse_controller_uri

from ._probe import DIAGNOSE_TIMEOUT_S, answer_to_http2, handshake, speaks_tls

if TYPE_CHECKING:
    from headrace.client.tls import TlsOptions

__all__ = ["CONTROLLER_PROBE_TIMEOUT_S", "CliPravegaClient", "why_unreachable"]

CONTROLLER_PROBE_TIMEOUT_S: Final = 2.0
"""How long a command waits for the controller before it explains why it cannot
reach it: a local or LAN controller answers in milliseconds, and a person
waiting for a hint should not wait for the client's 20 s of retries."""

_HINT: Final = (
    "is headrace serve running? Point --controller (or HEADRACE_CONTROLLER) at its controller port"
)

_HOSTNAME_MISMATCH: Final = 62
"""OpenSSL's ``X509_V_ERR_HOSTNAME_MISMATCH``: the certificate names other hosts."""


class CliPravegaClient(PravegaClient):
    """A ``PravegaClient`` that, on entry, fails within a few seconds with a
    one-line ``click.ClickException`` if the controller cannot be reached."""

    async def __aenter__(self) -> CliPravegaClient:
        if not await self.controller.wait_ready(CONTROLLER_PROBE_TIMEOUT_S):
            message = await why_unreachable(self.controller.uri, self.controller.tls)
            if message is not None:
                await self.aclose()
                raise click.ClickException(message)
        return self


def _host_port(uri: str) -> tuple[str, int]:
    host, _, port = parse_controller_uri(uri).rpartition(":")
    return host.strip("[]"), int(port)


async def why_unreachable(uri: str, tls: TlsOptions | None) -> str | None:
    """One line: why the controller at ``uri`` did not answer, and what to do;
    None if it answers as a gRPC server after all (slow: the client goes on)."""
    host, port = _host_port(uri)
    where = f"{host}:{port}"
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), DIAGNOSE_TIMEOUT_S)
    except TimeoutError:
        return f"cannot reach the controller at {where} (no answer): {_HINT}"
    except OSError as exc:
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        return f"cannot reach the controller at {where} ({reason}): {_HINT}"
    writer.close()
    if tls is None:
        answer = await answer_to_http2(host, port, None)
        if answer == "other" and await speaks_tls(host, port):
            return (
                f"the server at {where} speaks TLS: use --controller tls://{where} "
                "and --ca with the CA that signed its certificate"
            )
        return _not_grpc(where, answer)
    try:
        await handshake(host, port, tls.ssl_context())
    except ssl.SSLCertVerificationError as exc:
        if exc.verify_code == _HOSTNAME_MISMATCH:
            return (
                f"the certificate of {where} does not name {host}: connect by a name "
                f"on the certificate (--controller tls://NAME:{port})"
            )
        return (
            f"the certificate of {where} is not trusted ({exc.verify_message}): "
            "pass --ca with the CA that signed it"
        )
    except ssl.SSLError as exc:
        if not await speaks_tls(host, port):
            return f"the server at {where} does not speak TLS: use --controller tcp://{where}"
        return f"TLS with {where} failed ({exc.reason or exc})"
    except (OSError, TimeoutError):
        return f"the server at {where} does not speak TLS: use --controller tcp://{where}"
    answer = await answer_to_http2(host, port, tls.ssl_context())
    if answer == "other" and tls.cert_file is None:
        return (
            f"{where} does not answer as a controller (gRPC over TLS): if the server "
            "wants a client certificate, pass --client-cert and --client-key; else " + _HINT
        )
    return _not_grpc(where, answer)


def _not_grpc(where: str, answer: str) -> str | None:
    """The line for a port that took a connection, by its answer to HTTP/2."""
    if answer == "http2":
        return None
    if answer == "silent":
        return (
            f"{where} takes connections but does not answer (a stopped or overloaded "
            f"server?): {_HINT}"
        )
    return f"{where} does not answer as a controller (gRPC): {_HINT}"
