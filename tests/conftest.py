"""Loads the Hypothesis profile (SPECDIFF_PROFILE: dev, ci or nightly; ci by default, as every command)."""

from hypothesis import settings

from conformance.profiles import chosen

pytest_plugins = ["conformance.pytest_plugin"]

settings.load_profile(chosen())
