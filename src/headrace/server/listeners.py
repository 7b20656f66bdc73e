"""Every front door this version has: door name -> its starter.

``ServerApp.start`` looks each listener of ``ServerConfig.listener_plan`` up
here by its door and calls the starter with that listener's ``ListenerContext``
(which names the listener and gives TLS or not). The names are those of
``config.DOORS``; adding a front door is its module and one row here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from headrace.server._context import ListenerStarter
from headrace.server.controller import start_controller
from headrace.server.http import start_http
from headrace.server.lumberjack import start_lumberjack
from headrace.server.pravega import start_segment_store
from headrace.server.rsio import start_rsio
from headrace.server.tank import start_tank

__all__ = ["STARTERS"]

STARTERS: Final[Mapping[str, ListenerStarter]] = {
    "controller": start_controller,
    "segment_store": start_segment_store,
    "tank": start_tank,
    "lumberjack": start_lumberjack,
    "rsio": start_rsio,
    "http": start_http,
}
"""Door name -> the coroutine that starts one of its listeners (``ServerApp``
starts the ``http`` ones first)."""
