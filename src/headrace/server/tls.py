"""TLS for the front doors: one place that turns ``--tls-*`` options into TLS settings.

Every listener uses the same certificate, key and optional client CA
(``ServerConfig.tls``): the TCP front doors (segment store, TANK, RS-IO, HTTP,
``lumberjack_tls``) through the ``ssl.SSLContext`` built here, the gRPC
controller through the ``grpc.ServerCredentials`` built here from the same
files. Protocol adapters never see TLS: the accept loop does the handshake
(``_listen.py``) and the adapter reads plaintext.

With ``--tls-ca`` every listener asks for a client certificate signed by that
CA and refuses a client without one (``--tls-verify-client required``), or
lets a client without one in (``optional``: Pravega clients, which cannot
present one, log in with a password). A certificate that is presented must
verify either way. With auth on, the names on a verified certificate identify
a user of the password file (``server/authz.py``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headrace.errors import ConfigError

__all__ = ["VERIFY_CLIENT_MODES", "TlsConfig", "grpc_server_credentials", "server_ssl_context"]

VERIFY_CLIENT_MODES = ("required", "optional")
"""``--tls-verify-client``: whether a client certificate is required or only checked
when presented (``ssl.CERT_REQUIRED`` / ``ssl.CERT_OPTIONAL``)."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Certificate files for TLS listeners (``--tls-cert``, ``--tls-key``, ``--tls-ca``).

    Attributes:
        cert: PEM certificate chain the server presents.
        key: PEM private key of ``cert``.
        ca: PEM CA bundle; when given, clients are asked for a certificate
            signed by it (mutual TLS), otherwise client certificates are not asked for.
        verify_client: with ``ca``, ``required`` (a client without a
            certificate is refused) or ``optional`` (it is let in).
    """

    cert: Path
    key: Path
    ca: Path | None = None
    verify_client: str = "required"


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
        raise ConfigError(_unusable_pair(tls, exc)) from exc
    if tls.ca is not None:
        try:
            context.load_verify_locations(cafile=tls.ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--tls-ca {tls.ca}: {exc}") from exc
        required = tls.verify_client == "required"
        context.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
    return context


def _unusable_pair(tls: TlsConfig, exc: Exception) -> str:
    """Which of ``--tls-cert``/``--tls-key`` is wrong, and how, in one line
    (OpenSSL says only "PEM lib" for a file that is not what it should be)."""
    fix = "(a test pair: headrace cert DIR)"
    try:
        cert, key = tls.cert.read_bytes(), tls.key.read_bytes()
    except OSError as error:
        return f"--tls-cert {tls.cert} / --tls-key {tls.key}: {error}"
    if b"-----BEGIN CERTIFICATE-----" not in cert:
        return f"--tls-cert {tls.cert} is not a PEM certificate {fix}"
    if b"PRIVATE KEY-----" not in key:
        return f"--tls-key {tls.key} is not a PEM private key {fix}"
    if isinstance(exc, ssl.SSLError) and exc.reason == "KEY_VALUES_MISMATCH":
        return f"--tls-key {tls.key} is not the key of --tls-cert {tls.cert}"
    return f"--tls-cert {tls.cert} / --tls-key {tls.key}: {exc}"


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
        [(key, cert)],
        root_certificates=ca,
        require_client_auth=ca is not None and tls.verify_client == "required",
    )
