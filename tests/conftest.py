"""Settings for the whole test suite: the Hypothesis profile (``tests/_hypothesis.py``)
and the grouping of tests for parallel runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from tests._hypothesis import (
    CI_EXAMPLES,
    DEFAULT_PROFILE,
    PROFILE_VARIABLE,
    THOROUGH_EXAMPLES,
)

ROOT = Path(__file__).resolve().parent.parent
SHARED = ("spark", "cluster")
"""Test directories whose modules share one costly session fixture (Spark, ZooKeeper)."""

# Both start from Hypothesis's defaults, whatever profile it loaded by itself
# (it has a "ci" of its own for CI machines; this one replaces it).
DEFAULTS = settings.get_profile("default")
settings.register_profile("ci", DEFAULTS, max_examples=CI_EXAMPLES)
settings.register_profile("thorough", DEFAULTS, max_examples=THOROUGH_EXAMPLES)
settings.load_profile(os.environ.get(PROFILE_VARIABLE, DEFAULT_PROFILE))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for ``pytest -n N --dist loadgroup`` (``make test``): each test module
    runs on one worker, so its module-scoped server starts once; the Spark tests
    share one worker (one Spark session) and the cluster tests another (one
    ZooKeeper)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        path = Path(str(item.path)).relative_to(ROOT)
        shared = path.parts[1] if len(path.parts) > 2 and path.parts[1] in SHARED else None
        item.add_marker(pytest.mark.xdist_group(shared or str(path)))
