"""How many examples Hypothesis tries: the profiles, and the counts of slow tests.

``tests/conftest.py`` registers two profiles and loads the one named by the
``HYPOTHESIS_PROFILE`` environment variable:

* ``ci`` (the default, what ``make test`` runs): ``CI_EXAMPLES`` examples a
  test, Hypothesis's own default deadline;
* ``thorough``: ``THOROUGH_EXAMPLES`` examples a test, for a run after a
  change to a codec or a state machine, or before a release.

A test carries its own count only when each of its examples is slow (a disk
store or a server each): ``examples(n)`` is ``n`` under ``ci`` and grows with
the loaded profile's count.
"""

from __future__ import annotations

from typing import Final

from hypothesis import settings

PROFILE_VARIABLE: Final = "HYPOTHESIS_PROFILE"
"""The environment variable that names the profile to load."""
DEFAULT_PROFILE: Final = "ci"
CI_EXAMPLES: Final = 100
"""Examples a test under ``ci``: Hypothesis's own default."""
THOROUGH_EXAMPLES: Final = 1000
"""Examples a test under ``thorough``: ten times as many."""


def examples(ci_count: int) -> int:
    """``ci_count`` examples under ``ci``, scaled by the loaded profile's count
    (ten times as many under ``thorough``), for a test whose examples are slow."""
    return max(1, ci_count * settings().max_examples // CI_EXAMPLES)
