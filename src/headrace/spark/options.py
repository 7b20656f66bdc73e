"""Options of the ``headrace`` data source, checked when Spark plans the query.

Spark hands a data source its options as strings with case-insensitive
names. :func:`read_options` and :func:`write_options` turn them into typed
values; a missing or bad option raises :class:`OptionError` naming it, so
the query fails at planning time instead of in a task. See ``docs/spark.md``
for the table of options.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from headrace.client.tls import TlsOptions, uri_wants_tls
from headrace.errors import ConfigError

__all__ = [
    "COMMITS_TO_RETAIN",
    "DEFAULT_LEASE_MS",
    "KAFKA_ONLY",
    "MAX_LEASE_MS",
    "READ_OPTIONS",
    "WRITE_OPTIONS",
    "Connection",
    "OptionError",
    "ReadOptions",
    "WriteOptions",
    "read_options",
    "write_options",
]

DEFAULT_LEASE_MS = 120_000
"""Transaction lease of the sink (Pravega connector's batch default): the
server aborts a task's transaction this long (times two) after the task
stopped renewing it, if the driver neither committed nor aborted it."""

COMMITS_TO_RETAIN = 100
"""Exactly-once records kept per writer (``commitsToRetain``): Spark's own
``spark.sql.streaming.minBatchesToRetain`` default. Spark replays at most the
batch after the last one it marked done, so this is a wide margin."""

MAX_LEASE_MS = 600_000
"""The controller's largest lease (``controller.model.MAX_TXN_LEASE_MS``)."""

DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
"""``maxTriggerDelay`` default (Kafka's 15 minutes): how long a query with
``minOffsetsPerTrigger`` waits for that many events before it reads what
there is."""

DEFAULT_TANK_SCOPE = "tank"
"""Scope holding TANK topics, whose events are bundles to unpack."""


class OptionError(ConfigError):
    """A data source option is missing or has a bad value (the message names it)."""


@dataclass(frozen=True, slots=True)
class Connection:
    """How every client of a query reaches the server: the controller URI, TLS
    settings and where the credentials come from.

    It travels to the executors inside the pickled reader or writer, so it
    holds no secret: the password stays in ``password_file`` (a file present
    on every node) or in the real Pravega client's environment variables, and
    is read by :meth:`credentials` on the node that opens a client.

    Attributes:
        uri: controller URI (``tcp://`` or a TLS scheme such as ``tls://``).
        tls: TLS settings; None: plaintext.
        user: user name (``user`` option); None: the environment variables, if set.
        password_file: file whose first line is ``user``'s password.
    """

    uri: str
    tls: TlsOptions | None = None
    user: str | None = None
    password_file: str | None = None

    def credentials(self) -> tuple[str, str] | None:
        """``(user, password)`` for this node's clients; None: no credentials.

        With ``user``: the first line of ``password_file``. Without: the real
        Pravega client's ``pravega_client_auth_*`` variables of this process
        (``headrace.client.credentials_from_env``), so executors may carry
        their own.

        Raises:
            OptionError: the password file cannot be read here.
        """
        if self.user is None or self.password_file is None:
            from headrace.client.pravega import credentials_from_env

            return credentials_from_env()
        return self.user, _read_password(self.password_file)

    def credentials_user(self) -> str | None:
        """The user name :meth:`credentials` sends (for messages: never the password)."""
        found = self.credentials()
        return None if found is None else found[0]


def _read_password(path: str) -> str:
    """The first line of a password file, without its line end (as ``--password-file``)."""
    try:
        with Path(path).open(encoding="utf-8") as f:
            return f.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionError(
            f"option 'passwordFile': cannot read {path} on host {os.uname().nodename}: {exc} "
            "(the file must be readable on the driver and on every executor)"
        ) from None


@dataclass(frozen=True, slots=True)
class ReadOptions:
    controller: str
    connection: Connection
    streams: tuple[str, ...]  # "scope/stream"
    starting: str  # earliest | latest | JSON
    ending: str  # latest | JSON (batch only)
    max_events: int | None
    max_bytes: int | None
    min_partitions: int
    fail_on_data_loss: bool
    include_headers: bool
    tank_scope: str
    starting_times: dict[str, int] = field(default_factory=dict)
    """``scope/stream`` -> epoch ms (``startingTimestamp`` /
    ``startingOffsetsByTimestamp``): start there, and drop rows whose
    timestamp is earlier (``docs/spark.md``, "Starting at a time")."""
    min_events: int | None = None
    """``minOffsetsPerTrigger``: a micro-batch waits for this many events
    (TANK messages) ..."""
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    """... or until this long after the previous one (``maxTriggerDelay``)."""
    max_records_per_partition: int | None = None
    """``maxRecordsPerPartition``: most events (TANK messages) per Spark partition."""
    stream_pattern: str | None = None
    """``streamPattern``: a regular expression that whole ``scope/stream``
    names match; ``streams`` is then what matched when last listed."""

    def is_tank(self, name: str) -> bool:
        """Whether ``scope/stream`` holds TANK bundles (limits count their messages)."""
        return name.partition("/")[0] == self.tank_scope

    ending_times: dict[str, int] = field(default_factory=dict)
    """``scope/stream`` -> epoch ms (``endingTimestamp`` /
    ``endingOffsetsByTimestamp``, batch only): end before the events
    appended at or after it."""
    time_strategy: str = "latest"
    """``startingOffsetsByTimestampStrategy``: ``latest`` (a stream with
    nothing appended at or after the time starts at its end) or ``error``
    (such a stream fails the read)."""


@dataclass(frozen=True, slots=True)
class WriteOptions:
    controller: str
    connection: Connection
    target: str | None  # "scope/stream" of the 'stream' option: wins over the column
    default_scope: str | None  # for bare names in the 'stream' column
    commit_scope: str  # where the COMMIT_TABLE record of each batch lives ("": no record)
    lease_ms: int
    writer_id: str | None
    batch_id: int | None
    commits_to_retain: int
    exactly_once: bool = True
    """``exactlyOnce=false``: tasks append their rows directly (at least once:
    a retried task or a replayed batch writes them again)."""

    def stream_of(self, column: object, scope_column: object = None) -> str:
        """The target ``scope/stream`` of one row: the ``stream`` option if set,
        else the row's ``stream`` column (qualified by its ``scope`` column or
        the ``scope`` option).

        Raises:
            ValueError: the row names no stream, or a bad one.
        """
        if self.target is not None:
            return self.target
        if not isinstance(column, str) or not column.strip():
            raise ValueError(
                f"the headrace sink got a row whose 'stream' is {column!r} "
                "(and no 'stream' option is set)"
            )
        scope = scope_column if isinstance(scope_column, str) and scope_column else None
        try:
            return _qualify(column, scope or self.default_scope, "stream column")
        except OptionError as exc:
            raise ValueError(str(exc)) from None


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items()}


CONNECTION_OPTIONS: Final = (
    "controller",
    "endpoint",
    "tls",
    "caFile",
    "clientCert",
    "clientKey",
    "insecure",
    "verifyCertificate",
    "user",
    "passwordFile",
)
"""How to reach the server: the same for reading and writing."""

READ_OPTIONS: Final = (
    *CONNECTION_OPTIONS,
    "stream",
    "streams",
    "streamPattern",
    "scope",
    "startingOffsets",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingOffsets",
    "endingTimestamp",
    "endingOffsetsByTimestamp",
    "maxEventsPerTrigger",
    "maxOffsetsPerTrigger",
    "maxBytesPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "minPartitions",
    "maxRecordsPerPartition",
    "failOnDataLoss",
    "includeHeaders",
    "tankScope",
)
"""Every option a read takes (``docs/spark.md``)."""

WRITE_OPTIONS: Final = (
    *CONNECTION_OPTIONS,
    "stream",
    "scope",
    "commitScope",
    "commitsToRetain",
    "transactionTimeoutMs",
    "writerId",
    "batchId",
    "exactlyOnce",
)
"""Every option a write takes (``docs/spark.md``)."""

SPARK_OPTIONS: Final = frozenset({"path", "checkpointlocation"})
"""Options Spark itself passes along with the user's (``load(path)``, a
streaming query's checkpoint): accepted and not used."""

KAFKA_ONLY: Final = {
    "kafka.bootstrap.servers": "give the headrace controller URI as option 'controller'",
    "subscribe": "name the streams with option 'stream' or 'streams' (scope/stream)",
    "subscribepattern": "give a regular expression over 'scope/stream' as option 'streamPattern'",
    "assign": "name the streams with option 'streams'; segments are not assigned by hand",
    "topic": "name the target stream with option 'stream' (scope/stream)",
    "kafkaconsumer.polltimeoutms": "reads are not polled: an executor's read waits for "
    "the segment store, whose client retries on its own",
    "fetchoffset.numretries": "the client retries looking up segment lengths on its own",
    "fetchoffset.retryintervalms": "the client retries looking up segment lengths on its own",
    "groupidprefix": "headrace keeps no consumer groups for Spark: positions live in "
    "the query's checkpoint",
    "kafka.group.id": "headrace keeps no consumer groups for Spark: positions live in "
    "the query's checkpoint",
}
"""Options of Spark's Kafka source and sink that headrace does not take, and
what to do instead (``docs/spark.md``)."""


KAFKA_CLIENT_PREFIX: Final = "kafka."
"""Spark's Kafka source hands options so named to the Kafka client."""

KAFKA_CLIENT_HINT: Final = (
    "headrace's client takes 'controller', and for TLS and credentials 'tls', "
    "'caFile', 'clientCert'/'clientKey', 'user' and 'passwordFile'"
)
"""What to use instead of a ``kafka.*`` option (``docs/spark.md``)."""


def _check_names(opts: Mapping[str, str], known: tuple[str, ...]) -> None:
    """Refuse an option no headrace reader or writer takes: a typo would
    otherwise be ignored silently (``startingOffset`` reading everything).

    Raises:
        OptionError: naming the closest known option, or what to use instead
            of a Kafka option.
    """
    names = {name.lower(): name for name in known}
    for given in opts:
        lower = given.lower()
        if lower in names or lower in SPARK_OPTIONS or lower in SECRET_OPTIONS:
            continue
        if lower in KAFKA_ONLY:
            raise OptionError(f"option '{given}' is Kafka's: {KAFKA_ONLY[lower]}")
        if lower.startswith(KAFKA_CLIENT_PREFIX):
            raise OptionError(f"option '{given}' is a Kafka client setting: {KAFKA_CLIENT_HINT}")
        close = difflib.get_close_matches(lower, list(names), n=1, cutoff=0.75)
        hint = f"did you mean '{names[close[0]]}'?" if close else "see docs/spark.md"
        raise OptionError(f"unknown option '{given}': {hint}")


def _controller(opts: dict[str, str]) -> str:
    uri = opts.get("controller") or opts.get("endpoint")
    if not uri:
        raise OptionError("option 'controller' is required: the controller URI, tcp://host:9090")
    return uri if "://" in uri else f"tcp://{uri}"


SECRET_OPTIONS = frozenset({"password", "pravega_client_auth_password"})
"""Option names refused outright: Spark shows a query's options in its plans,
UI and event logs, so a password must come from ``passwordFile`` or the
environment instead."""


def _readable_file(opts: dict[str, str], name: str) -> Path | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    path = Path(raw)
    if not raw or not path.is_file() or not os.access(path, os.R_OK):
        raise OptionError(
            f"option '{name}': no readable file {raw!r} on the driver (it must be readable "
            "at that path on the driver and on every executor)"
        )
    return path


def _connection(opts: dict[str, str], uri: str) -> Connection:
    """The ``tls``, ``caFile``, ``insecure``/``verifyCertificate``,
    ``clientCert``/``clientKey``, ``user`` and ``passwordFile`` options.

    Files are checked here, on the driver; executors open them at the same
    path when they connect.
    """
    for name in SECRET_OPTIONS:
        if name in opts:
            raise OptionError(
                f"option '{name}' is not accepted: Spark shows options in query plans, "
                "its UI and event logs. Put the password in a file on every node "
                "('passwordFile') or in the pravega_client_auth_password environment variable"
            )
    ca = _readable_file(opts, "caFile")
    cert = _readable_file(opts, "clientCert")
    key = _readable_file(opts, "clientKey")
    if key is not None and cert is None:
        raise OptionError("option 'clientKey' needs option 'clientCert' (the certificate)")
    insecure = _bool(opts, "insecure", False)
    verify = _bool(opts, "verifyCertificate", True)
    if insecure or not verify:
        given = "insecure=true" if insecure else "verifyCertificate=false"
        raise OptionError(
            f"option '{given}' cannot be honoured: the controller connection (gRPC) always "
            "checks the server's certificate. Give the server's CA with option 'caFile'"
        )
    wanted = uri_wants_tls(uri) or ca is not None or cert is not None
    tls = _bool(opts, "tls", wanted)
    if not tls and wanted:
        raise OptionError(
            "option 'tls' is false but the controller URI's scheme or option "
            "'caFile'/'clientCert' asks for TLS"
        )
    user = opts.get("user")
    password_file = opts.get("passwordfile")
    if (user is None) != (password_file is None):
        raise OptionError(
            "options 'user' and 'passwordFile' go together (without both, the "
            "pravega_client_auth_username/_password environment variables are used)"
        )
    if not user and user is not None:
        raise OptionError("option 'user' must not be empty")
    if password_file is not None:
        _read_password(password_file)  # readable here, or a clear error now
    return Connection(
        uri=uri,
        tls=TlsOptions(ca_file=ca, cert_file=cert, key_file=key) if tls else None,
        user=user,
        password_file=password_file,
    )


def _int(opts: dict[str, str], name: str, *, minimum: int) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option '{name}' must be an integer, got {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option '{name}' must be at least {minimum}, got {value}")
    return value


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.lower() in {"true", "1", "yes"}:
        return True
    if raw.lower() in {"false", "0", "no"}:
        return False
    raise OptionError(f"option '{name}' must be true or false, got {raw!r}")


def _qualify(name: str, scope: str | None, option: str) -> str:
    name = name.strip()
    if "/" in name:
        sc, _, st = name.partition("/")
    elif scope:
        sc, st = scope, name
    else:
        raise OptionError(f"option '{option}': stream {name!r} needs a scope (set 'scope')")
    if not sc or not st or "/" in st:
        raise OptionError(f"option '{option}': bad stream name {name!r}")
    return f"{sc}/{st}"


def _position(opts: dict[str, str], name: str, default: str, allowed: set[str]) -> str:
    raw = opts.get(name.lower(), default).strip()
    if raw in allowed:
        return raw
    try:
        given = json.loads(raw)
    except ValueError:
        raise OptionError(
            f"option '{name}' must be {' or '.join(sorted(allowed))} or JSON "
            f'{{"scope/stream": {{"<segment id>": offset}}}}, got {raw!r}'
        ) from None
    ok = isinstance(given, dict) and all(
        isinstance(v, dict)
        and all(k.isdigit() and isinstance(o, int) and o >= -2 for k, o in v.items())
        for v in given.values()
    )
    if not ok:
        raise OptionError(
            f"option '{name}': JSON must map 'scope/stream' to {{'<segment id>': offset}} "
            f"(offset >= 0, -2 earliest, -1 latest), got {raw!r}"
        )
    return raw


def read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Check the reader's options.

    Raises:
        OptionError: a missing or bad option (named in the message).
    """
    opts = _lower(options)
    _check_names(options, READ_OPTIONS)
    controller = _controller(opts)
    scope = opts.get("scope")
    names: list[str] = []
    if opts.get("stream"):
        names.append(_qualify(opts["stream"], scope, "stream"))
    if opts.get("streams"):
        names += [_qualify(n, scope, "streams") for n in opts["streams"].split(",") if n.strip()]
    pattern = _pattern(opts)
    if pattern is not None and names:
        raise OptionError("option 'streamPattern' excludes 'stream' and 'streams'")
    if not names and pattern is None:
        raise OptionError("option 'stream' (or 'streams', or 'streamPattern') is required")
    names = list(dict.fromkeys(names))
    starting_times = _times(opts, names, "startingTimestamp", "startingOffsetsByTimestamp")
    ending_times = _times(opts, names, "endingTimestamp", "endingOffsetsByTimestamp")
    by_time = ("startingtimestamp", "startingoffsetsbytimestamp", "endingtimestamp")
    if pattern is not None and any(k in opts for k in (*by_time, "endingoffsetsbytimestamp")):
        raise OptionError(
            "option 'streamPattern' does not go with 'startingTimestamp', "
            "'startingOffsetsByTimestamp', 'endingTimestamp' or 'endingOffsetsByTimestamp': "
            "name the streams with 'streams'"
        )
    if ending_times and "endingoffsets" in opts:
        raise OptionError(
            "options 'endingOffsets' and 'endingTimestamp'/'endingOffsetsByTimestamp' "
            "exclude each other"
        )
    if streaming and ending_times:
        raise OptionError(
            "options 'endingTimestamp'/'endingOffsetsByTimestamp' apply to batch reads only"
        )
    strategy = opts.get("startingoffsetsbytimestampstrategy", "latest").lower()
    if strategy not in ("latest", "error"):
        raise OptionError(
            f"option 'startingOffsetsByTimestampStrategy' must be latest or error, got {strategy!r}"
        )
    if starting_times and "startingoffsets" in opts:
        raise OptionError(
            "options 'startingOffsets' and 'startingTimestamp'/'startingOffsetsByTimestamp' "
            "exclude each other"
        )
    starting = _position(
        opts, "startingOffsets", "latest" if streaming else "earliest", {"earliest", "latest"}
    )
    ending = _position(opts, "endingOffsets", "latest", {"latest"})
    if streaming and "endingoffsets" in opts:
        raise OptionError("option 'endingOffsets' applies to batch reads only")
    if not streaming and starting == "latest":
        raise OptionError("option 'startingOffsets' cannot be 'latest' for a batch read")
    max_events = _int(opts, "maxEventsPerTrigger", minimum=1)
    if max_events is None:
        max_events = _int(opts, "maxOffsetsPerTrigger", minimum=1)  # Kafka's name
    return ReadOptions(
        controller=controller,
        connection=_connection(opts, controller),
        streams=tuple(names),
        starting=starting,
        ending=ending,
        max_events=max_events,
        max_bytes=_int(opts, "maxBytesPerTrigger", minimum=1),
        min_partitions=_int(opts, "minPartitions", minimum=1) or 1,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        include_headers=_bool(opts, "includeHeaders", False),
        tank_scope=opts.get("tankscope", DEFAULT_TANK_SCOPE),
        starting_times=starting_times,
        min_events=_int(opts, "minOffsetsPerTrigger", minimum=1),
        max_trigger_delay_ms=_duration_ms(opts, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
        max_records_per_partition=_int(opts, "maxRecordsPerPartition", minimum=1),
        stream_pattern=pattern,
        ending_times=ending_times,
        time_strategy=strategy,
    )


def _pattern(opts: dict[str, str]) -> str | None:
    raw = opts.get("streampattern")
    if raw is None:
        return None
    try:
        re.compile(raw)
    except re.error as exc:
        raise OptionError(f"option 'streamPattern': not a regular expression: {exc}") from None
    return raw


DURATION_UNITS_MS: Final = {
    "us": 0.001,
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}
"""Units of a duration option, as Spark reads them (``15m``, ``30s``; a bare
number is milliseconds)."""


def _duration_ms(opts: dict[str, str], name: str, default: int) -> int:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    found = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", raw.lower())
    if found is None or found.group(2) not in {"", *DURATION_UNITS_MS}:
        raise OptionError(
            f"option '{name}' must be a duration such as 500ms, 30s, 15m or 1h, got {raw!r}"
        )
    return int(int(found.group(1)) * DURATION_UNITS_MS.get(found.group(2), 1))


def _times(opts: dict[str, str], names: list[str], every: str, each: str) -> dict[str, int]:
    """``every`` (a time for every stream: ``startingTimestamp``,
    ``endingTimestamp``) or ``each`` (JSON ``{"scope/stream": ms}``; streams
    left out start or end as the offsets options say) as ``scope/stream`` ->
    epoch ms."""
    if every.lower() in opts and each.lower() in opts:
        raise OptionError(f"options '{every}' and '{each}' exclude each other")
    if every.lower() in opts:
        ms = _int(opts, every, minimum=0)
        assert ms is not None
        return dict.fromkeys(names, ms)
    raw = opts.get(each.lower())
    if raw is None:
        return {}
    try:
        given = json.loads(raw)
    except ValueError:
        given = None
    if not isinstance(given, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in given.values()
    ):
        raise OptionError(
            f"option '{each}' must be JSON {{\"scope/stream\": epoch milliseconds}}, got {raw!r}"
        )
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise OptionError(f"option '{each}' names streams not read: {unknown}")
    return {name: given[name] for name in names if name in given}


def write_options(options: Mapping[str, str], *, stream_column: bool = False) -> WriteOptions:
    """Check the writer's options (``stream_column``: the rows have a
    ``stream`` column, so the ``stream`` option may be left out).

    Raises:
        OptionError: a missing or bad option (named in the message).
    """
    opts = _lower(options)
    _check_names(options, WRITE_OPTIONS)
    controller = _controller(opts)
    default_scope = opts.get("scope") or None
    target = None
    if opts.get("stream"):
        target = _qualify(opts["stream"], default_scope, "stream")
    elif not stream_column:
        raise OptionError(
            "option 'stream' is required (the target stream, scope/stream) "
            "unless the rows have a 'stream' column"
        )
    commit_scope = opts.get("commitscope") or (target and target.partition("/")[0])
    commit_scope = commit_scope or default_scope
    exactly_once = _bool(opts, "exactlyOnce", True)
    if not commit_scope and exactly_once:
        raise OptionError(
            "option 'commitScope' (or 'scope') is required when the target streams come "
            "from the 'stream' column: the scope whose 'spark-commits' table records "
            "each committed batch"
        )
    lease_ms = _int(opts, "transactionTimeoutMs", minimum=1000) or DEFAULT_LEASE_MS
    if lease_ms > MAX_LEASE_MS:
        raise OptionError(f"option 'transactionTimeoutMs' must be at most {MAX_LEASE_MS}")
    writer_id = opts.get("writerid")
    batch_id = _int(opts, "batchId", minimum=0)
    if batch_id is not None and not writer_id:
        raise OptionError("option 'batchId' needs option 'writerId' as well")
    retain = _int(opts, "commitsToRetain", minimum=1) or COMMITS_TO_RETAIN
    return WriteOptions(
        controller,
        _connection(opts, controller),
        target,
        default_scope,
        commit_scope or "",
        lease_ms,
        writer_id,
        batch_id,
        retain,
        exactly_once=exactly_once,
    )
