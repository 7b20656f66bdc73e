"""Every front door this version has: listener name -> its starter.

``ServerApp.start`` looks each enabled listener up here and calls its
starter with the one ``ListenerContext``. The names are those of
``config.DEFAULT_PORTS``; adding a front door is its module and one row here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from headrace.server._context import ListenerStarter
from headrace.server.controller import start_controller
from headrace.server.http import start_http
from headrace.server.lumberjack import start_lumberjack, start_lumberjack_tls
from headrace.server.pravega import start_segment_store
from headrace.server.rsio import start_rsio
from headrace.server.tank import start_tank

__all__ = ["STARTERS"]

STARTERS: Final[Mapping[str, ListenerStarter]] = {
    "controller": start_controller,
    "segment_store": start_segment_store,
    "tank": start_tank,
    "lumberjack": start_lumberjack,
    "lumberjack_tls": start_lumberjack_tls,
    "rsio": start_rsio,
    "http": start_http,
}
"""Listener name -> the coroutine that starts it (``ServerApp`` starts ``http`` first)."""
