"""Every kernel's conformance on every backend, one test each, read from the contracts
(conformance/pytest_plugin.py): `pytest tests/test_conformance.py -k sample_recovered -n auto`.

The cases runs found and froze (tests/found_cases.py) run first, as explicit examples."""

from __future__ import annotations

import json

import pytest
from found_cases import FOUND

from conformance import pytest_plugin

# specdiff's own backends. The engine's (vllm, vllm-cpu) have known defects, judged against
# conformance/engine/expected.toml by `nox -s engine`, not here.
BACKENDS_HERE = ["triton", "cpu", "triton-split"]


@pytest.mark.parametrize(("kernel", "backend"), pytest_plugin.params(BACKENDS_HERE))
def test_conformance(kernel, backend, record_property):
    result = pytest_plugin.check(kernel, backend, examples=FOUND.get(kernel, ()))
    record_property(pytest_plugin.PROPERTY, json.dumps(result))
    why = pytest_plugin.verdict(result)
    if why is not None:
        pytest.fail(why, pytrace=False)  # the verdict once: an assert would print it again as the failed expression
