"""Logging setup for the CLI (the only place that configures logging).

Two formats (``--log-format``): ``text``, one human-readable line per record,
and ``json``, one JSON object per line with ``time``, ``level``, ``logger``,
``message`` and any structured fields the record carries (the
``headrace.access`` lines carry ``protocol``, ``peer``, ``requests``,
``bytes_in``, ``bytes_out``, ``duration_s`` and ``reason``).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

__all__ = ["JsonFormatter", "configure_logging"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
"""Attributes every LogRecord has; anything else was passed as ``extra``."""


class JsonFormatter(logging.Formatter):
    """One JSON object per record (JSON lines)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: int, log_format: str = "text", *, access: bool = False) -> None:
    """Send log records to stderr at ``level`` in ``log_format`` (``text`` or ``json``).

    Args:
        level: the root logger's level.
        log_format: ``text`` or ``json``.
        access: also log ``headrace.access`` (one line per closed connection) at
            INFO, whatever ``level`` is.
    """
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    logging.basicConfig(level=level, handlers=[handler], force=True)
    if access:
        logging.getLogger("headrace.access").setLevel(logging.INFO)
