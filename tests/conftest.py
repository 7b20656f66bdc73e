"""Settings for the whole test suite: the Hypothesis profile (``tests/_hypothesis.py``)."""

from __future__ import annotations

import os

from hypothesis import settings

from tests._hypothesis import (
    CI_EXAMPLES,
    DEFAULT_PROFILE,
    PROFILE_VARIABLE,
    THOROUGH_EXAMPLES,
)

# Both start from Hypothesis's defaults, whatever profile it loaded by itself
# (it has a "ci" of its own for CI machines; this one replaces it).
DEFAULTS = settings.get_profile("default")
settings.register_profile("ci", DEFAULTS, max_examples=CI_EXAMPLES)
settings.register_profile("thorough", DEFAULTS, max_examples=THOROUGH_EXAMPLES)
settings.load_profile(os.environ.get(PROFILE_VARIABLE, DEFAULT_PROFILE))
