"""The host compositions of §3 run end to end through every backend and agree exactly
once randomness is shared."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from support import BACKENDS, composed, i32

from compositions.sampler import (
    SamplingMetadata,
    compute_fly_entropy,
    expand_batch_to_tokens,
    generate_uniform_probs,
    rejection_sample,
    unconditional_to_conditional_rates,
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_golden_mixed_batch(backend):
    """§3.1's golden example: request 0 greedy, request 1 random, injected randomness."""
    logits = torch.tensor([[0, 5, 1, 2], [3, 1, 2, 0.5], [math.log(0.1), math.log(0.2), math.log(0.3), math.log(0.4)]])
    meta = SamplingMetadata(temperature=torch.tensor([0.0, 1.0]), all_greedy=False, all_random=False)
    out = rejection_sample(torch.tensor([1, 2, 0], dtype=torch.int32), [2, 1], 2, torch.tensor([2, 3], dtype=torch.int32),
                           torch.full((3, 4), 0.25), logits, torch.tensor([[7], [8]], dtype=torch.int32), meta,
                           backend=backend, uniform=torch.tensor([0.9, 0.9, 0.5], dtype=torch.float64), noise=torch.ones(2, 4))
    assert out.tolist() == [[1, 0, -1], [3, -1, -1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_expand_batch_to_tokens(backend):
    x = torch.tensor([0.5, 0.0, 2.0])
    got = expand_batch_to_tokens(x, torch.tensor([2, 5, 6], dtype=torch.int32), 6, replace_from=0, replace_to=1, backend=backend)
    assert got.dtype == torch.float32 and got.tolist() == [0.5, 0.5, 1.0, 1.0, 1.0, 2.0]


def test_generate_uniform_probs_is_reproducible_per_seeded_request():
    def draw(global_seed):
        torch.manual_seed(global_seed)
        gens = {1: torch.Generator().manual_seed(7), 2: torch.Generator().manual_seed(9)}
        return generate_uniform_probs(5, [2, 3, 0], gens)

    a, b = draw(0), draw(1)
    assert a.dtype == torch.float64
    assert torch.equal(a[2:], b[2:])  # request 1 is seeded; request 2 has no drafts and consumes nothing
    assert not torch.equal(a[:2], b[:2])


def test_conditional_rates():
    assert torch.allclose(unconditional_to_conditional_rates([0.9, 0.5, 0.2]), torch.tensor([0.9, 0.5 / 0.9, 0.4]))
    assert unconditional_to_conditional_rates([1.0, 0.6, 0.0, 0.0]).tolist() == pytest.approx([1.0, 0.6, 0.0, 0.0])


@st.composite
def steps(draw):
    """A whole sampler step: ragged drafts, greedy / random / mixed rows, drafter probs or not,
    synthetic or not, with every random number drawn once."""
    n = draw(st.lists(st.integers(0, 4), min_size=1, max_size=6))
    b, t, v = len(n), sum(n), draw(st.sampled_from([5, 16, 33]))
    rows = draw(st.sampled_from(["greedy", "random", "mixed"]))
    temp = torch.tensor([0.0 if rows == "greedy" or (rows == "mixed" and i % 2) else 1.0 for i in range(b)])
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    synthetic = draw(st.booleans())
    draft = torch.randint(0, v, (t,), generator=g, dtype=torch.int32)
    # Most drafts are the target's favourite, so that acceptance chains (and FLy windows) form.
    logits = torch.randn(t, v, generator=g)
    favour = torch.rand(t, generator=g) < 0.7
    logits[torch.arange(t)[favour], draft[favour].long()] += 4.0
    fly = None if synthetic else draw(st.sampled_from([None, 1, 2, 3]))
    return dict(
        draft_token_ids=draft,
        num_draft_tokens=n,
        max_spec_len=max(n),
        cu_num_draft_tokens=torch.tensor(n).cumsum(0).to(torch.int32),
        draft_probs=None if draw(st.booleans()) else torch.softmax(torch.randn(t, v, generator=g), -1),
        target_logits=logits,
        bonus_token_ids=torch.randint(0, v, (b, 1), generator=g, dtype=torch.int32),
        sampling_metadata=SamplingMetadata(temp if rows != "greedy" else None, rows == "greedy", rows == "random"),
        synthetic_mode=synthetic,
        synthetic_conditional_rates=torch.rand(max(n), generator=g) if synthetic else None,
        use_fp64_gumbel=draw(st.booleans()),
        fly_window_size=fly,
        fly_entropy_threshold=None if fly is None else draw(st.sampled_from([0.3, 0.0, 1.0, math.inf])),
        uniform=torch.rand(t, generator=g, dtype=torch.float64),
        noise=torch.empty(b, v).exponential_(generator=g),
    )


@composed
@given(step=steps())
def test_rejection_sample_agrees_on_every_backend(step):
    step["noise"] = step["noise"].double() if step["use_fp64_gumbel"] else step["noise"]
    # triton-split: the split-vocabulary sample_recovered_tokens layout behind the same composition.
    outs = {b: rejection_sample(**step, backend=b).tolist() for b in (*BACKENDS, "triton-split")}
    assert all(out == outs["reference"] for out in outs.values()), outs


def _accepted(out: torch.Tensor, n: list[int]) -> list[int]:
    """Accepted drafts per request: written cells before the first placeholder, less the last one
    (the recovered or bonus token)."""
    return [int((row[: k + 1] != -1).sum()) - 1 for row, k in zip(out, n)]


@composed
@given(step=steps())
def test_fly_infinite_threshold_is_fly_off_and_fly_only_adds_acceptances(step):
    if step["fly_window_size"] is None:  # FLy refuses synthetic mode: draw the step without it
        step.update(fly_window_size=1, fly_entropy_threshold=0.0, synthetic_mode=False, synthetic_conditional_rates=None)
    step["noise"] = step["noise"].double() if step["use_fp64_gumbel"] else step["noise"]
    off = dict(step, fly_window_size=None, fly_entropy_threshold=None)
    for backend in BACKENDS:
        base = rejection_sample(**off, backend=backend)
        # compute_fly_entropy is finite, and an infinite threshold defers only an infinite entropy.
        assert torch.equal(rejection_sample(**dict(step, fly_entropy_threshold=math.inf), backend=backend), base)
        uniform = step["uniform"].clone()
        fly = rejection_sample(**step, backend=backend)
        assert torch.equal(step["uniform"], uniform), "the pre-pass rewrote the caller's uniforms"
        n = step["num_draft_tokens"]
        for f, b, row_fly, row_base in zip(_accepted(fly, n), _accepted(base, n), fly, base):
            # Deferring only turns rejections into acceptances: what FLy-off accepted stays.
            assert f >= b and torch.equal(row_fly[:b], row_base[:b]), (fly, base)


def test_fly_is_refused_with_synthetic_mode():
    with pytest.raises(ValueError, match="synthetic"):
        rejection_sample(i32([1]), [1], 1, i32([1]), None, torch.zeros(1, 4), i32([[0]]),
                         SamplingMetadata(None, True, False), True, torch.ones(1), fly_window_size=1,
                         fly_entropy_threshold=0.3)


@pytest.mark.parametrize("from_logits", [False, True])
def test_compute_fly_entropy(from_logits):
    # Top-2 of [0.5, 0.25, 0.25, 0]: -(0.5 ln 0.5 + 0.25 ln 0.25), not renormalised; a zero row gives 0.
    p = torch.tensor([[0.5, 0.25, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0]])
    want = -(0.5 * math.log(0.5) + 0.25 * math.log(0.25))
    values = p.log() if from_logits else p
    got = compute_fly_entropy(values, 2, from_logits=from_logits)
    assert abs(float(got[0]) - want) < 1e-6
    if not from_logits:
        assert float(got[1]) == 0.0
    with pytest.raises(ValueError, match="top_k"):
        compute_fly_entropy(p, 0)


# -- Model Runner V2's speculative-decoding step (compositions/step.py) ------------------------------
def _invariants(engine, snapshots):
    """What every step must leave, whatever the backend: each request's history is its prompt and then
    exactly the tokens its steps emitted, its length counts them, and a decoding request has computed
    every token but the last one sampled."""
    for i, s in engine.rows.items():
        req = engine.plan[i]
        n, total = len(req.prompt), int(snapshots[-1]["total_len"][s])
        assert snapshots[-1]["all_token_ids"][s, :n].tolist() == list(req.prompt)
        if int(snapshots[-1]["num_computed"][s]) >= n:
            assert int(snapshots[-1]["num_computed"][s]) == total - 1
        assert int(snapshots[-1]["output_bin_counts"][s].sum()) == total - n
    last = snapshots[-1]
    if "slot_mappings" in last:  # no two of a step's tokens write one KV slot; the rest pads
        tokens = last["positions"].numel()
        for group in last["slot_mappings"]:
            assert bool((group[:tokens] >= 0).all()) and group[:tokens].unique().numel() == tokens
            assert bool((group[tokens:] == -1).all())


def _step_plan():
    from compositions.step import Request

    # Five requests over eight steps on four state rows: two at once, then one a step; prompts of 11 and
    # 17 tokens prefill in chunks of 7; requests finish and free their rows for later ones.
    return [Request(0, tuple(range(1, 12)), 6, seed=1), Request(0, (5, 9, 2), 4, seed=2),
            Request(1, tuple(range(20, 37)), 5, seed=3), Request(3, (7, 7, 7, 7), 3, seed=4), Request(4, (1, 2), 8, seed=5)]


def _run_steps(plan, backend, steps=8, k=3):
    from compositions.step import MRV2Engine

    engine = MRV2Engine(plan, backend, k=k)
    snapshots = []
    for _ in range(steps):
        snapshots.append(engine.step())
        _invariants(engine, snapshots)
    return engine, snapshots


def test_the_mrv2_step_agrees_on_every_backend_over_consecutive_steps():
    plan = _step_plan()
    engine, want = _run_steps(plan, "reference")
    # The plan reaches what it is for: chunked prefills, every draft accepted and every draft
    # rejected somewhere, requests finished and their rows taken by later ones.
    sampled = [int(x) for snap in want if "num_sampled" in snap for x in snap["num_sampled"]]
    assert {1, 4} <= set(sampled) and sorted(engine.finished) == [0, 1, 2, 3]
    assert any(int(snap["num_rejected"].max()) == 3 for snap in want if "num_rejected" in snap)
    # A sliding-window group's forward-pass row whose leading block fell out of the window: nulled.
    assert any(int(row[0]) == 0 and int(row[1]) != 0 for snap in want for row in snap["input_block_tables[1]"])
    for backend in BACKENDS:
        _, got = _run_steps(plan, backend)
        for step, (a, b) in enumerate(zip(want, got)):
            for name in a:
                assert torch.equal(a[name], b[name]), f"{backend}: step {step}: {name} differs from the oracle's"


@st.composite
def step_plans(draw):
    from compositions.step import Request

    n = draw(st.integers(1, 6))
    return [Request(draw(st.integers(0, 4)), tuple(draw(st.lists(st.integers(0, 63), min_size=1, max_size=20))),
                    draw(st.integers(1, 8)), seed=draw(st.integers(0, 2**31))) for _ in range(n)]


@composed
@given(plan=step_plans(), k=st.integers(1, 4))
def test_random_step_plans_agree_between_the_oracle_and_the_port(plan, k):
    _, want = _run_steps(plan, "reference", steps=6, k=k)
    _, got = _run_steps(plan, "cpu", steps=6, k=k)
    for step, (a, b) in enumerate(zip(want, got)):
        for name in a:
            assert torch.equal(a[name], b[name]), f"step {step}: {name}"
