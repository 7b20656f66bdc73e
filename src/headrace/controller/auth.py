"""Who may do what: the password file, credential checks and delegation tokens.

The **password file** (``headrace serve --auth-password-file F``, managed with
``headrace user add|remove``) follows Pravega's layout, one user per line::

    # comments and blank lines are ignored
    <user>:<password hash>:<grant>;<grant>;...
    admin:$scrypt$n=16384,r=8,p=1$<salt>$<hash>:prn::/*,READ_UPDATE;
    reader:$scrypt$...:prn::/scope:logs,READ;prn::/scope:logs/stream:*_kvtable,READ_UPDATE;

A grant is ``<resource pattern>,<READ|READ_UPDATE>`` (see
``headrace.protocols.pravega.auth`` for what patterns reach). The hash is
scrypt (standard library) with a random 16-byte salt: the file never holds a
password, and a stolen file costs an attacker one scrypt per guess per user.
The file is re-read when it changes (size or modification time), so users
added or removed while the server runs take effect at their next call.

``Authenticator`` checks ``authorization`` values against the file. A scrypt
check takes tens of milliseconds, far too long for every RPC, so a good
(user, password) pair is remembered — as a SHA-256 of the password under a
per-process random key, never the password — until the file changes.

``TokenIssuer`` signs delegation tokens with the server's key
(``load_or_create_key``: ``<data dir>/auth-token.key``, 32 random bytes,
mode 0600, created on first start with auth on, so tokens survive restarts).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
import stat
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

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
    "DEFAULT_TOKEN_TTL_S",
    "MAX_CACHED_CREDENTIALS",
    "MAX_PASSWORD_FILE_BYTES",
    "MAX_USER_CHARS",
    "TOKEN_KEY_BYTES",
    "TOKEN_KEY_FILE",
    "AuthFailed",
    "Authenticator",
    "PasswordFile",
    "PermissionDenied",
    "TokenIssuer",
    "UserEntry",
    "hash_password",
    "load_or_create_key",
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

MAX_CACHED_CREDENTIALS = 1024
"""Good (user, password) pairs remembered so scrypt runs once per pair, not
per RPC. Bounded so a stream of distinct good passwords cannot grow memory;
the oldest is forgotten first."""

MAX_PASSWORD_FILE_BYTES = 16 * 1024 * 1024
"""Largest password file read (tens of thousands of users); a larger file is
a mistake, refused rather than read into memory."""

MAX_USER_CHARS = 128
"""Longest user name."""

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
    """Missing or wrong credentials (the controller answers UNAUTHENTICATED)."""


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
class UserEntry:
    """One line of the password file."""

    name: str
    password_hash: str
    grants: tuple[Grant, ...]

    def line(self) -> str:
        return f"{self.name}:{self.password_hash}:" + "".join(f"{g};" for g in self.grants)


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

    @classmethod
    def parse(cls, text: str, *, source: str = "password file") -> PasswordFile:
        """Parse the file's text.

        Raises:
            ConfigError: a bad line (the message names the line number).
        """
        users: dict[str, UserEntry] = {}
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
                _check_hash(password_hash)
                grants = tuple(parse_grant(g) for g in acl.split(";") if g.strip())
                if name in users:
                    raise ValueError(f"user {name!r} appears twice")
            except ValueError as exc:
                raise ConfigError(f"{source} line {number}: {exc}") from None
            users[name] = UserEntry(name, password_hash, grants)
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
        header = "# headrace password file: <user>:<scrypt hash>:<resource>,<permission>;...\n"
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


class Authenticator:
    """Checks ``authorization`` values against a password file (re-read when it changes).

    Args:
        path: the password file.

    Raises:
        ConfigError: the file cannot be read or parsed at start.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = self._file_stamp()
        self._file = PasswordFile.load(path)
        self._cache_key = secrets.token_bytes(32)
        self._good: OrderedDict[tuple[str, bytes], None] = OrderedDict()

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
        self._good.clear()

    def grants(self, user: str) -> tuple[Grant, ...]:
        """The grants of ``user`` as the file says now (none for an unknown user)."""
        self._refresh()
        entry = self._file.users.get(user)
        return entry.grants if entry is not None else ()

    def permission(self, user: str, resource: str) -> Permission:
        return best_permission(self.grants(user), resource)

    async def authenticate(self, authorization: str | None) -> str:
        """The user named by a valid ``authorization`` value.

        The scrypt check runs in a worker thread, so the event loop keeps
        serving while it runs.

        Raises:
            AuthFailed: no value, not Basic, unknown user or wrong password.
        """
        if not authorization:
            raise AuthFailed("no credentials (authorization metadata)")
        parsed = parse_basic(authorization)
        if parsed is None:
            raise AuthFailed("credentials are not Basic user:password")
        user, password = parsed
        self._refresh()
        entry = self._file.users.get(user)
        if entry is None:
            raise AuthFailed(f"unknown user or wrong password for {user!r}")
        remembered = (user, hmac.new(self._cache_key, password.encode(), "sha256").digest())
        if remembered in self._good:
            self._good.move_to_end(remembered)
            return user
        stamp = self._stamp
        ok = await asyncio.to_thread(verify_password, password, entry.password_hash)
        if not ok:
            raise AuthFailed(f"unknown user or wrong password for {user!r}")
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

    def issue(self, user: str, resource: str, permission: Permission) -> str:
        now = int(time.time())
        return encode_token(
            self.key, TokenClaims(user, resource, permission, now + self.ttl_s, now)
        )


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
