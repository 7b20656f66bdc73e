"""Who may do what, on every front door: one authorisation model for all of them.

With ``--auth-password-file`` every front door finds out who its client is
and checks that user's grants (the password file's ``prn::`` resources,
``headrace.protocols.pravega.auth``) before it reads or writes a stream.
How a client says who it is depends on what its protocol can carry:

| door | the client is known by |
| --- | --- |
| controller (gRPC) | Basic credentials on every call (``controller/service.py``) |
| segment store | a delegation token on every request (``server/pravega.py``) |
| TANK, Lumberjack | a TLS client certificate that the password file maps to a user |
| RS-IO (TCP, and ``/rsio``) | a certificate, or ``auth:`` Basic credentials or a token |

A certificate identifies a user when it was verified against ``--tls-ca``
and one of its names (subject CN, or a subjectAltName entry) is a ``cert:``
item of that user in the password file (``controller/auth.py``). What a door
needs, per request:

| door | request | needs |
| --- | --- | --- |
| TANK | produce | READ_UPDATE on ``prn::/scope:<tank scope>/stream:<topic's stream>`` |
| TANK | consume, discover partitions, reload conf | READ on the topic's stream |
| TANK | create topic | READ_UPDATE on ``prn::/scope:<tank scope>`` |
| TANK | discover topics, status | lists only the topics the user may READ |
| Lumberjack | a connection, each window | READ_UPDATE on the target stream |
| RS-IO | subscribe | READ on the stream |
| RS-IO | offer | READ_UPDATE on the stream |

A door that cannot identify its client refuses every such request (reason
``unidentified``), unless its listener is trusted
(``--auth-trust-unauthenticated``): then a client that says nothing may do
everything, while one that does identify itself still gets only its grants.
Every refusal is the protocol's own answer (a TANK error code, a Lumberjack
close, an RS-IO ``onError``) and is counted in
``headrace_auth_refusals_total{protocol, reason}`` with reason
``unidentified``, ``bad_credentials``, ``rate_limited`` or
``permission_denied``.

Grants are read from the password file as it is now, at each check: a user
removed or a grant taken away stops the next request. A delegation token
allows what it names until it expires.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from headrace.controller.auth import (
    Authenticator,
    AuthFailed,
    LoginLimiter,
    certificate_names,
    load_or_create_key,
)
from headrace.protocols.pravega.auth import (
    Permission,
    TokenClaims,
    TokenError,
    decode_token,
    resource_covers,
)
from headrace.server.config import AuthConfig

__all__ = [
    "REFUSAL_REASONS",
    "ConnectionAccess",
    "DoorAuth",
    "Identity",
    "peer_address",
]

log = logging.getLogger(__name__)

REFUSAL_REASONS = ("unidentified", "bad_credentials", "rate_limited", "permission_denied")
"""The ``reason`` label of ``headrace_auth_refusals_total``."""

BEARER = "Bearer"
"""Scheme of a delegation token in an RS-IO ``auth:`` publisher string (as in HTTP)."""


def peer_address(peer: object) -> str:
    """The host part of a peer name (``getpeername()``'s tuple), the key of its
    failed-login bucket; ``""`` when unknown."""
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return "" if peer is None else str(peer)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a connection's client is.

    Attributes:
        user: the password file's user, or None for a token's bearer.
        how: ``certificate``, ``password`` or ``token``.
        token: a delegation token's claims: the bearer may do what it names only.
    """

    user: str | None
    how: str
    token: TokenClaims | None = None

    def __str__(self) -> str:
        if self.token is not None:
            return f"the bearer of a token of {self.token.subject!r}"
        return f"user {self.user!r}"


class DoorAuth:
    """What every listener of one server shares with auth on.

    Args:
        config: the auth options.
        data_dir: where the token signing key is.
        count: called with (protocol, reason) for every refusal (the metrics).
        token_key: the key to sign and check tokens with instead of the data
            directory's: the cluster secret, which every node shares.

    Raises:
        ConfigError: the password file or the key cannot be used.
    """

    def __init__(
        self,
        config: AuthConfig,
        data_dir: Path,
        count: Callable[[str, str], None],
        *,
        token_key: bytes | None = None,
    ) -> None:
        limiter = LoginLimiter(config.failed_login_burst, config.failed_login_interval_s)
        self.authenticator = Authenticator(config.password_file, limiter=limiter)
        self.token_key = load_or_create_key(data_dir) if token_key is None else token_key
        self.trusted = config.trusted_listeners
        self._count = count

    def refused(self, protocol: str, reason: str) -> None:
        """Count one refusal."""
        self._count(protocol, reason)

    def connection(
        self, listener: str, peer: object, peer_cert: Mapping[str, object] | None
    ) -> ConnectionAccess:
        """The access of a new connection to ``listener`` from ``peer``, identified by
        its verified certificate (``peer_cert``) if the password file names it."""
        user = self.authenticator.certificate_user(certificate_names(peer_cert))
        identity = None if user is None else Identity(user, "certificate")
        return ConnectionAccess(self, listener, peer, identity)


class ConnectionAccess:
    """What one connection's client may do: who it is and that user's grants.

    Build with ``DoorAuth.connection``, or ``ConnectionAccess.open`` with auth off.
    """

    def __init__(
        self,
        auth: DoorAuth | None,
        listener: str,
        peer: object = None,
        identity: Identity | None = None,
    ) -> None:
        self._auth = auth
        self.listener = listener
        self.peer = peer
        self.identity = identity
        self._logged = False

    @classmethod
    def open(cls, listener: str) -> ConnectionAccess:
        """Auth off: everything is allowed."""
        return cls(None, listener)

    @classmethod
    def of(
        cls,
        auth: DoorAuth | None,
        listener: str,
        peer: object,
        peer_cert: Mapping[str, object] | None,
    ) -> ConnectionAccess:
        """``auth.connection(...)``, or ``open`` when ``auth`` is None."""
        if auth is None:
            return cls.open(listener)
        return auth.connection(listener, peer, peer_cert)

    @property
    def enforced(self) -> bool:
        """Whether auth is on at all."""
        return self._auth is not None

    @property
    def trusted(self) -> bool:
        """Whether this listener lets unidentified clients do everything."""
        return self._auth is not None and self.listener in self._auth.trusted

    def permission(self, resource: str) -> Permission:
        """The strongest permission the client holds on ``resource`` now."""
        auth, identity = self._auth, self.identity
        if auth is None:
            return Permission.READ_UPDATE
        if identity is None:
            return Permission.READ_UPDATE if self.trusted else Permission.NONE
        token = identity.token
        if token is not None:
            if token.expires_at_s <= time.time() or not resource_covers(token.resource, resource):
                return Permission.NONE
            return token.permission
        assert identity.user is not None
        return auth.authenticator.permission(identity.user, resource)

    def may(self, resource: str, needed: Permission) -> bool:
        """Whether the client holds ``needed`` on ``resource`` (nothing is counted)."""
        return self.permission(resource) >= needed

    def check(self, resource: str, needed: Permission) -> str | None:
        """None if the client holds ``needed`` on ``resource``; else why not.

        A refusal is counted under this listener, with reason ``unidentified``
        (nobody identified, listener not trusted) or ``permission_denied``.
        """
        if self.permission(resource) >= needed:
            return None
        assert self._auth is not None
        identity = self.identity
        if identity is None:
            reason = "unidentified"
            message = (
                f"unauthenticated: {self.listener} cannot tell who the client is (auth is on; "
                "present a client certificate that the password file names"
                + (", or credentials" if self.listener in ("rsio", "http") else "")
                + ")"
            )
        elif identity.token is not None and identity.token.expires_at_s <= time.time():
            reason = "bad_credentials"
            message = "unauthenticated: the delegation token has expired"
        else:
            reason = "permission_denied"
            message = f"permission denied: {identity} needs {needed.name} on {resource}"
        self._auth.refused(self.listener, reason)
        return message

    def note_refusal(self, message: str) -> None:
        """Log a refusal: the first of the connection as a warning, later ones at debug."""
        level = logging.DEBUG if self._logged else logging.WARNING
        self._logged = True
        log.log(level, "%s %s: refused: %s", self.listener, peer_address(self.peer), message)

    async def login(self, authorization: str) -> Identity:
        """Identify the client by ``Basic <base64 user:password>`` or ``Bearer <token>``.

        The identity replaces whatever the connection had (a certificate's).
        With auth off there is nothing to check, and nothing changes.

        Raises:
            AuthFailed: wrong credentials, a bad or expired token, or too many
                failures from this peer (counted, with its reason).
        """
        auth = self._auth
        if auth is None:
            return Identity(None, "none")
        scheme, _, value = authorization.strip().partition(" ")
        try:
            if scheme.lower() == BEARER.lower():
                try:
                    claims = decode_token(auth.token_key, value.strip(), now_s=time.time())
                except TokenError as exc:
                    raise AuthFailed(f"delegation token refused: {exc}") from None
                identity = Identity(None, "token", claims)
            else:
                user = await auth.authenticator.authenticate(
                    authorization, peer=peer_address(self.peer)
                )
                identity = Identity(user, "password")
        except AuthFailed as exc:
            auth.refused(self.listener, exc.reason)
            raise
        self.identity = identity
        return identity
