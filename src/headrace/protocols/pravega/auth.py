"""Pravega-style authorisation, sans-I/O: resources, permissions, delegation tokens.

Theory of operation (``docs/threat-model.md#auth`` tells the whole story):

1. The controller authenticates a client by its ``authorization`` gRPC
   metadata (``Basic base64(user:password)``) and checks every RPC against
   the user's grants: a list of ``(resource pattern, permission)``.
2. ``getDelegationToken(scope, stream)`` answers a **delegation token**: a
   JSON Web Token signed with HMAC-SHA256 under a key only the server holds,
   naming the user (``sub``), the resource (``res``, e.g.
   ``prn::/scope:S/stream:T``), the permission the user holds on it
   (``perm``) and an expiry (``exp``, unix seconds; the Rust client reads it
   to refresh the token before it runs out).
3. The segment store accepts a command only with a token whose signature is
   good, which has not expired, whose resource covers the segment's stream and
   whose permission covers the command (READ for reads, READ_UPDATE for
   everything that changes a segment). Otherwise it answers
   ``AuthTokenCheckFailed`` with ``TOKEN_EXPIRED`` (the client refreshes the
   token and retries) or ``TOKEN_CHECK_FAILED`` (final).

Resources are Pravega's strings: ``prn::/`` (the root: creating and listing
scopes), ``prn::/scope:S``, ``prn::/scope:S/stream:T``. A pattern may use
``*`` for any run of characters inside one path component
(``prn::/scope:*``, ``prn::/scope:S/stream:*_kvtable``), and **a grant covers
the resource it names and everything below it** (a grant on ``prn::/scope:S``
covers its streams). That last rule is simpler than Pravega's, where a scope
grant does not reach into the scope's streams; ``prn::/*`` means everything
in both.

Segment names map to resources by their first two components: the segment
``S/T/0.#epoch.0`` (and its transaction and transient segments) belongs to
``prn::/scope:S/stream:T``. Table segments of reader groups and key-value
tables (``S/G_kvtable/0.#epoch.0``) belong to the pseudo-stream the client
asked a token for (``G_kvtable``); user stream names cannot contain ``_``, so
such a name never collides with a real stream. Internal segments
(``_system/…``) have no resource: with auth on only a node token (claim
``node``, signed for a node's own calls, never for a user) reaches them.

Only the standard library: ``hmac``, ``hashlib``, ``base64``, ``json``.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import json
import re
from dataclasses import dataclass

__all__ = [
    "MAX_TOKEN_BYTES",
    "ROOT",
    "TOKEN_AUDIENCE",
    "Grant",
    "Permission",
    "TokenClaims",
    "TokenError",
    "TokenExpired",
    "TokenInvalid",
    "basic_header",
    "best_permission",
    "decode_token",
    "encode_token",
    "parse_basic",
    "parse_grant",
    "resource_covers",
    "scope_resource",
    "segment_resource",
    "stream_resource",
    "token_expiry",
]

ROOT = "prn::/"
"""The root resource: creating and listing scopes."""

TOKEN_AUDIENCE = "segmentstore"
"""``aud`` of every delegation token (Java uses the same word): a token signed
for the segment store is not meant for anything else."""

MAX_TOKEN_BYTES = 8 * 1024
"""Longest delegation token the server decodes. Ours are about 300 bytes; the
wire allows 32 KiB strings, and decoding (base64, JSON) costs memory in
proportion, so anything much longer than a real token is refused unread."""

_HEADER = {"alg": "HS256", "typ": "JWT"}
_SCHEME = "Basic"


class Permission(enum.IntEnum):
    """What a grant allows, in increasing order (Pravega's ``AuthHandler.Permissions``)."""

    NONE = 0
    READ = 1
    READ_UPDATE = 2


@dataclass(frozen=True, slots=True)
class Grant:
    """One line of a user's access list: ``pattern`` with ``permission``."""

    pattern: str
    permission: Permission

    def __str__(self) -> str:
        return f"{self.pattern},{self.permission.name}"


def parse_grant(text: str) -> Grant:
    """A grant from ``<pattern>,<READ|READ_UPDATE>`` (Pravega's password-file syntax).

    Raises:
        ValueError: not ``prn::/…``, an unknown permission, or a ``,``/``;`` in the pattern.
    """
    pattern, sep, permission = text.strip().rpartition(",")
    pattern = pattern.strip()
    if not sep or not pattern.startswith(ROOT):
        raise ValueError(f"{text!r} is not <prn::/...>,<READ|READ_UPDATE>")
    if not _valid_pattern(pattern):
        raise ValueError(
            f"{pattern!r} is not prn::/ followed by kind:name components "
            "(no spaces, ',', ';' or ':' in names)"
        )
    try:
        perm = Permission[permission.strip().upper()]
    except KeyError:
        raise ValueError(f"{permission.strip()!r} is not READ or READ_UPDATE") from None
    if perm is Permission.NONE:
        raise ValueError("a grant of NONE grants nothing; leave it out")
    return Grant(pattern, perm)


def _valid_pattern(pattern: str) -> bool:
    # "prn::/" then components "kind:name" separated by "/"; names hold no separators.
    rest = pattern[len(ROOT) :]
    if not rest or rest == "*":
        return True
    return all(re.fullmatch(r"[A-Za-z-]+:[^,;\s/:]+|\*", part) for part in rest.split("/"))


def scope_resource(scope: str) -> str:
    return f"{ROOT}scope:{scope}"


def stream_resource(scope: str, stream: str) -> str:
    return f"{ROOT}scope:{scope}/stream:{stream}"


def segment_resource(segment: str) -> str | None:
    """The stream resource a qualified segment name belongs to; None if it has none.

    ``S/T/…`` -> ``prn::/scope:S/stream:T``; internal (``_system/…``) and
    malformed names (fewer than three components, an empty part) -> None.
    """
    parts = segment.split("/", 2)
    if len(parts) != 3 or not all(parts) or parts[0].startswith("_"):
        return None
    return stream_resource(parts[0], parts[1])


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    body = "[^/]*".join(re.escape(piece) for piece in pattern.split("*"))
    return re.compile(body + r"(/.*)?" if not pattern.endswith("/") else body + ".*")


def resource_covers(pattern: str, resource: str) -> bool:
    """Whether a grant on ``pattern`` reaches ``resource`` (itself or anything below it)."""
    return _pattern_regex(pattern).fullmatch(resource) is not None


def best_permission(grants: tuple[Grant, ...] | list[Grant], resource: str) -> Permission:
    """The strongest permission any of ``grants`` gives on ``resource`` (NONE if none)."""
    return max(
        (g.permission for g in grants if resource_covers(g.pattern, resource)),
        default=Permission.NONE,
    )


# --------------------------------------------------------------------------- Basic credentials


def basic_header(user: str, password: str) -> str:
    """The ``authorization`` metadata value for Basic credentials."""
    raw = f"{user}:{password}".encode()
    return f"{_SCHEME} {base64.b64encode(raw).decode('ascii')}"


def parse_basic(value: str) -> tuple[str, str] | None:
    """(user, password) from an ``authorization`` value; None if it is not valid Basic."""
    scheme, _, encoded = value.strip().partition(" ")
    if scheme.lower() != _SCHEME.lower() or not encoded:
        return None
    try:
        raw = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = raw.partition(":")
    if not sep or not user:
        return None
    return user, password


# --------------------------------------------------------------------------- tokens


class TokenError(ValueError):
    """A delegation token was refused; ``error_code`` is the AuthTokenCheckFailed code."""

    error_code = 0  # TOKEN_CHECK_FAILED


class TokenInvalid(TokenError):
    """Malformed, badly signed, for another audience, or not covering the request."""


class TokenExpired(TokenError):
    """Well signed but past its ``exp``: the client should ask for a fresh one."""

    error_code = 1  # TOKEN_EXPIRED


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a delegation token says: who, on what, what may be done, until when.

    ``node``: a node token, which another node of the cluster signs for its
    own calls (claim ``node``: true): it allows every request, internal
    segments and requests naming no segment included. The controller never
    signs one for a user.
    """

    subject: str
    resource: str
    permission: Permission
    expires_at_s: int
    issued_at_s: int
    node: bool = False


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(key: bytes, signing_input: str) -> str:
    return _b64(hmac.new(key, signing_input.encode("ascii"), hashlib.sha256).digest())


def encode_token(key: bytes, claims: TokenClaims) -> str:
    """A signed delegation token (JWT, HS256) carrying ``claims``."""
    payload = {
        "sub": claims.subject,
        "aud": TOKEN_AUDIENCE,
        "res": claims.resource,
        "perm": claims.permission.name,
        "iat": claims.issued_at_s,
        "exp": claims.expires_at_s,
    }
    if claims.node:
        payload["node"] = True
    head = _b64(json.dumps(_HEADER, separators=(",", ":")).encode())
    body = _b64(json.dumps(payload, separators=(",", ":")).encode())
    signing_input = f"{head}.{body}"
    return f"{signing_input}.{_sign(key, signing_input)}"


def decode_token(key: bytes, token: str, *, now_s: float) -> TokenClaims:
    """The claims of a token signed with ``key`` that has not expired at ``now_s``.

    The signature is checked before anything in the token is believed; the
    header must name HS256 (a token cannot choose its own algorithm).

    Raises:
        TokenInvalid: empty, too long, malformed, badly signed, wrong audience.
        TokenExpired: good but ``exp`` is not after ``now_s``.
    """
    if not token:
        raise TokenInvalid("no delegation token")
    if len(token) > MAX_TOKEN_BYTES:
        raise TokenInvalid(f"delegation token longer than {MAX_TOKEN_BYTES} bytes")
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenInvalid("a delegation token has three parts")
    head, body, signature = parts
    try:
        expected = _sign(key, f"{head}.{body}")
    except UnicodeEncodeError:
        raise TokenInvalid("delegation token is not ASCII") from None
    if not hmac.compare_digest(expected, signature):
        raise TokenInvalid("bad delegation token signature")
    try:
        header = json.loads(_unb64(head))
        payload = json.loads(_unb64(body))
    except (ValueError, binascii.Error):
        raise TokenInvalid("delegation token is not base64url JSON") from None
    if header != _HEADER or not isinstance(payload, dict):
        raise TokenInvalid("unexpected delegation token header")
    try:
        claims = TokenClaims(
            subject=str(payload["sub"]),
            resource=str(payload["res"]),
            permission=Permission[str(payload["perm"])],
            expires_at_s=int(payload["exp"]),
            issued_at_s=int(payload["iat"]),
            node=payload.get("node") is True,
        )
    except (KeyError, TypeError, ValueError):
        raise TokenInvalid("delegation token lacks a claim") from None
    if payload.get("aud") != TOKEN_AUDIENCE:
        raise TokenInvalid("delegation token is for another audience")
    if claims.expires_at_s <= now_s:
        raise TokenExpired(f"delegation token expired at {claims.expires_at_s}")
    return claims


def token_expiry(token: str) -> int | None:
    """The ``exp`` a token claims, unverified (clients use it to refresh in time)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(_unb64(parts[1]))
        return int(payload["exp"])
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None
