"""Loads the Hypothesis profile (SPECDIFF_PROFILE: dev, ci or nightly; dev by default)."""

import os

from hypothesis import settings

import conformance.profiles  # noqa: F401  (registers the profiles)

settings.load_profile(os.environ.get("SPECDIFF_PROFILE", "dev"))
