"""Who may do what: the password file, credential checks and delegation tokens.

The **password file** (``headrace serve --auth-password-file F``, managed with
``headrace user add|remove``) follows Pravega's layout, one user per line::

    # comments and blank lines are ignored
    <user>:<password hash>:<item>;<item>;...
    admin:$scrypt$n=16384,r=8,p=1$<salt>$<hash>:prn::/*,READ_UPDATE;
    reader:$scrypt$...:prn::/scope:logs,READ;prn::/scope:logs/stream:*_kvtable,READ_UPDATE;
    shipper:!:prn::/scope:logs/stream:beats,READ_UPDATE;cert:CN=filebeat-1;cert:DNS=web1.example.com;

An item is a grant, ``<resource pattern>,<READ|READ_UPDATE>`` (see
``headrace.protocols.pravega.auth`` for what patterns reach), or a
certificate name, ``cert:<kind>=<value>``: a TLS client certificate (signed
by ``--tls-ca``) whose subject common name (kind ``CN``) or a
subjectAltName entry (kinds ``DNS``, ``IP``, ``URI``, ``email``) has that
value identifies the user on every front door (``CertName``). A name belongs
to one user at most. The hash ``!`` means "no password": the user is known
by its certificate only. Files without ``cert:`` items or ``!`` read as
before.

The hash is scrypt (standard library) with a random 16-byte salt: the file
never holds a password, and a stolen file costs an attacker one scrypt per
guess per user. The file is re-read when it changes (size or modification
time), so users added or removed while the server runs take effect at their
next call.

``Authenticator`` checks ``authorization`` values against the file. A scrypt
check takes tens of milliseconds, far too long for every RPC, so a good
(user, password) pair is remembered — as a SHA-256 of the password under a
per-process random key, never the password — until the file changes. A
check costs the same whether the user exists or not (an unknown user, or one
without a password, is checked against a dummy hash), so the answer time
does not tell which users exist; and every check that runs scrypt takes one
token from its peer address's bucket (``LoginLimiter``): a peer that failed
too often is refused without running scrypt until its bucket refills.

``TokenIssuer`` signs delegation tokens with the server's key
(``load_or_create_key``: ``<data dir>/auth-token.key``, 32 random bytes,
mode 0600, created on first start with auth on, so tokens survive restarts),
or with the cluster secret every node of a cluster shares
(``load_cluster_secret``, ``--cluster-secret-file``) when there is one.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import stat
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from headrace.errors import ConfigError
from headrace.protocols.pravega.auth import (
    Grant,
    Permission,
    TokenClaims,
    best_permission,
    encode_token,
    parse_basic,
    parse_grant,
)

__all__ = [
    "CERT_NAME_KINDS",
    "DEFAULT_TOKEN_TTL_S",
    "LOGIN_FAILURE_BURST",
    "LOGIN_FAILURE_INTERVAL_S",
    "MAX_CACHED_CREDENTIALS",
    "MAX_CERT_NAME_CHARS",
    "MAX_CLUSTER_SECRET_BYTES",
    "MAX_LOGIN_PEERS",
    "MAX_PASSWORD_FILE_BYTES",
    "MAX_USER_CHARS",
    "NO_PASSWORD",
    "TOKEN_KEY_BYTES",
    "TOKEN_KEY_FILE",
    "AuthFailed",
    "Authenticator",
    "CertName",
    "LoginLimiter",
    "PasswordFile",
    "PermissionDenied",
    "TokenIssuer",
    "UserEntry",
    "certificate_names",
    "hash_password",
    "load_cluster_secret",
    "load_or_create_key",
    "parse_cert_name",
    "verify_password",
]

DEFAULT_TOKEN_TTL_S = 600
"""Lifetime of a delegation token (``--auth-token-ttl``): Pravega's default
(``controller.security.auth.delegationToken.ttl.seconds``). The client asks
for a new one before it runs out, so a shorter life only costs RPCs."""

TOKEN_KEY_FILE = "auth-token.key"
"""Name of the token signing key inside the data directory."""

TOKEN_KEY_BYTES = 32
"""HMAC-SHA256 key size: the hash's block security, from ``secrets``."""

MAX_CLUSTER_SECRET_BYTES: Final = 4096
"""Longest cluster secret (``--cluster-secret-file``): a key far longer than the
hash it keys adds nothing, and the file is read whole."""

MAX_CACHED_CREDENTIALS = 1024
"""Good (user, password) pairs remembered so scrypt runs once per pair, not
per RPC. Bounded so a stream of distinct good passwords cannot grow memory;
the oldest is forgotten first."""

MAX_PASSWORD_FILE_BYTES = 16 * 1024 * 1024
"""Largest password file read (tens of thousands of users); a larger file is
a mistake, refused rather than read into memory."""

MAX_USER_CHARS = 128
"""Longest user name."""

MAX_CERT_NAME_CHARS: Final = 1024
"""Longest certificate name value in the password file: above any DNS name (253)
or common name (64, RFC 5280's upper bound), with room for long URIs."""

NO_PASSWORD: Final = "!"
"""The password hash of a user who has none and is known by certificate only
(as ``!`` in ``/etc/shadow``): no password matches it."""

CERT_NAME_KINDS: Final = ("CN", "DNS", "IP", "URI", "email")
"""What a ``cert:`` item may name: the subject's common name, or a
subjectAltName entry of that kind (``ssl``'s names, ``IP Address`` as ``IP``)."""

LOGIN_FAILURE_BURST: Final = 10
"""Password checks one peer address may fail in a row before it must wait
(``--auth-failed-login-burst``): enough for a person mistyping, or a client
retrying with a stale password a few times."""

LOGIN_FAILURE_INTERVAL_S: Final = 6.0
"""After the burst, one more check per this many seconds per peer address
(``--auth-failed-login-interval``): ten guesses a minute, so that guessing a
password over the network takes years while the server spends at most one
scrypt per interval on each address."""

MAX_LOGIN_PEERS: Final = 4096
"""Peer addresses whose failed checks are remembered; past it the address
seen least recently is forgotten (a forgotten address starts with a full
bucket). Bounds the table whatever the number of addresses an attacker has."""

SCRYPT_N = 2**14
"""scrypt cost for new hashes (the ``hashlib`` docs' interactive-login
figure): about 16 MiB and some tens of milliseconds per check."""
SCRYPT_R = 8
SCRYPT_P = 1
MAX_SCRYPT_N = 2**20
"""Highest cost accepted from a file: keeps one check under 1 GiB of memory."""
SALT_BYTES = 16
HASH_BYTES = 32

_USER = re.compile(r"[A-Za-z0-9._@+-]+")
_HASH = re.compile(r"\$scrypt\$n=(\d+),r=(\d+),p=(\d+)\$([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+)")


class AuthFailed(Exception):
    """Missing or wrong credentials (the controller answers UNAUTHENTICATED).

    ``reason`` names the refusal for metrics: ``unidentified`` (no
    credentials), ``bad_credentials`` (unknown user, wrong password, not
    Basic) or ``rate_limited`` (too many failed checks from the peer's address).
    """

    def __init__(self, message: str, reason: str = "bad_credentials") -> None:
        super().__init__(message)
        self.reason = reason


class PermissionDenied(Exception):
    """Good credentials, not enough permission (the controller answers PERMISSION_DENIED,
    which the Rust client reports at once instead of retrying)."""


# --------------------------------------------------------------------------- hashes


def hash_password(password: str) -> str:
    """A salted scrypt hash of ``password`` in the password file's notation."""
    salt = secrets.token_bytes(SALT_BYTES)
    digest = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return (
        f"$scrypt$n={SCRYPT_N},r={SCRYPT_R},p={SCRYPT_P}$"
        f"{base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"
    )


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"),
        salt=salt,
        n=n,
        r=r,
        p=p,
        maxmem=256 * n * r + 1024 * 1024,
        dklen=HASH_BYTES,
    )


def _check_hash(text: str) -> tuple[int, int, int, bytes, bytes]:
    match = _HASH.fullmatch(text)
    if match is None:
        raise ValueError("the hash is not $scrypt$n=N,r=R,p=P$salt$hash")
    n, r, p = (int(match.group(i)) for i in (1, 2, 3))
    if not (2 <= n <= MAX_SCRYPT_N and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16):
        raise ValueError(f"scrypt parameters n={n},r={r},p={p} are out of range")
    try:
        salt = base64.b64decode(match.group(4), validate=True)
        digest = base64.b64decode(match.group(5), validate=True)
    except binascii.Error:
        raise ValueError("the hash's salt or digest is not base64") from None
    return n, r, p, salt, digest


def verify_password(password: str, hashed: str) -> bool:
    """Whether ``password`` matches ``hashed`` (constant-time comparison)."""
    try:
        n, r, p, salt, digest = _check_hash(hashed)
    except ValueError:
        return False
    return hmac.compare_digest(_scrypt(password, salt, n, r, p), digest)


# --------------------------------------------------------------------------- the file


@dataclass(frozen=True, slots=True)
class CertName:
    """A name on a TLS client certificate that identifies a user (a ``cert:`` item).

    ``kind`` is ``CN`` (the subject's common name) or a subjectAltName kind
    (``DNS``, ``IP``, ``URI``, ``email``); see ``certificate_names`` for how
    a certificate's names are read and compared.
    """

    kind: str
    value: str

    def __str__(self) -> str:
        return f"cert:{self.kind}={self.value}"


def _normal_cert_value(kind: str, value: str) -> str:
    """The form names are compared in: DNS names in lower case, IP addresses
    in their compressed form, everything else as written."""
    if kind == "DNS":
        return value.lower()
    if kind == "IP":
        return ipaddress.ip_address(value.strip()).compressed
    return value


def parse_cert_name(text: str) -> CertName:
    """A ``CertName`` from ``cert:<kind>=<value>`` (or ``<kind>=<value>``).

    Raises:
        ValueError: an unknown kind, an empty or too long value, a ``;`` or a
            control character in it, or a malformed IP address.
    """
    body = text.strip().removeprefix("cert:")
    kind, sep, value = body.partition("=")
    if not sep or kind not in CERT_NAME_KINDS:
        raise ValueError(
            f"{text!r} is not cert:<kind>=<value> with kind one of {', '.join(CERT_NAME_KINDS)}"
        )
    if not value or value != value.strip() or len(value) > MAX_CERT_NAME_CHARS:
        raise ValueError(
            f"{text!r}: the value must be 1 to {MAX_CERT_NAME_CHARS} characters, "
            "without spaces at either end"
        )
    if ";" in value or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError(f"{text!r}: the value may not hold ';' or control characters")
    try:
        return CertName(kind, _normal_cert_value(kind, value))
    except ValueError:
        raise ValueError(f"{text!r}: {value!r} is not an IP address") from None


def certificate_names(peer_cert: Mapping[str, object] | None) -> frozenset[CertName]:
    """The names a verified client certificate carries (``SSLObject.getpeercert()``).

    Its subject's common names and its subjectAltName entries of the kinds
    in ``CERT_NAME_KINDS``, normalised as ``parse_cert_name`` does. None or
    an empty dict (no certificate, or one that was not verified) has none.
    """
    if not peer_cert:
        return frozenset()
    names: set[CertName] = set()
    subject = peer_cert.get("subject", ())
    for rdn in subject if isinstance(subject, tuple) else ():
        for attribute in rdn:
            if len(attribute) == 2 and attribute[0] == "commonName":
                names.add(CertName("CN", str(attribute[1])))
    alt_names = peer_cert.get("subjectAltName", ())
    for entry in alt_names if isinstance(alt_names, tuple) else ():
        if len(entry) != 2:
            continue
        kind = "IP" if entry[0] == "IP Address" else str(entry[0])
        if kind in CERT_NAME_KINDS and kind != "CN":
            try:
                names.add(CertName(kind, _normal_cert_value(kind, str(entry[1]))))
            except ValueError:
                continue
    return frozenset(names)


@dataclass(frozen=True, slots=True)
class UserEntry:
    """One line of the password file."""

    name: str
    password_hash: str
    """A scrypt hash, or ``NO_PASSWORD``."""
    grants: tuple[Grant, ...]
    certs: tuple[CertName, ...] = ()
    """Certificate names that identify this user."""

    @property
    def has_password(self) -> bool:
        return self.password_hash != NO_PASSWORD

    def line(self) -> str:
        items = [*map(str, self.grants), *map(str, self.certs)]
        return f"{self.name}:{self.password_hash}:" + "".join(f"{item};" for item in items)


def check_user_name(name: str) -> str:
    """``name`` if it is a valid user name, else ValueError saying why."""
    if not name or len(name) > MAX_USER_CHARS or _USER.fullmatch(name) is None:
        raise ValueError(
            f"user name {name!r} must be 1 to {MAX_USER_CHARS} characters of "
            "letters, digits and . _ @ + -"
        )
    return name


class PasswordFile:
    """The users of one password file, in file order."""

    def __init__(self, users: dict[str, UserEntry] | None = None) -> None:
        self.users: dict[str, UserEntry] = dict(users or {})

    def certificate_owners(self) -> dict[CertName, str]:
        """Certificate name -> the user it identifies.

        Raises:
            ValueError: a name given to two users.
        """
        owners: dict[CertName, str] = {}
        for entry in self.users.values():
            for cert in entry.certs:
                if owners.setdefault(cert, entry.name) != entry.name:
                    raise ValueError(f"{cert} identifies both {owners[cert]!r} and {entry.name!r}")
        return owners

    @classmethod
    def parse(cls, text: str, *, source: str = "password file") -> PasswordFile:
        """Parse the file's text.

        Raises:
            ConfigError: a bad line (the message names the line number).
        """
        users: dict[str, UserEntry] = {}
        owners: dict[CertName, str] = {}
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                name, sep1, rest = line.partition(":")
                password_hash, sep2, acl = rest.partition(":")
                if not sep1 or not sep2:
                    raise ValueError("expected <user>:<hash>:<grants>")
                check_user_name(name)
                if password_hash != NO_PASSWORD:
                    _check_hash(password_hash)
                items = [item.strip() for item in acl.split(";") if item.strip()]
                grants = tuple(parse_grant(i) for i in items if not i.startswith("cert:"))
                certs = tuple(parse_cert_name(i) for i in items if i.startswith("cert:"))
                if name in users:
                    raise ValueError(f"user {name!r} appears twice")
                for cert in certs:
                    if owners.setdefault(cert, name) != name:
                        raise ValueError(f"{cert} already identifies user {owners[cert]!r}")
            except ValueError as exc:
                raise ConfigError(f"{source} line {number}: {exc}") from None
            users[name] = UserEntry(name, password_hash, grants, certs)
        return cls(users)

    @classmethod
    def load(cls, path: Path) -> PasswordFile:
        """Read and parse ``path``.

        Raises:
            ConfigError: unreadable, too large, or a bad line.
        """
        try:
            with path.open("rb") as f:
                data = f.read(MAX_PASSWORD_FILE_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read password file {path}: {exc.strerror}") from None
        if len(data) > MAX_PASSWORD_FILE_BYTES:
            raise ConfigError(f"password file {path} is over {MAX_PASSWORD_FILE_BYTES} bytes")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"password file {path} is not UTF-8") from None
        return cls.parse(text, source=str(path))

    def text(self) -> str:
        header = (
            "# headrace password file: "
            "<user>:<scrypt hash or !>:<resource>,<permission>;...;cert:<kind>=<value>;...\n"
        )
        return header + "".join(entry.line() + "\n" for entry in self.users.values())

    def save(self, path: Path) -> None:
        """Write atomically (temporary file, fsync, rename) with mode 0600."""
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or Path("."))
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self.text())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


# --------------------------------------------------------------------------- checks


class LoginLimiter:
    """A token bucket per peer address for password checks (``Authenticator``).

    Every check that runs scrypt takes a token first (so even checks running
    side by side are bounded); a check that succeeds gives it back, so only
    failures use the bucket up. A bucket holds ``burst`` tokens and gains one
    every ``interval_s``. At most ``max_peers`` addresses are remembered (the
    one seen least recently is forgotten first); a full bucket is forgotten
    at once, as it is the same as none.

    Args:
        burst: ``LOGIN_FAILURE_BURST``.
        interval_s: ``LOGIN_FAILURE_INTERVAL_S``.
        max_peers: ``MAX_LOGIN_PEERS``.
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(
        self,
        burst: int = LOGIN_FAILURE_BURST,
        interval_s: float = LOGIN_FAILURE_INTERVAL_S,
        *,
        max_peers: int = MAX_LOGIN_PEERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert burst >= 1 and interval_s > 0 and max_peers >= 1
        self.burst = burst
        self.interval_s = interval_s
        self._max_peers = max_peers
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at

    def _tokens(self, peer: str, now: float) -> float:
        tokens, at = self._buckets.get(peer, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) / self.interval_s)

    def take(self, peer: str) -> bool:
        """Take one check's token for ``peer``; False (nothing taken) if it has none."""
        now = self._clock()
        tokens = self._tokens(peer, now)
        if tokens < 1:
            return False
        self._buckets[peer] = (tokens - 1, now)
        self._buckets.move_to_end(peer)
        while len(self._buckets) > self._max_peers:
            self._buckets.popitem(last=False)
        return True

    def give_back(self, peer: str) -> None:
        """The check succeeded: return its token."""
        now = self._clock()
        tokens = self._tokens(peer, now) + 1
        if tokens >= self.burst:
            self._buckets.pop(peer, None)
        elif peer in self._buckets:
            self._buckets[peer] = (tokens, now)

    def retry_after_s(self, peer: str) -> float:
        """Seconds until ``peer`` may try again (0: now)."""
        return max(0.0, (1 - self._tokens(peer, self._clock())) * self.interval_s)

    def __len__(self) -> int:
        return len(self._buckets)


class Authenticator:
    """Checks ``authorization`` values against a password file (re-read when it changes).

    Args:
        path: the password file.
        limiter: failed checks per peer address; default ``LoginLimiter()``.

    Raises:
        ConfigError: the file cannot be read or parsed at start.
    """

    def __init__(self, path: Path, *, limiter: LoginLimiter | None = None) -> None:
        self.path = path
        self._stamp = self._file_stamp()
        self._file = PasswordFile.load(path)
        self._owners = self._file.certificate_owners()
        self._cache_key = secrets.token_bytes(32)
        self._good: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self.limiter = limiter if limiter is not None else LoginLimiter()
        # What unknown users and users without a password are checked against:
        # a hash no password matches, with the cost new hashes get.
        self._dummy_hash = hash_password(secrets.token_urlsafe(16))

    def _file_stamp(self) -> tuple[int, int, int]:
        try:
            st = self.path.stat()
        except OSError:
            return (0, 0, 0)
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _refresh(self) -> None:
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return
        try:
            users = PasswordFile.load(self.path)
        except ConfigError:
            return  # keep serving the last good file; the next change is tried again
        self._stamp, self._file = stamp, users
        self._owners = users.certificate_owners()
        self._good.clear()

    def grants(self, user: str) -> tuple[Grant, ...]:
        """The grants of ``user`` as the file says now (none for an unknown user)."""
        self._refresh()
        entry = self._file.users.get(user)
        return entry.grants if entry is not None else ()

    def permission(self, user: str, resource: str) -> Permission:
        return best_permission(self.grants(user), resource)

    def certificate_user(self, names: frozenset[CertName]) -> str | None:
        """The user a client certificate's names identify; None for none.

        A certificate whose names point at two different users identifies
        nobody (the file gives each name to one user; a certificate may
        still carry names of two).
        """
        if not names:
            return None
        self._refresh()
        users = {self._owners[name] for name in names if name in self._owners}
        return users.pop() if len(users) == 1 else None

    async def authenticate(self, authorization: str | None, *, peer: str = "") -> str:
        """The user named by a valid ``authorization`` value.

        The scrypt check runs in a worker thread, so the event loop keeps
        serving while it runs. It runs whether or not the user exists (against
        a dummy hash when it does not), so the time taken does not tell.
        ``peer`` (the client's address) names its bucket in ``limiter``: a
        peer without a token is refused before any scrypt runs.

        Raises:
            AuthFailed: no value, not Basic, unknown user or wrong password
                (reason ``bad_credentials`` or ``unidentified``), or too many
                failures from ``peer`` (reason ``rate_limited``).
        """
        if not authorization:
            raise AuthFailed("no credentials (authorization metadata)", "unidentified")
        parsed = parse_basic(authorization)
        if parsed is None:
            raise AuthFailed("credentials are not Basic user:password")
        user, password = parsed
        self._refresh()
        entry = self._file.users.get(user)
        remembered = (user, hmac.new(self._cache_key, password.encode(), "sha256").digest())
        if entry is not None and remembered in self._good:
            self._good.move_to_end(remembered)
            return user
        if not self.limiter.take(peer):
            wait_s = self.limiter.retry_after_s(peer)
            raise AuthFailed(
                f"too many failed logins from this address; try again in {wait_s:.0f} s",
                "rate_limited",
            )
        stamp = self._stamp
        known = entry is not None and entry.has_password
        hashed = entry.password_hash if entry is not None and known else self._dummy_hash
        ok = await asyncio.to_thread(verify_password, password, hashed) and known
        if not ok:
            raise AuthFailed(f"unknown user or wrong password for {user!r}")
        self.limiter.give_back(peer)
        if stamp == self._stamp:  # the file did not change while we checked
            self._good[remembered] = None
            while len(self._good) > MAX_CACHED_CREDENTIALS:
                self._good.popitem(last=False)
        return user


class TokenIssuer:
    """Signs delegation tokens that live ``ttl_s`` seconds."""

    def __init__(self, key: bytes, ttl_s: int = DEFAULT_TOKEN_TTL_S) -> None:
        assert len(key) >= TOKEN_KEY_BYTES and ttl_s > 0
        self.key = key
        self.ttl_s = ttl_s

    def issue(self, user: str, resource: str, permission: Permission, *, node: bool = False) -> str:
        """A token for ``user``; ``node``: a node token (``TokenClaims.node``),
        for a node's own calls to another node, never for a user."""
        now = int(time.time())
        return encode_token(
            self.key, TokenClaims(user, resource, permission, now + self.ttl_s, now, node)
        )


def load_cluster_secret(path: Path) -> bytes:
    """The cluster secret in ``path`` (``--cluster-secret-file``): its bytes, as
    they are, are the key every node of the cluster signs and checks tokens with.

    Refused, as the token key file is, when readable by group or others.

    Raises:
        ConfigError: unreadable, too open, shorter than ``TOKEN_KEY_BYTES`` or
            longer than ``MAX_CLUSTER_SECRET_BYTES``; one line.
    """
    try:
        with path.open("rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            secret = f.read(MAX_CLUSTER_SECRET_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read cluster secret {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"cluster secret {path} is readable by others; chmod 600 it")
    if not TOKEN_KEY_BYTES <= len(secret) <= MAX_CLUSTER_SECRET_BYTES:
        raise ConfigError(
            f"cluster secret {path} must hold {TOKEN_KEY_BYTES} to {MAX_CLUSTER_SECRET_BYTES} "
            "bytes (e.g. head -c 32 /dev/urandom)"
        )
    return secret


def load_or_create_key(data_dir: Path) -> bytes:
    """The token signing key in ``data_dir`` (``TOKEN_KEY_FILE``), made on first use.

    Created with ``O_EXCL`` and mode 0600; a key file readable by group or
    others is refused, as ssh refuses such private keys.

    Raises:
        ConfigError: the file is unreadable, the wrong size, or too open.
    """
    path = data_dir / TOKEN_KEY_FILE
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(TOKEN_KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
    try:
        mode = path.stat().st_mode
        key = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read token key {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"token key {path} is readable by others; chmod 600 it")
    if len(key) != TOKEN_KEY_BYTES:
        raise ConfigError(f"token key {path} is not {TOKEN_KEY_BYTES} bytes; delete it to renew")
    return key
