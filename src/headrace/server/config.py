"""Typed server configuration: what ``headrace serve`` runs with.

Defaults "just work" (DESIGN.md section 6): every listener on 127.0.0.1 at its
default port, data in ``./headrace-data``, fsync on acknowledge. A port of 0
disables that listener. The listener names and port flags are stable: scripts
and docs depend on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from headrace.controller.service import AUTO_SCALE_INTERVAL_S as DEFAULT_AUTO_SCALE_INTERVAL_S
from headrace.controller.service import RETENTION_INTERVAL_S as DEFAULT_RETENTION_INTERVAL_S
from headrace.errors import ConfigError
from headrace.server.lumberjack_config import LumberjackConfig
from headrace.server.tls import TlsConfig
from headrace.store.api import FsyncPolicy

__all__ = [
    "DEFAULT_AUTO_SCALE_INTERVAL_S",
    "DEFAULT_PORTS",
    "DEFAULT_RETENTION_INTERVAL_S",
    "LISTENER_NAMES",
    "ServerConfig",
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

MAX_PORT = 65535

DEFAULT_FSYNC_INTERVAL_S = 1.0
"""``--fsync interval``: at most this much acknowledged data is exposed to a power cut."""

DEFAULT_CONTAINER_COUNT = 4
"""Segment containers per store, as in Pravega standalone; fixed when a data dir is created."""


@dataclass(slots=True)
class ServerConfig:
    """Everything ``headrace serve`` needs to start."""

    data_dir: Path = Path("headrace-data")
    host: str = "127.0.0.1"
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_s: float = DEFAULT_FSYNC_INTERVAL_S
    container_count: int = DEFAULT_CONTAINER_COUNT
    retention_interval_s: float = DEFAULT_RETENTION_INTERVAL_S
    auto_scale_interval_s: float = DEFAULT_AUTO_SCALE_INTERVAL_S
    tank_scope: str = "tank"  # the scope holding TANK topics (DESIGN.md section 2)
    ports: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))
    tls: TlsConfig | None = None
    """Certificate for every TLS listener (``--tls-cert/--tls-key/--tls-ca``); None: no TLS."""
    lumberjack: LumberjackConfig = field(default_factory=LumberjackConfig)

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
        if self.container_count < 1:
            raise ConfigError("container count must be at least 1")
        self.lumberjack.validate()

    def enabled_listeners(self) -> dict[str, int]:
        """Listeners to start: port not 0, and TLS-only ones only with a certificate."""
        return {
            name: port
            for name, port in self.ports.items()
            if port != 0 and name not in self.inactive_listeners()
        }

    def inactive_listeners(self) -> dict[str, str]:
        """Listeners with a port that will not start, and why (for the startup log)."""
        if self.tls is None and self.ports.get("lumberjack_tls", 0) != 0:
            return {"lumberjack_tls": "no --tls-cert/--tls-key given"}
        return {}
