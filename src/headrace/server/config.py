"""Typed server configuration: what ``headrace serve`` runs with.

Defaults "just work" (``docs/architecture.md#defaults``): every listener on 127.0.0.1 at its
default port, data in ``./headrace-data``, fsync on acknowledge. A port of 0
disables that listener. The listener names and port flags are stable: scripts
and docs depend on them.

``OPTIONS`` is the one table of settings. Each row gives a TOML key (in the
``--config`` file), a flag (``--`` and the key with dashes) and an environment
variable (``HEADRACE_`` and the key in capitals); the CLI builds its flags from
it, ``docs/configuration.md`` is generated from it, and ``build_config`` turns
the chosen values into a ``ServerConfig``. Priority, lowest first: defaults,
the TOML file, the environment, flags.
"""

from __future__ import annotations

import dataclasses
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from headrace.cluster.layout import (
    DEFAULT_CLUSTER_CONTAINERS,
    MAX_CLUSTER_CONTAINERS,
    MAX_REPLICATION_FACTOR,
    ClusterUrl,
    check_node_id,
    parse_cluster_url,
)
from headrace.cluster.replication import DEFAULT_MIN_IN_SYNC, DEFAULT_REPLICA_LAG_MAX_S
from headrace.controller.auth import (
    DEFAULT_TOKEN_TTL_S,
    LOGIN_FAILURE_BURST,
    LOGIN_FAILURE_INTERVAL_S,
)
from headrace.controller.service import AUTO_SCALE_INTERVAL_S as DEFAULT_AUTO_SCALE_INTERVAL_S
from headrace.controller.service import RETENTION_INTERVAL_S as DEFAULT_RETENTION_INTERVAL_S
from headrace.controller.watermarks import WATERMARK_INTERVAL_S
from headrace.errors import ConfigError
from headrace.protocols.http import ANY_ORIGIN, HEADER_TIMEOUT_S, normalize_origin
from headrace.protocols.lumberjack import (
    MAX_DECOMPRESSED_BYTES,
    MAX_FRAME_BYTES,
    MAX_WINDOW_COUNT,
)
from headrace.protocols.tank import FIRST_REQUEST_TIMEOUT_S as TANK_FIRST_REQUEST_TIMEOUT_S
from headrace.server._budget import MAX_TOTAL_BUFFERED_BYTES
from headrace.server._loop import (
    IDLE_TIMEOUT_S,
    MAX_BUFFERED_BYTES,
    MAX_CONNECTIONS,
    MAX_PENDING_EVENTS,
    PARTIAL_FRAME_TIMEOUT_S,
    ConnectionLimits,
)
from headrace.server._loop import MAX_FRAME_BYTES as LOOP_MAX_FRAME_BYTES
from headrace.server.lumberjack_config import (
    DEFAULT_ROUTING_KEY_FIELDS,
    DEFAULT_STREAM,
    KEEPALIVE_INTERVAL_S,
    MAX_PENDING_BYTES,
    WINDOW_LINGER_S,
    LumberjackConfig,
)
from headrace.server.lumberjack_config import IDLE_TIMEOUT_S as LUMBERJACK_IDLE_TIMEOUT_S
from headrace.server.metrics import METRICS_STREAMS
from headrace.server.tls import VERIFY_CLIENT_MODES, TlsConfig
from headrace.store.api import MAX_SEGMENT_ATTRIBUTES, FsyncPolicy
from headrace.store.disk.layout import MAX_CONTAINER_COUNT

__all__ = [
    "DEFAULT_AUTO_SCALE_INTERVAL_S",
    "DEFAULT_PORTS",
    "DEFAULT_RETENTION_INTERVAL_S",
    "DOORS",
    "LISTENER_NAMES",
    "LOG_FORMATS",
    "MAX_TOKEN_TTL_S",
    "OPTIONS",
    "TRUSTABLE_LISTENERS",
    "AuthConfig",
    "ClusterConfig",
    "ConnectionLimits",
    "ListenerSpec",
    "Option",
    "ServerConfig",
    "build_config",
    "parse_listener",
]

DEFAULT_PORTS: dict[str, int] = {
    "controller": 9090,  # Pravega controller (gRPC)
    "segment_store": 12345,  # Pravega segment store (binary wire protocol)
    "tank": 11011,  # TANK broker protocol
    "lumberjack": 5044,  # Lumberjack v1/v2, plain
    "lumberjack_tls": 5045,  # Lumberjack v1/v2 over TLS
    "rsio": 7070,  # Reactive Streams IO
    "http": 9100,  # /metrics and /health
}
LISTENER_NAMES = tuple(DEFAULT_PORTS)

DOORS = ("controller", "segment_store", "tank", "lumberjack", "rsio", "http")
"""The front doors (``listeners.STARTERS``): each serves one protocol on any
number of listeners (``--listener DOOR=SCHEME://HOST:PORT``). The port flags
name listeners of these doors; ``lumberjack_tls`` is the ``lumberjack`` door
over TLS."""

SCHEMES = ("plain", "tls")
"""``--listener`` schemes: ``tls`` needs ``--tls-cert`` and ``--tls-key``."""

MAX_LISTENERS = 64
"""Most ``--listener`` entries: each is a socket and, for the controller, a gRPC
server with its own threads; a list longer than this is a mistake."""

_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
"""Bind addresses that take a port on every address of the machine."""

_EXTRA_NAME = re.compile(r"^([a-z_]+)_([2-9]|[1-9][0-9]+)$")
"""The name of a door's second and later ``--listener``: ``tank_2``."""

_ADVERTISED_HOST = re.compile(r"^[A-Za-z0-9._-]{1,253}$|^\[?[0-9A-Fa-f:.]{2,45}\]?$")
"""``?advertise=``: a host name or an IP address, which clients are handed as is."""

TRUSTABLE_LISTENERS = ("tank", "lumberjack", "lumberjack_tls", "rsio", "http")
"""Listeners ``--auth-trust-unauthenticated`` may name: the front doors whose
clients identify themselves by certificate (or RS-IO's ``auth`` extension).
The Pravega doors always take credentials: their clients all have them.
A later ``--listener`` of these doors (``tank_2``) may be named too."""


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    """One listener to start: a front door on an address, plain or over TLS.

    Attributes:
        name: unique among the listeners: in logs, metrics, ``/health``, the
            ready line and ``--auth-trust-unauthenticated``. A port flag's
            listener has the flag's name; a door's first ``--listener`` has the
            door's name, its later ones ``door_2``, ``door_3``...
        door: which front door (one of ``DOORS``).
        tls: serve TLS (the server's one certificate) rather than plaintext.
        host, port: where to bind; port is never 0.
        advertise_host: the host clients are told to reach this listener at
            (``?advertise=``); None: ``--advertise-host``, else ``host``.
    """

    name: str
    door: str
    tls: bool
    host: str
    port: int
    advertise_host: str | None = None

    @property
    def scheme(self) -> str:
        return "tls" if self.tls else "plain"

    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_listener(text: str) -> ListenerSpec:
    """One ``--listener DOOR=SCHEME://HOST:PORT[?advertise=HOST]`` value, unnamed.

    The door may be spelt with dashes or underscores (``segment-store``); an
    IPv6 host goes in brackets; an empty host means ``--host`` (left empty
    here). The name is given by ``ServerConfig.listener_plan``.

    Raises:
        ConfigError: an unknown door or scheme, or a missing or bad host or port.
    """
    where = f"--listener {text!r}"
    door_text, sep, url = text.strip().partition("=")
    door = door_text.strip().lower().replace("-", "_")
    if not sep:
        raise ConfigError(f"{where}: expected DOOR=SCHEME://HOST:PORT")
    if door not in DOORS:
        doors = ", ".join(d.replace("_", "-") for d in DOORS)
        raise ConfigError(f"{where}: unknown door {door_text.strip()!r} (one of {doors})")
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ConfigError(f"{where}: expected DOOR=SCHEME://HOST:PORT")
    if scheme.lower() not in SCHEMES:
        raise ConfigError(f"{where}: unknown scheme {scheme!r} (one of {', '.join(SCHEMES)})")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if parts.path or parts.fragment or parts.username is not None:
        raise ConfigError(f"{where}: expected SCHEME://HOST:PORT[?advertise=HOST]")
    if port is None or not 1 <= port <= MAX_PORT:
        raise ConfigError(f"{where}: needs a port in 1..{MAX_PORT}")
    advertise: str | None = None
    if parts.query:
        key, sep, value = parts.query.partition("=")
        if key != "advertise" or not sep:
            raise ConfigError(f"{where}: the only query is ?advertise=HOST")
        if not _ADVERTISED_HOST.match(value):
            raise ConfigError(f"{where}: {value!r} is not a host name or address")
        advertise = value.strip("[]")
    host = parts.hostname or ""
    return ListenerSpec("", door, scheme.lower() == "tls", host, port, advertise)


def _overlap(a: ListenerSpec, b: ListenerSpec) -> bool:
    """Whether two listeners would bind the same port on a common address."""
    return a.port == b.port and (
        a.host == b.host or a.host in _WILDCARD_HOSTS or b.host in _WILDCARD_HOSTS
    )


MAX_PORT = 65535

DEFAULT_FSYNC_INTERVAL_S = 1.0
"""``--fsync interval``: at most this much acknowledged data is exposed to a power cut."""

DEFAULT_CONTAINER_COUNT = 4
"""Segment containers per store, as in Pravega standalone; fixed when a data dir is created.
A cluster's first node fixes the cluster's count instead (``DEFAULT_CLUSTER_CONTAINERS``)."""

MAX_TOKEN_TTL_S = 7 * 24 * 3600
"""Longest ``--auth-token-ttl``: a token cannot be revoked before it expires
(removing a user stops new tokens, not issued ones), so its life stays short."""

LOG_FORMATS = ("text", "json")
"""``--log-format``: human-readable lines, or one JSON object per line."""


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Pravega-style auth (``--auth-password-file``); see ``docs/threat-model.md``."""

    password_file: Path
    """Users, password hashes, grants and certificate names (``headrace user add|remove``)."""
    token_ttl_s: int = DEFAULT_TOKEN_TTL_S
    """Lifetime of the delegation tokens the controller signs."""
    trusted_listeners: frozenset[str] = frozenset()
    """Listeners (of ``TRUSTABLE_LISTENERS``) whose clients may do anything
    without identifying themselves (``--auth-trust-unauthenticated``)."""
    failed_login_burst: int = LOGIN_FAILURE_BURST
    """Password checks one peer address may fail in a row (``LoginLimiter``)."""
    failed_login_interval_s: float = LOGIN_FAILURE_INTERVAL_S
    """One more check per this many seconds once the burst is used up."""


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """``--cluster``: one node of several, coordinated by ZooKeeper (``docs/cluster.md``)."""

    url: ClusterUrl
    node_id: str
    container_count: int | None = None
    """``--container-count`` if given: the count of a cluster this node creates
    (None: ``DEFAULT_CLUSTER_CONTAINERS``); a cluster that exists keeps its own."""
    replication_factor: int = 1
    """``--replication-factor``: copies of each container of a cluster this node
    creates (``docs/replication.md``); a cluster that exists keeps its own."""
    min_in_sync: int = DEFAULT_MIN_IN_SYNC
    """``--min-insync``: in-sync copies needed to acknowledge (at most the factor)."""
    replica_lag_max_s: float = DEFAULT_REPLICA_LAG_MAX_S
    """``--replica-lag-max-s``: how long a follower may lag before it leaves the in-sync set."""


@dataclass(slots=True)
class ServerConfig:
    """Everything ``headrace serve`` needs to start."""

    data_dir: Path = Path("headrace-data")
    host: str = "127.0.0.1"
    advertise_host: str | None = None
    """Host name the controller gives clients for the segment store (``getURI``)
    and, in a cluster, the host of every door in ``/nodes/<id>``; None: ``host``.
    With TLS it must be a DNS name on the certificate."""
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_s: float = DEFAULT_FSYNC_INTERVAL_S
    container_count: int = DEFAULT_CONTAINER_COUNT
    max_segment_attributes: int = MAX_SEGMENT_ATTRIBUTES
    """Attributes (Pravega writer ids and their event numbers) a segment keeps;
    the least recently set are dropped past it (``store/api.py``)."""
    retention_interval_s: float = DEFAULT_RETENTION_INTERVAL_S
    auto_scale_interval_s: float = DEFAULT_AUTO_SCALE_INTERVAL_S
    watermark_interval_s: float = WATERMARK_INTERVAL_S
    """Seconds between watermark rounds (``controller/watermarks.py``)."""
    tank_scope: str = "tank"  # the scope holding TANK topics (architecture.md#tank-topics)
    tank_first_request_timeout_s: float = TANK_FIRST_REQUEST_TIMEOUT_S
    """A TANK connection with no request this long after opening is closed (as TANK does)."""
    ports: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))
    """The port flags' listeners (``--tank-port`` ...); a door named by a
    ``--listener`` is served by those instead."""
    listeners: tuple[ListenerSpec, ...] = ()
    """``--listener`` entries, as given (``parse_listener``; names and empty
    hosts are filled in by ``listener_plan``)."""
    tls: TlsConfig | None = None
    """Certificate for every TLS listener (``--tls-cert/--tls-key/--tls-ca``); None: no TLS."""
    auth: AuthConfig | None = None
    """Who may do what on every front door (``server/authz.py``); None: auth off."""
    lumberjack: LumberjackConfig = field(default_factory=LumberjackConfig)
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    """Per-connection and per-listener limits of every TCP front door."""
    max_total_buffered_bytes: int = MAX_TOTAL_BUFFERED_BYTES
    """Bytes all connections may hold together before reading pauses (``MemoryBudget``)."""
    http_header_timeout_s: float = HEADER_TIMEOUT_S
    """An HTTP port client with no whole request this long after its connection
    or its previous response is closed."""
    http_allowed_origins: tuple[str, ...] = ()
    """Origins (normalized, ``protocols.http.normalize_origin``) whose pages may
    open ``/rsio`` besides the server's own; ``*``: any."""
    metrics_streams: int = METRICS_STREAMS
    """Streams with their own ``stream`` label in ``/metrics`` (``server/metrics.py``)."""
    log_format: str = "text"
    cluster: ClusterConfig | None = None
    """None: a single node, as without ``--cluster``."""
    cluster_secret_file: Path | None = None
    """``--cluster-secret-file``: the key every node of a cluster shares, to sign
    and check node tokens (and, with auth on, every delegation token)."""

    def validate(self) -> None:
        """Raise ``ConfigError`` for any value out of range."""
        for name, port in self.ports.items():
            if name not in DEFAULT_PORTS:
                raise ConfigError(f"unknown listener {name!r}")
            if not 0 <= port <= MAX_PORT:
                raise ConfigError(f"--{name.replace('_', '-')}-port {port} is not in 0..{MAX_PORT}")
        if self.fsync_interval_s <= 0:
            raise ConfigError("fsync interval must be positive")
        if self.retention_interval_s <= 0:
            raise ConfigError("--retention-interval must be positive")
        if self.auto_scale_interval_s <= 0:
            raise ConfigError("--auto-scale-interval must be positive")
        if self.watermark_interval_s <= 0:
            raise ConfigError("--watermark-interval must be positive")
        if self.container_count < 1:
            raise ConfigError("container count must be at least 1")
        if self.max_segment_attributes < 1:
            raise ConfigError("--max-segment-attributes must be at least 1")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"--log-format {self.log_format!r} is not one of {LOG_FORMATS}")
        for name in ("max_connections", "max_frame_bytes", "max_buffered_bytes"):
            if getattr(self.limits, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
        if self.limits.max_pending_requests < 1:
            raise ConfigError("--max-pending-requests must be at least 1")
        if not self.limits.idle_timeout_s > 0:
            raise ConfigError("--idle-timeout must be positive")
        if self.max_total_buffered_bytes < self.limits.max_frame_bytes:
            raise ConfigError(
                "--max-total-buffered-bytes must be at least --max-frame-bytes "
                f"({self.limits.max_frame_bytes}): a frame must fit in the budget"
            )
        if not self.limits.partial_frame_timeout_s > 0:
            raise ConfigError("--partial-frame-timeout must be positive")
        if not self.tank_first_request_timeout_s > 0:
            raise ConfigError("--tank-first-request-timeout must be positive")
        if not self.http_header_timeout_s > 0:
            raise ConfigError("--http-header-timeout must be positive")
        if self.metrics_streams < 0:
            raise ConfigError("--metrics-streams must be at least 0")
        self.lumberjack.validate()
        self._validate_listeners()
        enabled = self.enabled_listeners()
        if (
            "tank" in enabled
            and enabled.keys() & {"lumberjack", "lumberjack_tls"}
            and self.tank_scope in self.lumberjack.scopes()
        ):
            lumberjack = self.lumberjack
            default_in_tank = lumberjack.scope_and_stream[0] == self.tank_scope
            which = (
                f"--lumberjack-default-stream {lumberjack.default_stream!r}"
                if lumberjack.template is not None and default_in_tank
                else f"--lumberjack-stream {lumberjack.stream!r}"
            )
            raise ConfigError(
                f"{which} is in the TANK scope "
                f"{self.tank_scope!r}, whose streams hold only TANK bundles"
            )

    def _validate_listeners(self) -> None:
        """``--listener`` entries against the certificate, the port flags and each other.

        Raises:
            ConfigError: too many entries, ``tls`` without a certificate, a port
                flag set for a door its ``--listener`` entries serve, a port two
                listeners would bind, or a trusted listener that does not exist.
        """
        if len(self.listeners) > MAX_LISTENERS:
            raise ConfigError(f"--listener: at most {MAX_LISTENERS} listeners")
        for spec in self.listeners:
            if spec.tls and self.tls is None:
                raise ConfigError(
                    f"--listener {spec.door.replace('_', '-')}=tls://{spec.address()}: "
                    "tls needs --tls-cert and --tls-key"
                )
        explicit = {spec.door for spec in self.listeners}
        for name, port in self.ports.items():
            door = "lumberjack" if name == "lumberjack_tls" else name
            if door in explicit and port not in (0, DEFAULT_PORTS.get(name)):
                flag = f"--{name.replace('_', '-')}-port"
                raise ConfigError(
                    f"{flag} {port} and --listener {door.replace('_', '-')}=... both say "
                    "where that door listens; use one"
                )
        plan = self.listener_plan()
        for i, spec in enumerate(plan):
            for other in plan[:i]:
                if _overlap(spec, other):
                    raise ConfigError(
                        f"port {spec.port} is used twice: by {other.name} "
                        f"({other.address()}) and {spec.name} ({spec.address()})"
                    )
        if self.auth is not None:
            names = {spec.name for spec in plan}
            for name in sorted(self.auth.trusted_listeners - set(TRUSTABLE_LISTENERS)):
                if name not in names:
                    raise ConfigError(f"--auth-trust-unauthenticated: no listener {name!r}")

    def listener_plan(self) -> tuple[ListenerSpec, ...]:
        """Every listener to start, named, in order: the port flags' (doors
        without ``--listener`` entries; port not 0, ``lumberjack_tls`` only with a
        certificate), then the ``--listener`` entries.

        A port flag's listener serves TLS when a certificate is configured,
        but ``lumberjack`` (plain) and ``lumberjack_tls`` (always TLS).
        """
        explicit = {spec.door for spec in self.listeners}
        inactive = self.inactive_listeners()
        plan: list[ListenerSpec] = []
        for name, port in self.ports.items():
            door = "lumberjack" if name == "lumberjack_tls" else name
            if port == 0 or name in inactive or door in explicit or name not in DEFAULT_PORTS:
                continue
            tls = name == "lumberjack_tls" or (name != "lumberjack" and self.tls is not None)
            plan.append(ListenerSpec(name, door, tls, self.host, port))
        count: dict[str, int] = {}
        for spec in self.listeners:
            count[spec.door] = n = count.get(spec.door, 0) + 1
            name = spec.door if n == 1 else f"{spec.door}_{n}"
            plan.append(
                ListenerSpec(
                    name,
                    spec.door,
                    spec.tls,
                    spec.host or self.host,
                    spec.port,
                    spec.advertise_host,
                )
            )
        return tuple(plan)

    def enabled_listeners(self) -> dict[str, int]:
        """Listeners to start, name -> port (``listener_plan``)."""
        return {spec.name: spec.port for spec in self.listener_plan()}

    def inactive_listeners(self) -> dict[str, str]:
        """Listeners with a port that will not start, and why (for the startup log)."""
        replaced = "lumberjack" in {spec.door for spec in self.listeners}
        if self.tls is None and self.ports.get("lumberjack_tls", 0) != 0 and not replaced:
            return {"lumberjack_tls": "no --tls-cert/--tls-key given"}
        return {}


# --------------------------------------------------------------------------- the option table

OptionValue = int | float | str | Path | Sequence[str] | None


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: TOML key ``key``, flag ``--key-with-dashes``, env ``HEADRACE_KEY``.

    Attributes:
        key: the TOML key; also names the flag and the environment variable.
        kind: ``int``, ``float``, ``str`` or ``Path`` (a path in a string).
        default: the value when nothing sets it (None: unset).
        help: one line for ``--help`` and the docs.
        section: heading in ``docs/configuration.md``.
        minimum, maximum: the allowed range of a number (inclusive).
        choices: the allowed strings.
        existing_file: a ``Path`` that must name an existing file.
        aliases: other flags for the same setting (``--containers``).
        multiple: the option may be given many times (``str`` values).
    """

    key: str
    kind: type[int] | type[float] | type[str] | type[Path]
    default: OptionValue
    help: str
    section: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    existing_file: bool = False
    aliases: tuple[str, ...] = ()
    multiple: bool = False
    """Repeatable: a list in TOML, one value per flag, values separated by
    whitespace in the environment variable."""

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def envvar(self) -> str:
        return "HEADRACE_" + self.key.upper()


def _port(name: str, port: int) -> Option:
    return Option(
        f"{name}_port",
        int,
        port,
        f"Port of the {name.replace('_', ' ')} listener (0 disables it).",
        "Listeners",
        0,
        MAX_PORT,
    )


OPTIONS: tuple[Option, ...] = (
    # -- general
    Option(
        "data_dir", Path, Path("headrace-data"), "Directory holding all stored data.", "General"
    ),
    Option(
        "host",
        str,
        "127.0.0.1",
        "Address the port flags' listeners bind (and a --listener with no HOST).",
        "General",
    ),
    Option(
        "advertise_host",
        str,
        None,
        "Host the controller tells clients to reach the segment store at (default: --host); "
        "with --cluster, the host every door of this node is announced at; "
        "with TLS, a DNS name on the certificate.",
        "General",
    ),
    Option(
        "fsync",
        str,
        FsyncPolicy.ALWAYS.value,
        "always: ack after fsync (group commit); interval: fsync every --fsync-interval; "
        "never: leave it to the OS.",
        "General",
        choices=tuple(p.value for p in FsyncPolicy),
    ),
    Option(
        "fsync_interval",
        float,
        DEFAULT_FSYNC_INTERVAL_S,
        "Seconds between fsyncs under --fsync interval.",
        "General",
        0.001,
    ),
    Option(
        "container_count",
        int,
        None,
        f"Segment containers of a new data directory (a directory keeps its own): default "
        f"{DEFAULT_CONTAINER_COUNT}; with --cluster, the count a new cluster gets (default "
        f"{DEFAULT_CLUSTER_CONTAINERS}, at most {MAX_CLUSTER_CONTAINERS}), "
        "fixed by its first node. Also --containers.",
        "General",
        1,
        MAX_CONTAINER_COUNT,
        aliases=("--containers",),
    ),
    Option(
        "max_segment_attributes",
        int,
        MAX_SEGMENT_ATTRIBUTES,
        "Writer ids (with their last event numbers) a segment keeps for Pravega append "
        "dedup; past it the least recently used is dropped, and that writer's next "
        "append is stored even if it is a retry.",
        "General",
        1,
    ),
    Option(
        "retention_interval",
        float,
        DEFAULT_RETENTION_INTERVAL_S,
        "Seconds between enforcements of stream retention policies.",
        "General",
        0.001,
    ),
    Option(
        "auto_scale_interval",
        float,
        DEFAULT_AUTO_SCALE_INTERVAL_S,
        "Seconds between checks of auto-scaling stream policies.",
        "General",
        0.001,
    ),
    Option(
        "watermark_interval",
        float,
        WATERMARK_INTERVAL_S,
        "Seconds between watermark rounds: the marks Pravega writers note are folded "
        "into a Watermark appended to the stream's _MARK stream.",
        "General",
        0.001,
    ),
    Option("tank_scope", str, "tank", "Scope whose streams are the TANK topics.", "General"),
    Option(
        "log_format",
        str,
        "text",
        "text: human-readable log lines; json: one JSON object per line.",
        "General",
        choices=LOG_FORMATS,
    ),
    # -- listeners
    *(_port(name, port) for name, port in DEFAULT_PORTS.items()),
    Option(
        "listener",
        str,
        None,
        "A listener: DOOR=SCHEME://HOST:PORT, DOOR one of "
        + ", ".join(door.replace("_", "-") for door in DOORS)
        + ", SCHEME plain or tls (tls: --tls-cert), e.g. tank=plain://127.0.0.1:11011; "
        "an IPv6 HOST in brackets, an empty one means --host; ?advertise=NAME: the host "
        "clients are told to use (controller and segment-store listeners). Repeat it for "
        "more; a door may have several. A door named here is served only by its "
        "--listener entries (its port flag is not used). "
        f"At most {MAX_LISTENERS}.",
        "Listeners",
        multiple=True,
    ),
    # -- limits
    Option(
        "max_connections",
        int,
        MAX_CONNECTIONS,
        "Connections open at once per listener; more are closed at once.",
        "Limits",
        1,
    ),
    Option(
        "max_frame_bytes",
        int,
        LOOP_MAX_FRAME_BYTES,
        "Bytes of one frame still being received (each protocol also has its own limit).",
        "Limits",
        1,
    ),
    Option(
        "max_buffered_bytes",
        int,
        MAX_BUFFERED_BYTES,
        "Reply bytes a peer has not taken before it is dropped.",
        "Limits",
        1,
    ),
    Option(
        "max_total_buffered_bytes",
        int,
        MAX_TOTAL_BUFFERED_BYTES,
        "Bytes all connections of the server may hold together (frames arriving, "
        "replies not taken); beyond it connections holding bytes stop reading until "
        "it frees. At least --max-frame-bytes.",
        "Limits",
        1,
    ),
    Option(
        "max_pending_requests",
        int,
        MAX_PENDING_EVENTS,
        "Requests of one connection handled at once; reading pauses beyond.",
        "Limits",
        1,
    ),
    Option(
        "idle_timeout",
        float,
        IDLE_TIMEOUT_S,
        "Seconds a connection may send nothing before it is closed (Lumberjack: "
        "--lumberjack-idle-timeout).",
        "Limits",
        0.001,
    ),
    Option(
        "partial_frame_timeout",
        float,
        PARTIAL_FRAME_TIMEOUT_S,
        "Seconds a frame may take to arrive once its first byte is in.",
        "Limits",
        0.001,
    ),
    Option(
        "tank_first_request_timeout",
        float,
        TANK_FIRST_REQUEST_TIMEOUT_S,
        "Seconds a TANK connection may go without a request after it opened before "
        "it is closed (the TANK broker's own limit).",
        "Limits",
        0.001,
    ),
    # -- HTTP
    Option(
        "http_header_timeout",
        float,
        HEADER_TIMEOUT_S,
        "Seconds an HTTP port client may take to send a whole request, from its "
        "connection or its previous response; past it the connection is closed.",
        "HTTP",
        0.001,
    ),
    Option(
        "http_allowed_origins",
        str,
        None,
        "Comma-separated origins (scheme://host[:port]) whose web pages may open "
        "/rsio WebSockets besides the server's own; * allows any. Clients that send "
        "no Origin (programs, not browsers) are always let in.",
        "HTTP",
    ),
    Option(
        "metrics_streams",
        int,
        METRICS_STREAMS,
        "Streams that get their own stream label in the per-stream metrics of /metrics "
        "(the first appended to); the rest are summed under stream=_other. 0: no "
        "per-stream labels.",
        "HTTP",
        0,
    ),
    # -- TLS
    Option(
        "tls_cert",
        Path,
        None,
        "PEM certificate chain for TLS listeners (with --tls-key).",
        "TLS",
        existing_file=True,
    ),
    Option("tls_key", Path, None, "PEM private key of --tls-cert.", "TLS", existing_file=True),
    Option(
        "tls_ca",
        Path,
        None,
        "PEM CA bundle: TLS clients must present a certificate it signed (see "
        "--tls-verify-client).",
        "TLS",
        existing_file=True,
    ),
    Option(
        "tls_verify_client",
        str,
        "required",
        "With --tls-ca: required: a client without a certificate is refused at the "
        "handshake; optional: it is let in and must identify itself otherwise (a "
        "password or a token, see Auth) where auth is on. A certificate that is "
        "presented is always checked.",
        "TLS",
        choices=VERIFY_CLIENT_MODES,
    ),
    # -- auth
    Option(
        "auth_password_file",
        Path,
        None,
        "Turn on auth on every front door: users, their grants and the client "
        "certificates that identify them (headrace user add|remove). The controller "
        "checks Basic credentials and signs delegation tokens; the segment store takes "
        "requests with a valid token; TANK and Lumberjack clients are known by their "
        "certificate, RS-IO clients by certificate, credentials or token. Default: auth off.",
        "Auth",
        existing_file=True,
    ),
    Option(
        "auth_trust_unauthenticated",
        str,
        "",
        "Comma-separated listeners (of " + ", ".join(TRUSTABLE_LISTENERS) + ") whose "
        "clients may do everything without identifying themselves, for trusted networks; "
        "a client that does identify itself still gets only its grants. Default: none.",
        "Auth",
    ),
    Option(
        "auth_failed_login_burst",
        int,
        LOGIN_FAILURE_BURST,
        "Password checks one client address may fail in a row; past it each further "
        "attempt is refused (UNAUTHENTICATED) without being checked until the address "
        "earns one more every --auth-failed-login-interval.",
        "Auth",
        1,
    ),
    Option(
        "auth_failed_login_interval",
        float,
        LOGIN_FAILURE_INTERVAL_S,
        "Seconds after which a client address that used up its failed-login burst gets "
        "one more attempt.",
        "Auth",
        0.001,
    ),
    Option(
        "auth_token_ttl",
        int,
        DEFAULT_TOKEN_TTL_S,
        "Seconds a delegation token stays valid (clients fetch a new one in time).",
        "Auth",
        1,
        MAX_TOKEN_TTL_S,
    ),
    # -- Lumberjack
    Option(
        "lumberjack_stream",
        str,
        DEFAULT_STREAM,
        "scope/stream that Lumberjack events go to (created with 4 segments); "
        "{field} placeholders route each event by its fields, e.g. logs/{[@metadata][beat]}.",
        "Lumberjack",
    ),
    Option(
        "lumberjack_default_stream",
        str,
        DEFAULT_STREAM,
        "scope/stream for events a --lumberjack-stream template cannot name a stream for.",
        "Lumberjack",
    ),
    Option(
        "lumberjack_create_streams",
        str,
        "on",
        "on: create the streams a template names when they do not exist; off: their "
        "events go to the default stream.",
        "Lumberjack",
        choices=("on", "off"),
    ),
    Option(
        "lumberjack_metadata",
        str,
        "on",
        "on: add the connection's @metadata (ip_address, tls_peer) to each stored event, "
        "as Logstash's beats input does; off: store events as sent.",
        "Lumberjack",
        choices=("on", "off"),
    ),
    Option(
        "lumberjack_routing_key_fields",
        str,
        ",".join(DEFAULT_ROUTING_KEY_FIELDS),
        "Comma-separated event fields tried for the routing key ([a][b] for nested); "
        "empty: no key.",
        "Lumberjack",
    ),
    Option(
        "lumberjack_keepalive_interval",
        float,
        KEEPALIVE_INTERVAL_S,
        "v2: seconds without a write before an Ack(0) keepalive while a window waits.",
        "Lumberjack",
        0.001,
    ),
    Option(
        "lumberjack_window_linger",
        float,
        WINDOW_LINGER_S,
        "Seconds an incomplete window may receive nothing before its events so far are "
        "stored (for clients that send W once); 0: store windows only whole.",
        "Lumberjack",
        0,
    ),
    Option(
        "lumberjack_idle_timeout",
        float,
        LUMBERJACK_IDLE_TIMEOUT_S,
        "Seconds a Lumberjack connection may send nothing before it is closed.",
        "Lumberjack",
        0.001,
    ),
    Option(
        "lumberjack_max_window",
        int,
        MAX_WINDOW_COUNT,
        "Largest W (window) count accepted.",
        "Lumberjack",
        1,
        2**32 - 1,
    ),
    Option(
        "lumberjack_max_frame_bytes",
        int,
        MAX_FRAME_BYTES,
        "Largest Lumberjack frame.",
        "Lumberjack",
        1024,
    ),
    Option(
        "lumberjack_max_decompressed_bytes",
        int,
        MAX_DECOMPRESSED_BYTES,
        "Inflated bytes allowed per compressed frame (zlib bombs are refused).",
        "Lumberjack",
        1024,
    ),
    Option(
        "lumberjack_max_pending_bytes",
        int,
        MAX_PENDING_BYTES,
        "Unacknowledged event bytes one Lumberjack connection may hold.",
        "Lumberjack",
        1024,
    ),
    # -- cluster
    Option(
        "cluster",
        str,
        None,
        "Join (or create) the cluster kept in ZooKeeper at zk://host:port[,host:port...]/chroot "
        "(port default 2181, chroot default /headrace). Default: one node, no ZooKeeper.",
        "Cluster",
    ),
    Option(
        "node_id",
        str,
        None,
        "This node's id in the cluster, the same at every restart (its containers are "
        "recorded under it): 1 to 64 letters, digits, '.', '_' or '-'. Default: the host name.",
        "Cluster",
    ),
    Option(
        "replication_factor",
        int,
        1,
        "Copies of each container of a cluster this node creates (a cluster keeps the "
        "factor it was created with; it places its containers once that many nodes "
        "joined). Above 1, each container's leader copies every record to its followers "
        "and acknowledges it only once every in-sync copy holds it (docs/replication.md).",
        "Cluster",
        1,
        MAX_REPLICATION_FACTOR,
    ),
    Option(
        "min_insync",
        int,
        DEFAULT_MIN_IN_SYNC,
        "In-sync copies a container of a new cluster needs to acknowledge anything (at "
        "most --replication-factor): with fewer, appends are refused with a retriable "
        "error and reads go on.",
        "Cluster",
        1,
        MAX_REPLICATION_FACTOR,
    ),
    Option(
        "replica_lag_max",
        float,
        DEFAULT_REPLICA_LAG_MAX_S,
        "Seconds a follower may stay behind its leader before it leaves the in-sync set "
        "(appends then no longer wait for it); it rejoins once caught up.",
        "Cluster",
        0.1,
    ),
    Option(
        "cluster_secret_file",
        Path,
        None,
        "The secret every node of a cluster shares (the same file on each; 32 to 4096 "
        "bytes, mode 0600, e.g. head -c 32 /dev/urandom): nodes sign the tokens of "
        "their calls to each other with it, and only such calls may change internal "
        "segments (_system/...) over the segment-store port. With auth on it also "
        "signs every delegation token, instead of the data directory's key. "
        "Default: none (no other node can change internal segments here).",
        "Cluster",
        existing_file=True,
    ),
)
"""Every setting of ``headrace serve``, in the order ``--help`` and the docs list them."""

OPTIONS_BY_KEY: dict[str, Option] = {option.key: option for option in OPTIONS}


def _many(value: OptionValue) -> tuple[str, ...]:
    """A repeatable option's values: a list (flags, TOML), or one string (which
    the environment splits at whitespace)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(value.split())
    if isinstance(value, Sequence):
        return tuple(str(item) for item in value)
    return (str(value),)


def _trustable(name: str) -> bool:
    """A name of ``TRUSTABLE_LISTENERS``, or a later ``--listener`` of one of their doors."""
    extra = _EXTRA_NAME.match(name)
    return name in TRUSTABLE_LISTENERS or (extra is not None and extra[1] in TRUSTABLE_LISTENERS)


def _listener_list(text: str) -> frozenset[str]:
    """``--auth-trust-unauthenticated``: listener names, commas between them.

    Raises:
        ConfigError: a name that is not one of ``TRUSTABLE_LISTENERS`` (or a
            later listener of their doors, ``tank_2``).
    """
    names = frozenset(name.strip().replace("-", "_") for name in text.split(",") if name.strip())
    unknown = sorted(name for name in names if not _trustable(name))
    if unknown:
        raise ConfigError(
            f"--auth-trust-unauthenticated: {unknown[0]!r} is not one of "
            + ", ".join(TRUSTABLE_LISTENERS)
        )
    return names


def build_config(values: Mapping[str, OptionValue]) -> ServerConfig:
    """A validated ``ServerConfig`` from option values (keys of ``OPTIONS``; missing: default).

    Raises:
        ConfigError: an unknown key, or a value out of range (the message names the option).
    """
    unknown = sorted(set(values) - set(OPTIONS_BY_KEY))
    if unknown:
        raise ConfigError(f"unknown option {unknown[0]!r}")
    v = {option.key: values.get(option.key, option.default) for option in OPTIONS}

    def get(key: str, kind: type[int] | type[float] | type[str]) -> int | float | str:
        value = v[key]
        try:
            return kind(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ConfigError(
                f"{OPTIONS_BY_KEY[key].flag}: {value!r} is not a {kind.__name__}"
            ) from None

    tls_cert, tls_key, tls_ca = v["tls_cert"], v["tls_key"], v["tls_ca"]
    if (tls_cert is None) != (tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if tls_ca is not None and tls_cert is None:
        raise ConfigError("--tls-ca needs --tls-cert and --tls-key")
    verify_client = str(get("tls_verify_client", str))
    if verify_client not in VERIFY_CLIENT_MODES:
        raise ConfigError(
            f"--tls-verify-client {verify_client!r} is not one of {', '.join(VERIFY_CLIENT_MODES)}"
        )
    if verify_client != "required" and tls_ca is None:
        raise ConfigError(f"--tls-verify-client {verify_client} needs --tls-ca")
    trusted = _listener_list(str(get("auth_trust_unauthenticated", str)))
    if trusted and v["auth_password_file"] is None:
        raise ConfigError("--auth-trust-unauthenticated needs --auth-password-file")
    fsync = str(get("fsync", str))
    if fsync not in {p.value for p in FsyncPolicy}:
        raise ConfigError(f"--fsync {fsync!r} is not one of always, interval, never")
    fields = str(get("lumberjack_routing_key_fields", str))
    for key in ("lumberjack_create_streams", "lumberjack_metadata"):
        if str(get(key, str)) not in ("on", "off"):
            raise ConfigError(f"{OPTIONS_BY_KEY[key].flag} {v[key]!r} is not one of on, off")
    lumberjack = LumberjackConfig(
        stream=str(get("lumberjack_stream", str)),
        default_stream=str(get("lumberjack_default_stream", str)),
        create_streams=str(get("lumberjack_create_streams", str)) == "on",
        metadata=str(get("lumberjack_metadata", str)) == "on",
        routing_key_fields=tuple(f.strip() for f in fields.split(",") if f.strip()),
        keepalive_interval_s=float(get("lumberjack_keepalive_interval", float)),
        window_linger_s=float(get("lumberjack_window_linger", float)),
        idle_timeout_s=float(get("lumberjack_idle_timeout", float)),
        max_window_count=int(get("lumberjack_max_window", int)),
        max_frame_bytes=int(get("lumberjack_max_frame_bytes", int)),
        max_decompressed_bytes=int(get("lumberjack_max_decompressed_bytes", int)),
        max_pending_bytes=int(get("lumberjack_max_pending_bytes", int)),
    )
    limits = ConnectionLimits(
        max_connections=int(get("max_connections", int)),
        max_frame_bytes=int(get("max_frame_bytes", int)),
        max_buffered_bytes=int(get("max_buffered_bytes", int)),
        max_pending_requests=int(get("max_pending_requests", int)),
        idle_timeout_s=float(get("idle_timeout", float)),
        partial_frame_timeout_s=float(get("partial_frame_timeout", float)),
    )
    origins: list[str] = []
    listed = "" if v["http_allowed_origins"] is None else str(get("http_allowed_origins", str))
    for entry in listed.split(","):
        if not entry.strip():
            continue
        try:
            origins.append(ANY_ORIGIN if entry.strip() == ANY_ORIGIN else normalize_origin(entry))
        except ValueError as exc:
            raise ConfigError(f"--http-allowed-origins: {exc}") from None
    count = None if v["container_count"] is None else int(get("container_count", int))
    cluster = _cluster_config(v["cluster"], v["node_id"], count)
    if cluster is not None:
        factor = int(get("replication_factor", int))
        cluster = dataclasses.replace(
            cluster,
            replication_factor=factor,
            min_in_sync=min(int(get("min_insync", int)), factor),
            replica_lag_max_s=float(get("replica_lag_max", float)),
        )
    listeners = tuple(parse_listener(text) for text in _many(v["listener"]))
    config = ServerConfig(
        data_dir=Path(str(v["data_dir"])),
        host=str(get("host", str)),
        advertise_host=None if v["advertise_host"] is None else str(get("advertise_host", str)),
        fsync=FsyncPolicy(fsync),
        fsync_interval_s=float(get("fsync_interval", float)),
        max_segment_attributes=int(get("max_segment_attributes", int)),
        tank_scope=str(get("tank_scope", str)),
        tank_first_request_timeout_s=float(get("tank_first_request_timeout", float)),
        retention_interval_s=float(get("retention_interval", float)),
        auto_scale_interval_s=float(get("auto_scale_interval", float)),
        watermark_interval_s=float(get("watermark_interval", float)),
        ports={name: int(get(f"{name}_port", int)) for name in DEFAULT_PORTS},
        listeners=listeners,
        tls=None
        if tls_cert is None or tls_key is None
        else TlsConfig(
            Path(str(tls_cert)),
            Path(str(tls_key)),
            None if tls_ca is None else Path(str(tls_ca)),
            verify_client,
        ),
        auth=None
        if v["auth_password_file"] is None
        else AuthConfig(
            Path(str(v["auth_password_file"])),
            int(get("auth_token_ttl", int)),
            trusted,
            int(get("auth_failed_login_burst", int)),
            float(get("auth_failed_login_interval", float)),
        ),
        lumberjack=lumberjack,
        limits=limits,
        max_total_buffered_bytes=int(get("max_total_buffered_bytes", int)),
        http_header_timeout_s=float(get("http_header_timeout", float)),
        http_allowed_origins=tuple(origins),
        metrics_streams=int(get("metrics_streams", int)),
        log_format=str(get("log_format", str)),
        container_count=count
        or (DEFAULT_CONTAINER_COUNT if cluster is None else DEFAULT_CLUSTER_CONTAINERS),
        cluster=cluster,
        cluster_secret_file=None
        if v["cluster_secret_file"] is None
        else Path(str(v["cluster_secret_file"])),
    )
    config.validate()
    return config


def _cluster_config(
    url_text: OptionValue, node_id_text: OptionValue, count: int | None
) -> ClusterConfig | None:
    """``--cluster``, ``--node-id`` and the container count, checked.

    Raises:
        ConfigError: a bad URL or node id, a count too large for a cluster, or
            ``--node-id`` without ``--cluster``; one line each.
    """
    if url_text is None:
        if node_id_text is not None:
            raise ConfigError("--node-id needs --cluster")
        return None
    url = parse_cluster_url(str(url_text))
    if node_id_text is not None:
        node_id = check_node_id(str(node_id_text))
    else:
        host = socket.gethostname().partition(".")[0]
        try:
            node_id = check_node_id(host)
        except ConfigError:
            raise ConfigError(
                f"--cluster: the host name {host!r} is not a node id; set --node-id"
            ) from None
    if count is not None and not 1 <= count <= MAX_CLUSTER_CONTAINERS:
        raise ConfigError(f"--container-count {count}: a cluster has 1 to {MAX_CLUSTER_CONTAINERS}")
    return ClusterConfig(url, node_id, count)
