"""Coverage of the spec-decode state classes: the classifiers, and the gate (under the ci and nightly
profiles a required class that no case reached fails the run). Whether the generated cases reach
every required class is `nox -s conformance`'s check, on the very cases it runs."""

from __future__ import annotations

import re
from collections import Counter

import torch

import contracts
from conformance import coverage, strategies, suite
from conformance.backends import ORACLE
from conformance.case import Case
from conformance.profiles import chosen
from conformance.runner import run_case

PROFILE = chosen()


def _greedy(cu, draft, argmax, s, greedy=None, synthetic=False):
    return Case("rejection_greedy_sample_kernel", dict(
        output_token_ids_ptr=torch.full((len(cu), s + 1), -1, dtype=torch.int32),
        cu_num_draft_tokens_ptr=torch.tensor(cu, dtype=torch.int32), draft_token_ids_ptr=torch.tensor(draft, dtype=torch.int32),
        target_argmax_ptr=torch.tensor(argmax), bonus_token_ids_ptr=torch.tensor([[9]] * len(cu), dtype=torch.int32),
        is_greedy_ptr=None if greedy is None else torch.tensor(greedy), max_spec_len=s, uniform_probs_ptr=None,
        synthetic_conditional_rates_ptr=None, SYNTHETIC_MODE=synthetic))


def test_rows_are_classified_from_the_oracles_output():
    # rows: all accepted (1, 2), first rejected (3 != 4), zero drafts, accepted then rejected (5, then -1 placeholder)
    case = _greedy([2, 3, 3, 5], [1, 2, 3, 5, -1], [1, 2, 4, 5, 6], 2, greedy=[True, True, True, True])
    out = run_case(case, [ORACLE])[ORACLE].outputs
    found = coverage.classify(case.kernel, case.args, out)
    assert found == Counter({"all accepted": 1, "first draft rejected": 1, "zero drafts": 1,
                             "rejected after an accepted draft": 1, "placeholder drafts": 1})


def test_a_class_never_generated_fails_the_ci_run(monkeypatch, tmp_path, capsys):
    from conformance.cli import main

    never = coverage.StateClass("impossible", ("expand_kernel",), lambda k, a, o: 0, "no case reaches it")
    rejection = strategies.family_module("rejection")
    monkeypatch.setattr(rejection, "CLASSES", (*rejection.CLASSES, never))
    # Seeded: the dev profile draws afresh each run, and 50 examples may miss a real class as well
    # (a CI run once missed "one below MAX_NUM_TOKENS" too, and the line named both).
    rc = main(["run", "--profile", "dev", "--seed", "0", "--kernel", "expand_kernel", "--backend", "cpu", "--require-coverage",
               "--report", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml")])
    out = capsys.readouterr().out
    assert rc == 1 and re.search(r"expand_kernel/coverage \([^)]*impossible never generated\)", out), out
    assert "required state classes never generated: impossible" in (tmp_path / "r.xml").read_text()


def test_hazards_are_counted_apart_and_never_required():
    hazards = [c for f in contracts.FAMILIES for c in getattr(strategies.family_module(f), "CLASSES", ()) if c.hazard]
    # Each one a rule kept because an engine behaves so: vLLM's three, SGLang's draw past the weights (C46d).
    assert {h.name for h in hazards} == {"last position read from an earlier request", "residual with no winner: token 0",
                                         "slot read from the next block-table row", "the draw names a zero-probability token"}
    assert all(not h.required for h in hazards)
    a = {"query_start_loc_ptr": torch.tensor([0, 2, 3]), "num_rejected_tokens_ptr": torch.tensor([1, 1]), "HAS_NUM_REJECTED": True}
    # request 1 owns token 2 only; with one rejected it reads token 1, request 0's
    assert strategies.family_module("dflash").earlier_request_position("copy_and_expand_dflash_inputs_kernel", a, {}) == 1
    p = torch.tensor([[0.5, 0.5], [0.2, 0.8]])
    q = torch.tensor([[0.6, 0.5], [0.1, 0.8]])
    k4 = {"draft_token_ids_ptr": torch.tensor([0, 1]), "vocab_size": 2, "target_probs_ptr": p, "draft_probs_ptr": q, "NO_DRAFT_PROBS": False}
    assert strategies.family_module("rejection").residual_without_winner("sample_recovered_tokens_kernel", k4, {}) == 1  # row 0: p <= q everywhere
    assert "hazards" in suite.state_coverage("sample_recovered_tokens_kernel", Counter({"residual with no winner: token 0": 3}), True)
    # hazard classes are neither coverage nor missing
    st_ = suite.state_coverage("sample_recovered_tokens_kernel", Counter(), True)
    assert "residual with no winner: token 0" not in st_["cases"] and "residual with no winner: token 0" not in st_["missing"]
