"""Loads the Hypothesis profile (SPECDIFF_PROFILE: dev, ci or nightly; ci by default, as every command).

It also imports ``triton_impl`` first, which decides TRITON_INTERPRET before any test module can
import triton: a module that imported triton first on a machine without a GPU would make Triton's
own library compiled-only, and every interpreted kernel that calls it would then fail ("Cannot
call @triton.jit'd outside of the scope of a kernel")."""

import triton_impl  # noqa: F401, I001  (first: see above)
import pytest
from hypothesis import settings

from conformance.profiles import chosen

pytest_plugins = ["conformance.pytest_plugin"]

try:
    settings.load_profile(chosen())
except ValueError as e:  # a bad SPECDIFF_PROFILE: one line, not a conftest traceback
    raise pytest.UsageError(str(e)) from None
