"""The web console on the HTTP port: its pages and the small JSON API they read.

Routes (``server/http.py`` sends them here):

| request | answer |
| --- | --- |
| ``GET /`` | the console page (``console_static/index.html``) |
| ``GET /console/<file>`` | its script and style sheet |
| ``GET /api/health`` | ``/health``'s report, the version, the uptime, who is logged in |
| ``GET /api/streams`` | every stream: state, segments, bytes held, events and bytes appended |
| ``GET /api/groups`` | every reader group: its streams, readers, and lag per segment |
| ``GET /api/connections`` | per front door: port, connections open and accepted, requests, bytes |
| ``POST /api/streams/seal?stream=S/T`` | an admin seals a stream |

The live tail is not an API route: the page opens ``/rsio`` (RS-IO over
WebSocket, ``docs/protocols/rsio.md``) and subscribes to the stream from its
tail, as any RS-IO client does, with the same credentials.

Auth. With auth off the console is read-only: every API answers, and no
one can change anything (the seal route answers 403). With
``--auth-password-file`` every API request needs credentials, checked as
the RS-IO door checks them: ``Authorization: Basic`` (or ``Bearer`` with a
delegation token) on each request, or a TLS client certificate the password
file names; no cookie or session is kept. A user sees the streams and
groups it may READ. An admin, a user holding READ_UPDATE on ``prn::/``
(everything), may also seal streams. ``--auth-trust-unauthenticated http``
lets unidentified clients read everything, never act.

Bounded work. Each answer is built from what the server holds in memory
(the controller's records, the store's segment states and table indexes,
the listeners' counters), never from disk, and every list is capped by a
named constant below; a capped list says so (``truncated``).
"""

from __future__ import annotations

import json
import logging
import platform
from dataclasses import dataclass
from importlib import resources
from typing import Final
from urllib.parse import parse_qs, unquote, urlsplit

from headrace import __version__
from headrace.controller.auth import AuthFailed
from headrace.controller.model import MAX_SCOPES, ControllerModel
from headrace.controller.naming import segment_name
from headrace.errors import HeadraceError
from headrace.protocols.pravega.auth import (
    ROOT,
    Permission,
    stream_resource,
)
from headrace.server._context import ListenerContext
from headrace.server.authz import ConnectionAccess
from headrace.server.metrics import MeteredDiskStore

__all__ = [
    "GROUP_TABLE_SUFFIX",
    "MAX_API_GROUPS",
    "MAX_API_STREAMS",
    "MAX_GROUP_ENTRIES",
    "MAX_QUERY_FIELDS",
    "MAX_SIZED_SEGMENTS",
    "ApiAnswer",
    "Console",
    "StaticFile",
]

log = logging.getLogger(__name__)

MAX_API_STREAMS: Final = 1000
"""Streams one ``/api/streams`` answer lists: a page a browser draws in an
instant, and an answer of some hundred kilobytes at most."""

MAX_API_GROUPS: Final = 100
"""Reader groups one ``/api/groups`` answer lists."""

MAX_GROUP_ENTRIES: Final = 1000
"""Entries (segment positions, readers) read of one reader group's table."""

MAX_SIZED_SEGMENTS: Final = 10_000
"""Segments whose sizes one ``/api/streams`` answer looks up; past it the
remaining streams' ``bytes`` are null (each look-up is a dictionary read)."""

MAX_QUERY_FIELDS: Final = 8
"""Fields of an API request's query string parsed (the API takes one at most)."""

GROUP_TABLE_SUFFIX: Final = "_hrgroup/"
"""What names a reader group's table segment (``client/reader.py``):
``S/G_hrgroup/0.#epoch.0``."""

STATIC_PACKAGE: Final = "headrace.server"
STATIC_DIR: Final = "console_static"

CONSOLE_HEADER: Final = "x-headrace-console"
"""A request header the console's script sends: a 401 to it carries no
``WWW-Authenticate: Basic``, so the browser shows the console's login form
instead of its own dialog."""

SECURITY_HEADERS: Final = (
    (
        "Content-Security-Policy",
        "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)
"""Headers of every console answer: only the server's own script runs, the
page is never framed by another site, and nothing is cached."""


@dataclass(frozen=True, slots=True)
class StaticFile:
    """One file of the console, read once from the package."""

    body: bytes
    content_type: str


@dataclass(frozen=True, slots=True)
class ApiAnswer:
    """A JSON answer: status, body, extra headers."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}


def _load_static() -> dict[str, StaticFile]:
    """Path -> file: ``/`` the page, ``/console/<name>`` the others."""
    files: dict[str, StaticFile] = {}
    folder = resources.files(STATIC_PACKAGE).joinpath(STATIC_DIR)
    for entry in folder.iterdir():
        name = entry.name
        suffix = name[name.rfind(".") :] if "." in name else ""
        if suffix not in _TYPES:
            continue
        static = StaticFile(entry.read_bytes(), _TYPES[suffix])
        files["/" if name == "index.html" else f"/console/{name}"] = static
    return files


def _json(status: int, value: object, *headers: tuple[str, str]) -> ApiAnswer:
    return ApiAnswer(status, json.dumps(value, sort_keys=True).encode() + b"\n", headers)


def _error(status: int, message: str, *headers: tuple[str, str]) -> ApiAnswer:
    return _json(status, {"error": message}, *headers)


@dataclass(slots=True)
class _Caller:
    """Who asks, and what they may see."""

    access: ConnectionAccess

    @property
    def user(self) -> str | None:
        identity = self.access.identity
        return None if identity is None else (identity.user or "token")

    def may_read(self, scope: str, stream: str) -> bool:
        return self.access.may(stream_resource(scope, stream), Permission.READ)

    @property
    def admin(self) -> bool:
        """Auth on, identified, and READ_UPDATE on everything."""
        return (
            self.access.enforced
            and self.access.identity is not None
            and self.access.may(ROOT, Permission.READ_UPDATE)
        )


class Console:
    """The console of one HTTP listener: static files and the API (``server/http.py``)."""

    API_PATHS: Final = ("/api/health", "/api/streams", "/api/groups", "/api/connections")
    ACTION_PATHS: Final = ("/api/streams/seal",)

    def __init__(self, app: ListenerContext) -> None:
        self._app = app
        self.static = _load_static()

    @staticmethod
    def is_api(path: str) -> bool:
        return path in Console.API_PATHS or path in Console.ACTION_PATHS

    # -- answering

    async def answer(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        peer: object,
        peer_cert: dict[str, object] | None,
    ) -> ApiAnswer:
        """The answer to an API request (never raises for what a client sends)."""
        split = urlsplit(target)
        try:
            path, query = split.path, parse_qs(split.query, max_num_fields=MAX_QUERY_FIELDS)
        except ValueError:
            return _error(400, f"a query has at most {MAX_QUERY_FIELDS} fields")
        action = path in self.ACTION_PATHS
        if method != ("POST" if action else "GET") and not (method == "HEAD" and not action):
            return _error(
                405,
                f"{path} takes {'POST' if action else 'GET'}",
                ("Allow", "POST" if action else "GET"),
            )
        access = ConnectionAccess.of(self._app.door_auth, "http", peer, peer_cert)
        authorization = headers.get("authorization")
        if authorization and access.enforced:
            try:
                await access.login(authorization)
            except AuthFailed as exc:
                return self._unauthorized(str(exc), headers)
        if access.enforced and access.identity is None and not access.trusted:
            access.check(ROOT, Permission.READ)  # counts the refusal as unidentified
            return self._unauthorized("log in: auth is on", headers)
        caller = _Caller(access)
        if action:
            return await self._seal(caller, query)
        if path == "/api/health":
            return self._health(caller)
        if path == "/api/streams":
            return self._streams(caller)
        if path == "/api/groups":
            return self._groups(caller)
        return self._connections()

    def _unauthorized(self, message: str, headers: dict[str, str]) -> ApiAnswer:
        if CONSOLE_HEADER in headers:
            return _error(401, message)
        return _error(401, message, ("WWW-Authenticate", 'Basic realm="headrace"'))

    def _health(self, caller: _Caller) -> ApiAnswer:
        ok, report = self._app.health()
        metrics = self._app.metrics
        report.update(
            version=__version__,
            python=platform.python_version(),
            started_s=round(metrics.started_s, 3),
            auth=caller.access.enforced,
            user=caller.user,
            admin=caller.admin,
        )
        return _json(200 if ok else 503, report)

    def _streams(self, caller: _Caller) -> ApiAnswer:
        model = self._app.controller
        store = self._app.store
        sized = store if isinstance(store, MeteredDiskStore) else None
        tally = self._app.metrics.streams
        lookups = 0
        streams: list[dict[str, object]] = []
        truncated = False
        for scope in model.list_scopes(limit=MAX_SCOPES):
            for stream in model.list_streams(scope, limit=MAX_API_STREAMS + 1):
                if stream.startswith("_") or not caller.may_read(scope, stream):
                    continue  # the controller's own streams (_RG, _MARK) are not the user's
                if len(streams) >= MAX_API_STREAMS:
                    truncated = True
                    break
                try:
                    segments = model.segments_between(scope, stream, {}, {})
                    active = len(model.current_segments(scope, stream))
                except HeadraceError:  # a bad head cut: list the stream, without sizes
                    segments, active = [], 0
                held: int | None = None
                if sized is not None and lookups + len(segments) <= MAX_SIZED_SEGMENTS:
                    lookups += len(segments)
                    held = 0
                    for segment in segments:
                        state = sized.segment_size(segment_name(scope, stream, segment.id))
                        if state is not None:
                            held += state[0]
                counts = tally.get(f"{scope}/{stream}")
                tail = None if sized is None else _tail_cut(sized, scope, stream, model)
                streams.append(
                    {
                        "name": f"{scope}/{stream}",
                        "scope": scope,
                        "stream": stream,
                        "sealed": model.is_sealed(scope, stream),
                        "segments": active,
                        "segments_total": len(segments),
                        "bytes": held,
                        "events": None if counts is None else counts[0],
                        "appended_bytes": None if counts is None else counts[1],
                        "tail": tail,
                    }
                )
            if truncated:
                break
        return _json(200, {"streams": streams, "truncated": truncated, "limit": MAX_API_STREAMS})

    def _groups(self, caller: _Caller) -> ApiAnswer:
        store = self._app.store
        if not isinstance(store, MeteredDiskStore):
            return _json(200, {"groups": [], "truncated": False, "limit": MAX_API_GROUPS})
        names = store.table_names(GROUP_TABLE_SUFFIX, MAX_API_GROUPS + 1)
        truncated = len(names) > MAX_API_GROUPS
        groups: list[dict[str, object]] = []
        for table in names[:MAX_API_GROUPS]:
            scope, _, rest = table.partition("/")
            pseudo = rest.partition("/")[0]
            group = pseudo.removesuffix(GROUP_TABLE_SUFFIX.rstrip("/"))
            if not caller.may_read(scope, pseudo):
                continue
            groups.append(self._group(store, table, scope, group))
        return _json(200, {"groups": groups, "truncated": truncated, "limit": MAX_API_GROUPS})

    def _group(
        self, store: MeteredDiskStore, table: str, scope: str, group: str
    ) -> dict[str, object]:
        entries = store.cached_table(table, MAX_GROUP_ENTRIES)
        out: dict[str, object] = {"name": f"{scope}/{group}", "scope": scope, "group": group}
        if entries is None:
            out.update(known=False, streams=[], readers=[], segments=[], lag=None)
            return out
        streams: list[str] = []
        readers: list[str] = []
        segments: list[dict[str, object]] = []
        lag = 0
        for key, value in entries:
            try:
                text, decoded = key.decode(), json.loads(value)
            except (UnicodeDecodeError, ValueError):
                continue
            if not isinstance(decoded, dict):
                continue
            if text == "config":
                listed = decoded.get("streams")
                if isinstance(listed, list):
                    streams = [str(name) for name in listed[:MAX_GROUP_ENTRIES]]
            elif text.startswith("reader/"):
                readers.append(text.removeprefix("reader/"))
            elif text.startswith("segment/"):
                name = text.removeprefix("segment/")
                offset = decoded.get("offset")
                length = store.segment_length(name)  # offsets count from 0, not the start
                behind: int | None = None
                if decoded.get("done"):
                    behind = 0
                elif isinstance(offset, int) and length is not None:
                    behind = max(0, length - offset)
                lag += behind or 0
                segments.append(
                    {
                        "segment": name,
                        "offset": offset if isinstance(offset, int) else None,
                        "length": length,
                        "lag": behind,
                        "owner": decoded.get("owner"),
                        "done": bool(decoded.get("done")),
                    }
                )
        out.update(known=True, streams=streams, readers=readers, segments=segments, lag=lag)
        return out

    def _connections(self) -> ApiAnswer:
        _, report = self._app.health()
        listeners = report.get("listeners")
        assert isinstance(listeners, dict)
        observers = self._app.metrics.listeners()
        doors = []
        for name, entry in sorted(listeners.items()):
            seen = observers.get(name)
            doors.append(
                {
                    "door": name,
                    "port": entry["port"],
                    "up": entry["up"],
                    "open": 0 if seen is None else seen.open_now,
                    "accepted": 0 if seen is None else seen.accepted,
                    "requests": 0 if seen is None else seen.requests,
                    "received_bytes": 0 if seen is None else seen.received,
                    "sent_bytes": 0 if seen is None else seen.sent,
                }
            )
        return _json(200, {"doors": doors})

    async def _seal(self, caller: _Caller, query: dict[str, list[str]]) -> ApiAnswer:
        if not caller.admin:
            why = (
                "auth is off: the console is read-only"
                if not caller.access.enforced
                else ("only an admin (READ_UPDATE on prn::/) may seal a stream")
            )
            return _error(403, why)
        names = query.get("stream", [])
        scope, _, stream = unquote(names[0] if names else "").partition("/")
        model = self._app.controller
        if not scope or not stream or not model.stream_exists(scope, stream):
            return _error(404, f"no such stream {scope}/{stream}")
        try:
            await model.seal_stream(scope, stream)
        except HeadraceError as exc:
            return _error(409, f"sealing {scope}/{stream} failed: {exc}")
        log.info("console: %s sealed stream %s/%s", caller.user, scope, stream)
        return _json(200, {"sealed": f"{scope}/{stream}"})


def _tail_cut(
    store: MeteredDiskStore, scope: str, stream: str, model: ControllerModel
) -> str | None:
    """The stream cut at the end of the stream's active segments, in RS-IO's
    publisher string form (``<segment id>:<offset>,...``); None when sealed, or
    when a segment's length is not known here. The live tail subscribes from it,
    so an event appended after the page read it is never missed."""
    cut: list[str] = []
    for segment in model.current_segments(scope, stream):
        length = store.segment_length(segment_name(scope, stream, segment.id))
        if length is None:
            return None
        cut.append(f"{segment.id}:{length}")
    return ",".join(cut) or None
