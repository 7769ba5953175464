"""Model Runner V2's sampling step composed (docs/sample.md, "The sampling step"): the sampling
parameters applied to the verification rows (logit bias, penalties counting earlier drafts, bad
words, temperature, min-p, top-k/top-p), then the rejection sampler (K13-K18) on the processed
logits. Bit for bit across backends, worked examples, and statistical tests of what the bits cannot
say: the emitted tokens follow the processed distributions, the drafts counted."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats
from support import BACKENDS, composed
from test_statistics import ALPHA, P, p_value, sample_size

from compositions.sampler import (
    MRV2SamplingStates,
    RequestParams,
    launch,
    mrv2_apply_sampling_params,
    mrv2_rejection_sample,
    mrv2_verify,
)

INF = float("inf")
OURS = [b for b in BACKENDS if b != "vllm"]


def batch(params: list[RequestParams], prompts: list[list[int]], outputs: list[list[int]], drafts: list[list[int]], v: int,
          logits: torch.Tensor | None = None, *, backend: str = "cpu", table_width: int | None = None) -> dict[str, Any]:
    """Requests in slots 0..R-1 (prompt, resumed output, this step's drafts), one verification row per
    draft plus the bonus row: the tensors ``RejectionSampler._verify`` holds. A request's row 0 reads
    its last committed token as input, rows 1.. its drafts (``draft_sampled``)."""
    states = MRV2SamplingStates(len(params), v, 64, table_width=table_width)
    for slot, (p, prompt, out) in enumerate(zip(params, prompts, outputs)):
        states.add_request(slot, prompt, out, p)
    states.apply_staged_writes(backend=backend)
    k = max((len(d) for d in drafts), default=0)
    counts = [len(d) + 1 for d in drafts]
    rows = sum(counts)
    cu = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
    sampled = [t for ctx, d in zip(zip(prompts, outputs), drafts) for t in ((ctx[1] or ctx[0])[-1:] + d)]
    start = [len(pr) + len(o) - 1 for pr, o in zip(prompts, outputs)]
    if logits is None:
        logits = torch.zeros(rows, v)
    return dict(logits=logits, states=states, draft_logits=None, draft_sampled=torch.tensor(sampled, dtype=torch.int32),
                cu_num_logits=cu, pos=torch.tensor([s + j for s, c in zip(start, counts) for j in range(c)], dtype=torch.int64),
                idx_mapping=torch.arange(len(params), dtype=torch.int32),
                expanded_idx_mapping=torch.arange(len(params), dtype=torch.int32).repeat_interleave(torch.tensor(counts)),
                expanded_local_pos=torch.cat([torch.arange(c, dtype=torch.int32) for c in counts]), num_speculative_steps=k)


def processed(b: dict[str, Any], backend: str) -> torch.Tensor:
    return mrv2_apply_sampling_params(b["logits"], b["states"], b["expanded_idx_mapping"], b["idx_mapping"], b["pos"],
                                      b["draft_sampled"], b["expanded_local_pos"], backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_penalties_count_the_earlier_drafts_of_the_row(backend):
    # Prompt [1], resumed output [2], drafts [3, 3]: row j counts the output and drafts 1..j. With
    # frequency 0.5 and presence 0.25 on zero logits (every product and sum exact): token 2 loses
    # 0.75 on every row, token 3 nothing on row 0, 0.75 on row 1 (one earlier draft), 1.25 on row 2.
    # Repetition 2 halves the positive logit of prompt token 1 and doubles output token 2's negative one.
    b = batch([RequestParams(frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=2.0)], [[1]], [[2]], [[3, 3]], 8,
              torch.tensor([[0.0, 3.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0]]).repeat(3, 1), backend=backend)
    got = processed(b, backend)
    want = torch.tensor([0.0, 1.5, -2.75, 0.0, 0.0, 0.0, 0.0, 0.0]).repeat(3, 1)
    want[1, 3], want[2, 3] = -0.75, -1.25
    assert torch.equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bad_word_spanning_committed_tokens_and_drafts(backend):
    # Output ends in 2; drafts [3, 4]. Bad word [2, 3, 5] matches the sequence ending at row 1
    # (committed 2, draft 3): 5 is banned there only. [4, 6] matches at row 2 (draft 4). [7] (no
    # prefix) bans 7 everywhere; [2, 3, 4, 1] would need 3 tokens before row 2's: its prefix is
    # (2, 3, 4), which ends row 2's sequence, so 1 is banned at row 2.
    words = [[2, 3, 5], [4, 6], [7], [2, 3, 4, 1]]
    b = batch([RequestParams(bad_words=words)], [[0, 0]], [[2]], [[3, 4]], 8, backend=backend)
    got = processed(b, backend)
    banned = {0: [7], 1: [5, 7], 2: [1, 6, 7]}
    for r, cols in banned.items():
        want = torch.zeros(8)
        want[cols] = -INF
        assert torch.equal(got[r], want), f"row {r}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_pipeline_order_bias_then_penalties_then_temperature(backend):
    # vLLM's order: bias adds, then penalties scale (they do not commute), then the temperature divides.
    # Token 1 (in the prompt): (1 + 1) / 2 (repetition) = 1, then / 0.5 = 2. Token 2: allowed? no:
    # allowed ids {1, 3} leave every other column -inf before anything else.
    b = batch([RequestParams(temperature=0.5, repetition_penalty=2.0, logit_bias={1: 1.0, 3: -0.5},
                             allowed_token_ids=[1, 3])], [[1]], [[]], [[]], 6,
              torch.tensor([[0.25, 1.0, 5.0, 1.0, 0.0, 0.0]]), backend=backend)
    got = processed(b, backend)
    assert torch.equal(got, torch.tensor([[-INF, 2.0, -INF, 1.0, -INF, -INF]]))


@st.composite
def step_batches(draw: st.DrawFn) -> dict[str, Any]:
    """A verification step: 1-4 requests with 0-3 drafts over 40-300 columns, every parameter drawn
    (penalties, bad words built from the request's own tokens, allowed ids, bias, min tokens, top-k,
    top-p, min-p, temperatures 0, 1 and others), drafts sometimes -1 (a placeholder the engine's
    gather writes for a step that starts inside the prefill)."""
    v = draw(st.sampled_from([40, 77, 300]))
    n = draw(st.integers(1, 4))
    tok = st.integers(0, v - 1)
    params, prompts, outputs, drafts = [], [], [], []
    for _ in range(n):
        prompt = draw(st.lists(tok, min_size=1, max_size=6))
        out = draw(st.lists(tok, max_size=4))
        d = draw(st.lists(tok, max_size=3))
        if d and draw(st.integers(0, 7)) == 0:
            d = [-1] * len(d)
        seq = prompt + out + d
        words = [seq[i: i + draw(st.integers(1, 3))] + [draw(tok)] for i in draw(st.lists(st.integers(0, len(seq) - 1), max_size=3))]
        words = [[t for t in w if t >= 0] or [0] for w in words]
        params.append(RequestParams(
            temperature=draw(st.sampled_from([0.0, 1.0, 0.7, 1.5])), top_k=draw(st.sampled_from([None, None, 1, 5])),
            top_p=draw(st.sampled_from([1.0, 1.0, 0.9, 0.5])), min_p=draw(st.sampled_from([0.0, 0.0, 0.1])),
            seed=draw(st.integers(-(2**63), 2**63 - 1)),
            repetition_penalty=draw(st.sampled_from([1.0, 1.0, 1.3, 0.8])),
            frequency_penalty=draw(st.sampled_from([0.0, 0.0, 0.5, -0.3])),
            presence_penalty=draw(st.sampled_from([0.0, 0.0, 0.7])),
            bad_words=words if draw(st.booleans()) else [],
            allowed_token_ids=draw(st.lists(tok, max_size=8)) if draw(st.integers(0, 3)) == 0 else [],
            logit_bias=draw(st.dictionaries(tok, st.sampled_from([-2.0, 0.5, 3.0]), max_size=4)),
            min_tokens=draw(st.sampled_from([0, 0, 2, 9])), stop_token_ids=draw(st.lists(tok, max_size=3)),
            restore_when_all_masked=draw(st.booleans())))
        prompts.append(prompt), outputs.append(out), drafts.append(d)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    rows = sum(len(d) + 1 for d in drafts)
    logits = (torch.randn(rows, v, generator=g) * 3.0).to(draw(st.sampled_from([torch.float32, torch.bfloat16])))
    return dict(params=params, prompts=prompts, outputs=outputs, drafts=drafts, v=v, logits=logits)


def _run(spec: dict[str, Any], backend: str) -> tuple[torch.Tensor, list[list[int]]]:
    b = batch(spec["params"], spec["prompts"], spec["outputs"], spec["drafts"], spec["v"], spec["logits"].clone(),
              backend=backend)
    logits, k = b.pop("logits"), b.pop("num_speculative_steps")
    states = b.pop("states")
    out, sampled, num_sampled = mrv2_verify(logits, states, num_speculative_steps=k, backend=backend, **b)
    return out, [sampled[r, : int(num_sampled[r])].tolist() for r in range(len(num_sampled))]


@composed
@given(spec=step_batches())
def test_the_sampling_step_agrees_across_backends(spec):
    want_logits, want = _run(spec, "reference")
    for b in OURS[1:]:
        got_logits, got = _run(spec, b)
        assert torch.equal(got_logits.view(torch.int32), want_logits.view(torch.int32)), f"{b}: processed logits differ"
        assert got == want, f"{b}: tokens differ"
    assert all(1 <= len(t) <= len(d) + 1 for t, d in zip(want, spec["drafts"]))


# -- statistics -----------------------------------------------------------------------------------------
V = 6
BASE = torch.tensor([1.0, 0.5, 0.0, 0.8, -0.5, 0.2])
DRAFT, LAST = 3, 1  # every request drafts token 3 after committed output ...1
PARAMS = dict(temperature=0.8, frequency_penalty=1.5, presence_penalty=0.5, logit_bias={DRAFT: 1.0},
              bad_words=[[LAST, DRAFT, 5]])


def expected(row: int, count_drafts: bool = True) -> torch.Tensor:
    """The processed distribution of a row, written out in float64 from the parameters alone: bias, the
    frequency and presence penalties on the output (token 1) and, from row 1 on, the earlier draft,
    the bad word [1, 3, 5] banning 5 after the draft, the temperature."""
    x = BASE.double().clone()
    x[DRAFT] += 1.0
    counts = torch.zeros(V, dtype=torch.float64)
    counts[LAST] += 1
    if row >= 1 and count_drafts:
        counts[DRAFT] += 1
    x -= 1.5 * counts + 0.5 * (counts > 0)
    if row >= 1 and count_drafts:
        x[5] = -INF
    return torch.softmax(x / 0.8, -1)


def emitted(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` requests (own slot and seed) drafting token 3 one-hot: (first tokens, second tokens of the
    requests whose draft was accepted)."""
    g = torch.Generator().manual_seed(seed)
    params = [RequestParams(seed=int(s), **PARAMS) for s in torch.randint(-(2**62), 2**62, (n,), generator=g)]
    b = batch(params, [[0, 2]] * n, [[LAST]] * n, [[DRAFT]] * n, V, BASE.repeat(2 * n, 1), table_width=8)
    logits, k, states = b.pop("logits"), b.pop("num_speculative_steps"), b.pop("states")
    _, sampled, num_sampled = mrv2_verify(logits, states, num_speculative_steps=k, backend="cpu", **b)
    accepted = num_sampled == 2
    return sampled[:, 0], sampled[accepted, 1]


def test_the_sampled_tokens_follow_the_processed_distributions():
    """Rejection sampling on processed logits: the first emitted token follows row 0's distribution
    (the draft accepted with its probability, else the residual), and after an accepted draft the
    bonus token follows row 1's, in which the draft counts for the penalties and completes a bad
    word. The same statistic rejects row 1 computed without the draft: what a sampler that ignored
    earlier drafts would emit. On the C++ port (conformance holds the backends to the same bits)."""
    p0 = expected(0)
    n = int(sample_size(V) / float(p0[DRAFT])) + 1
    first, second = emitted(n, 99)
    assert p_value(torch.bincount(first, minlength=V), p0) > ALPHA
    assert stats.binomtest(int((first == DRAFT).sum()), n, float(p0[DRAFT])).pvalue > ALPHA
    counts = torch.bincount(second, minlength=V)
    assert len(second) >= sample_size(V) * 0.9 and int(counts[5]) == 0  # banned after the draft
    assert p_value(counts[:5], expected(1)[:5]) > ALPHA
    assert p_value(counts, expected(1, count_drafts=False)) < ALPHA


# Mass where the target has little: most drafts are rejected, and the residual spreads over tokens this
# drafter weighs unequally, so noise shared with the drafter tilts the resample.
DRAFTER = torch.tensor([0.25, 0.05, 0.05, 0.05, 0.3, 0.3])


def drafted(n: int, seed: int, salted: bool) -> torch.Tensor:
    """The first emitted token of ``n`` requests whose one draft the drafter sampled from DRAFTER with K38
    (``speculator.py``'s launch: salted position, the draft-logits cache at column 0, whose seed takes
    the column), then verified against P with those cached logits. ``salted=False``: a drafter that
    draws from the verifier's own stream (the target's launch: no salt, no cache, the request's
    seed), which K17 reuses to resample at the same position."""
    g = torch.Generator().manual_seed(seed)
    v = len(P)
    seeds = torch.randint(-(2**62), 2**62, (n,), generator=g)
    at = torch.randint(0, 2**40, (n,), generator=g)
    q = DRAFTER.log().expand(n, v).contiguous()
    cache = torch.zeros(n, 1, v)
    argmax, best = torch.empty(n, 1, dtype=torch.int64), torch.empty(n, 1)
    launch("cpu", "_gumbel_sample_kernel", (n, 1), local_argmax_ptr=argmax, local_argmax_stride=1, local_max_ptr=best,
           local_max_stride=1, logits_cache_ptr=cache if salted else None, logits_cache_stride_0=v if salted else 0,
           logits_cache_stride_1=v if salted else 0, logits_cache_col_ptr=torch.tensor(0) if salted else None,
           logits_cache_source_ptr=q if salted else None, logits_cache_source_stride=v if salted else 0, logits_ptr=q,
           logits_stride=v, expanded_idx_mapping_ptr=torch.arange(n, dtype=torch.int32), seeds_ptr=seeds, pos_ptr=at,
           temp_ptr=torch.ones(n), vocab_size=v, BLOCK_SIZE=1024, IS_DRAFTING=salted, APPLY_TEMPERATURE=True, USE_FP64=False,
           PER_TOKEN_COL=False)
    tokens = torch.stack([torch.zeros(n, dtype=torch.int64), argmax[:, 0]], 1).reshape(-1).to(torch.int32)
    sampled, _ = mrv2_rejection_sample(
        P.log().expand(2 * n, v).contiguous(), q.view(n, 1, v).clone(), tokens, torch.arange(0, 2 * n + 1, 2, dtype=torch.int32),
        torch.stack([at, at + 1], 1).reshape(-1), torch.arange(n), torch.arange(n).repeat_interleave(2),
        torch.arange(2, dtype=torch.int32).repeat(n), torch.ones(n), seeds, 1, backend="cpu")
    return sampled[:, 0]


def test_a_draft_and_its_verifier_draw_from_apart_streams():
    """The drafter's noise at a position is not the verifier's: with the drafter's launch the first
    emitted token follows P. A drafter keyed like the verifier (no salt, the request's own seed)
    shares K17's resample noise at that position, and the same statistic sees the bias."""
    n = sample_size(len(P))
    assert p_value(torch.bincount(drafted(n, 5, salted=True), minlength=len(P)), P) > ALPHA
    assert p_value(torch.bincount(drafted(n, 5, salted=False), minlength=len(P)), P) < ALPHA
