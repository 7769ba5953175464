"""Malformed launches: the oracle and the C++ port refuse them with a TypeError/ValueError that
names the argument, without crashing, writing out of bounds or touching their arguments."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import contracts
from conformance.backend import Backend
from conformance.backends import BACKENDS
from conformance.case import Case
from conformance.profiles import chosen
from conformance.tools import fuzz

PROFILE = chosen()
NAMES = list(contracts.SPECS)
QUOTA = fuzz.quota_per_kernel(PROFILE, len(NAMES))
DONE: dict[str, dict] = {}


@pytest.mark.parametrize("kernel", NAMES)
def test_malformed_launches_are_refused_cleanly(kernel, tmp_path):
    e = fuzz.check_kernel(kernel, QUOTA, save_dir=tmp_path)
    DONE[kernel] = e
    assert e["status"] == "pass", e["message"]
    assert e["malformed"] >= QUOTA and set(e["backends"]) >= {"reference", "cpu"}


def test_the_budget_and_every_kind_of_malformation():
    if set(DONE) != set(NAMES):
        pytest.skip("needs every test_malformed_launches_are_refused_cleanly case in the same run")
    kinds: Counter[str] = Counter()
    for e in DONE.values():
        kinds.update(e["kinds"])
    assert sum(e["malformed"] for e in DONE.values()) >= fuzz.BUDGET.get(PROFILE, fuzz.BUDGET["dev"])
    assert [k for k in fuzz.REQUIRED_KINDS if not kinds[k]] == []


# -- the fuzz has power: planted faults in a validating backend -------------------------------------
def _expand(out_len=3):
    return dict(output_ptr=torch.zeros(out_len), input_ptr=torch.tensor([2.0, 0.0]), cu_num_tokens_ptr=torch.tensor([1, 3], dtype=torch.int32),
                replace_from=0, replace_to=1, MAX_NUM_TOKENS=128)


def _malformed():
    args = _expand()
    args["cu_num_tokens_ptr"] = torch.tensor([3, 1], dtype=torch.int32)  # decreasing
    return fuzz.Malformed(Case("expand_kernel", args), "decreasing cumulative counts", "cu_num_tokens_ptr", "[3, 1]")


def _planted(monkeypatch, name, launch):
    cpu = BACKENDS["cpu"]

    class Planted:
        def __init__(self, spec):
            self.k = cpu.resolve(spec)

        def __getitem__(self, grid):
            return lambda *a, **kw: launch(self.k[grid], kw)

    monkeypatch.setitem(BACKENDS, name, Backend(name, Planted, cpu.device, lambda: "planted", validates=True))
    return name


def test_writing_before_refusing_is_caught(monkeypatch):
    def launch(k, kw):
        kw["output_ptr"][0] = 7.0  # writes, then validates
        k(**kw)

    b = _planted(monkeypatch, "writes-first", launch)
    with pytest.raises(fuzz.BadInputFailure, match="'output_ptr' changed .* before touching memory"):
        fuzz.check_malformed(_malformed(), [b], fuzz.GUARD)


def test_accepting_malformed_input_is_caught(monkeypatch):
    def launch(k, kw):
        try:
            k(**kw)
        except ValueError:
            pass

    b = _planted(monkeypatch, "lenient", launch)
    with pytest.raises(fuzz.BadInputFailure, match="accepted a malformed launch"):
        fuzz.check_malformed(_malformed(), [b], fuzz.GUARD)


def test_an_error_that_names_no_argument_is_caught(monkeypatch):
    def launch(k, kw):
        raise ValueError("invalid input")

    b = _planted(monkeypatch, "vague", launch)
    with pytest.raises(fuzz.BadInputFailure, match="does not name a parameter"):
        fuzz.check_malformed(_malformed(), [b], fuzz.GUARD)


def test_a_crash_other_than_type_or_value_error_is_caught(monkeypatch):
    def launch(k, kw):
        raise IndexError("index 3 is out of bounds for 'cu_num_tokens_ptr'")

    b = _planted(monkeypatch, "indexerror", launch)
    with pytest.raises(fuzz.BadInputFailure, match="raised IndexError"):
        fuzz.check_malformed(_malformed(), [b], fuzz.GUARD)


def test_guards_catch_a_write_past_the_end():
    gd = fuzz.guarded(_expand(), fuzz.GUARD)
    assert fuzz.guards_intact(gd) is None and fuzz.untouched(gd) is None
    out = gd.args["output_ptr"]
    torch.as_strided(out, (out.numel() + 1,), (1,))[-1] = 1.0  # one element past the end
    assert "wrote the guard after 'output_ptr'" in fuzz.guards_intact(gd)


def test_every_kind_applies_to_some_kernel():
    from hypothesis import find, settings

    quiet = settings(database=None, max_examples=300, derandomize=True)
    for kind in fuzz.KINDS:
        hits = []
        for kernel in NAMES:
            try:
                hits.append(find(fuzz.malformed_cases(kernel, kind), lambda m: True, settings=quiet))
                break
            except Exception:
                continue
        assert hits, f"malformation {kind!r} applies to no kernel"
