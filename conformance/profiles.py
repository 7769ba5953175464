"""Hypothesis profiles, registered once for the CLI and the tests.

Every command and the tests default to ``ci``, so a plain run is a gate: the same cases CI draws.
``SPECDIFF_PROFILE`` (or a command's ``--profile``) picks another.

- ``dev``: quick local runs (50 examples per kernel, random seed): opt-in, it can miss a fault.
- ``ci``: derandomized, so a CI failure replays bit for bit on a laptop; 200 examples.
- ``nightly``: 2,000 examples, random seed (printed by the CLI).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# Every profile derives from Hypothesis's own defaults, never from the settings in force: where the
# environment says CI, Hypothesis loads its own ``ci`` profile (derandomized) at import, and a profile
# registered on top of it would inherit that, so ``dev --seed`` and ``nightly`` would silently draw one
# fixed sequence there and another here.
_BASE = settings.get_profile("default")
_COMMON = dict(
    deadline=None,  # the Triton interpreter is slow and uneven; speed is the benchmarks' job
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)

settings.register_profile("dev", _BASE, max_examples=50, derandomize=False, **_COMMON)
settings.register_profile("ci", _BASE, max_examples=200, derandomize=True, database=None, **_COMMON)
settings.register_profile("nightly", _BASE, max_examples=2000, derandomize=False, **_COMMON)

PROFILES = ("dev", "ci", "nightly")
# Cases per kernel that specdiff's interpreted backends (Triton on NumPy, about a second a case for
# the widest kernels) run under each profile, where fewer than the profile's examples: the first
# ones drawn, beside every case on the oracle and the port. The nightly runs them all.
INTERPRETED_EXAMPLES = {"ci": 50}
DEFAULT = "ci"


def chosen() -> str:
    """The profile a command runs when none is named: ``SPECDIFF_PROFILE``, else ``ci``."""
    value = os.environ.get("SPECDIFF_PROFILE") or DEFAULT
    if value not in PROFILES:
        raise ValueError(f"SPECDIFF_PROFILE={value!r}: expected one of {', '.join(PROFILES)}")
    return value
