"""TLS for the front doors: one place that turns ``--tls-*`` options into TLS settings.

Every listener uses the same certificate, key and optional client CA
(``ServerConfig.tls``): the TCP front doors (segment store, TANK, RS-IO, HTTP,
``lumberjack_tls``) through the ``ssl.SSLContext`` built here, the gRPC
controller through the ``grpc.ServerCredentials`` built here from the same
files. Protocol adapters never see TLS: the accept loop does the handshake
(``_listen.py``) and the adapter reads plaintext.

With ``--tls-ca`` every listener asks for a client certificate signed by that
CA and refuses a client without one: for TANK, RS-IO, HTTP and Lumberjack,
which have no credentials of their own, the client certificate is the
credential.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headrace.errors import ConfigError

__all__ = ["TlsConfig", "grpc_server_credentials", "server_ssl_context"]


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Certificate files for TLS listeners (``--tls-cert``, ``--tls-key``, ``--tls-ca``).

    Attributes:
        cert: PEM certificate chain the server presents.
        key: PEM private key of ``cert``.
        ca: PEM CA bundle; when given, clients must present a certificate
            signed by it (mutual TLS), otherwise client certificates are not asked for.
    """

    cert: Path
    key: Path
    ca: Path | None = None


def server_ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """A server ``SSLContext`` for ``tls``: TLS 1.2 or later, the library's default ciphers.

    TLS 1.2 is the floor: every client we serve (Beats, logstash-forwarder,
    pylogbeat, the npm clients, the Pravega client) negotiates it, and older
    versions are disabled by default in current OpenSSL builds anyway.

    Raises:
        ConfigError: a file is missing or unreadable, or the key does not match
            the certificate.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--tls-cert {tls.cert} / --tls-key {tls.key}: {exc}") from exc
    if tls.ca is not None:
        try:
            context.load_verify_locations(cafile=tls.ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--tls-ca {tls.ca}: {exc}") from exc
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def grpc_server_credentials(tls: TlsConfig) -> Any:
    """``grpc.ServerCredentials`` for the controller, from the same files as ``server_ssl_context``.

    gRPC (its C core) does its own TLS, so it takes the PEM bytes rather than
    an ``SSLContext``. Call ``server_ssl_context`` first: it checks the files
    and that the key matches the certificate, which gRPC would only report as
    a failure to bind.

    Raises:
        ConfigError: a file cannot be read.
    """
    import grpc  # type: ignore[import-untyped]

    try:
        key = tls.key.read_bytes()
        cert = tls.cert.read_bytes()
        ca = None if tls.ca is None else tls.ca.read_bytes()
    except OSError as exc:
        raise ConfigError(f"TLS files: {exc}") from exc
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )
