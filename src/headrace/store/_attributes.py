"""The bound on a segment's attributes, shared by ``MemoryStore`` and ``DiskStore``.

A segment's attributes are a ``dict`` kept in least-recently-set order: setting
an attribute moves it to the end, and once there are more than the bound the
first ones (set longest ago) are dropped. ``DiskStore`` applies the same rule
when it replays its log and when it loads a snapshot, and snapshots list the
attributes in that order, so a restarted store keeps the same attributes and
the same order as the one that stopped (see ``docs/storage-format.md``).
"""

from __future__ import annotations

from uuid import UUID

__all__ = ["check_attribute_bound", "set_attribute", "trim_attributes"]


def check_attribute_bound(max_segment_attributes: int) -> int:
    """``max_segment_attributes`` if it is a usable bound.

    Raises:
        ValueError: below 1 (a writer's own number must survive its append).
    """
    if max_segment_attributes < 1:
        raise ValueError(f"max_segment_attributes must be at least 1, not {max_segment_attributes}")
    return max_segment_attributes


def set_attribute(attributes: dict[UUID, int], attribute_id: UUID, value: int, bound: int) -> None:
    """Set ``attribute_id`` as the most recently set attribute; drop the least
    recently set ones past ``bound``."""
    attributes.pop(attribute_id, None)
    attributes[attribute_id] = value
    if len(attributes) > bound:
        trim_attributes(attributes, bound)


def trim_attributes(attributes: dict[UUID, int], bound: int) -> None:
    """Drop the least recently set attributes until at most ``bound`` are left."""
    for attribute_id in list(attributes)[: len(attributes) - bound]:
        del attributes[attribute_id]
