"""Every front door this version has. Importing this module registers each one
in ``app.LISTENER_STARTERS`` (each listener module registers itself at import);
``ServerApp.start`` imports it, so adding a front door is one import line here.
"""

from __future__ import annotations

from headrace.server import controller, http, lumberjack, pravega, rsio, tank

__all__ = ["controller", "http", "lumberjack", "pravega", "rsio", "tank"]
