"""The lag of a streaming query, from its progress, as Spark's Kafka source reports it.

Spark's Kafka source puts ``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest``
and ``avgOffsetsBehindLatest`` in each progress's source ``metrics``. A
Python data source cannot fill ``metrics`` (pyspark's
``DataSourceStreamReader`` has no hook for it), but it reports
``latestOffset``: every segment's length when the micro-batch was planned.
:func:`offsets_behind_latest` computes the same three figures from
``latestOffset`` and ``endOffset``, for a listener or ``query.lastProgress``.
headrace offsets are byte offsets, so the lag is in bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["offsets_behind_latest"]


def _position(value: object) -> dict[str, dict[str, int]]:
    """An offset of the progress (JSON text, a dict, or null) as a position."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = json.loads(value) if value.strip() not in {"", "null"} else {}
    if not isinstance(value, Mapping):
        return {}
    return {
        str(name): {str(k): int(v) for k, v in segs.items()}
        for name, segs in value.items()
        if isinstance(segs, Mapping)
    }


def _field(source: Any, name: str) -> object:
    if isinstance(source, Mapping) and name in source:
        return source[name]
    return getattr(source, name, None)


def offsets_behind_latest(source: Any) -> dict[str, str]:
    """Kafka's lag metrics for one source of a query progress.

    ``source`` is an element of ``progress.sources`` (pyspark's
    ``SourceProgress``, or its JSON as a dict). For every segment of
    ``latestOffset``, the bytes between the micro-batch's end and the
    segment's length (a segment the micro-batch did not reach yet counts from
    0); the minimum, maximum and mean, as strings like Kafka's (an empty dict
    without ``latestOffset``).
    """
    latest = _position(_field(source, "latestOffset"))
    end = _position(_field(source, "endOffset"))
    behind = [
        length - end.get(name, {}).get(seg, 0)
        for name, segs in latest.items()
        for seg, length in segs.items()
    ]
    if not behind:
        return {}
    return {
        "minOffsetsBehindLatest": str(min(behind)),
        "maxOffsetsBehindLatest": str(max(behind)),
        "avgOffsetsBehindLatest": str(sum(behind) / len(behind)),
    }
