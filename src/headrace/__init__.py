"""headrace: a durable streaming storage service.

One storage engine (``headrace.store``) holds streams; several wire protocols
write into it and read out of it. See ``docs/architecture.md`` for the layers.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
