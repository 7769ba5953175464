"""The rejection-sampler family: spec golden examples on every backend, invalid input,
and three-way Hypothesis conformance."""

from __future__ import annotations

import pytest
import torch
from support import BACKENDS, f32, f64, i32, i64, run

NAN = float("nan")


def greedy(backend, out, cu, draft, argmax, bonus, s, is_greedy=None, u=None, rates=None):
    run(backend, "rejection_greedy_sample_kernel", (len(cu),), output_token_ids_ptr=out, cu_num_draft_tokens_ptr=cu,
        draft_token_ids_ptr=draft, target_argmax_ptr=argmax, bonus_token_ids_ptr=bonus, is_greedy_ptr=is_greedy,
        max_spec_len=s, uniform_probs_ptr=u, synthetic_conditional_rates_ptr=rates, SYNTHETIC_MODE=rates is not None)
    return out.tolist()


def random(backend, out, cu, draft, dp, tp, bonus, rec, u, is_greedy, s, rates=None):
    run(backend, "rejection_random_sample_kernel", (len(cu),), output_token_ids_ptr=out, cu_num_draft_tokens_ptr=cu,
        draft_token_ids_ptr=draft, draft_probs_ptr=dp, target_probs_ptr=tp, bonus_token_ids_ptr=bonus,
        recovered_token_ids_ptr=rec, uniform_probs_ptr=u, is_greedy_ptr=is_greedy, max_spec_len=s,
        vocab_size=tp.shape[1], synthetic_conditional_rates_ptr=rates, NO_DRAFT_PROBS=dp is None,
        SYNTHETIC_MODE=rates is not None)
    return out.tolist()


def recovered(backend, cu, draft, dp, tp, inv_q, block=8192, s=None):
    out = torch.full((draft.numel(),), -5, dtype=torch.int32)
    s = s if s is not None else int(torch.diff(cu, prepend=cu.new_zeros(1)).max())
    run(backend, "sample_recovered_tokens_kernel", (len(cu), s), output_token_ids_ptr=out, cu_num_draft_tokens_ptr=cu,
        draft_token_ids_ptr=draft, draft_probs_ptr=dp, target_probs_ptr=tp, inv_q_ptr=inv_q, vocab_size=tp.shape[1],
        BLOCK_SIZE=block, NO_DRAFT_PROBS=dp is None, USE_FP64_GUMBEL=inv_q.dtype == torch.float64)
    return out.tolist()


def expand(backend, out, x, cu, rf, rt, m=128):
    run(backend, "expand_kernel", (len(x),), output_ptr=out, input_ptr=x, cu_num_tokens_ptr=cu, replace_from=rf,
        replace_to=rt, MAX_NUM_TOKENS=m)
    return out.tolist()


def full(shape, value=-1, dtype=torch.int32):
    return torch.full(shape, value, dtype=dtype)


# -- K1 ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index", [i32, i64])
def test_greedy_g1_1_ragged(backend, index):
    args = (index([3, 5, 5, 6]), index([1, 2, 3, 4, 5, 7]), i64([1, 2, 9, 4, 5, 8]), i32([[10], [11], [12], [13]]), 3)
    assert greedy(backend, full((4, 4)), *args) == [[1, 2, 9, -1], [4, 5, 11, -1], [12, -1, -1, -1], [8, -1, -1, -1]]
    mask = torch.tensor([True, False, True, True])
    assert greedy(backend, full((4, 4), -9), *args, is_greedy=mask) == [[1, 2, 9, -9], [-9] * 4, [12, -9, -9, -9], [8, -9, -9, -9]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_g1_2_synthetic(backend):
    out = greedy(backend, full((3, 4)), i32([3, 3, 6]), i32([4, -1, 6, 7, 8, 9]), i64([5, 5, 5, 1, 1, 1]),
                 i32([[10], [11], [12]]), 3, u=f64([0.3, 0.2, 0.1, 0.99, 0.49, 0.0]), rates=f32([1.0, 0.5, 0.0]))
    assert out == [[4, 5, -1, -1], [11, -1, -1, -1], [7, 8, 1, -1]]
    # u == rate is a rejection (strict)
    out = greedy(backend, full((1, 3)), i32([2]), i32([4, 5]), i64([0, 0]), i32([[9]]), 2,
                 u=f64([0.5, 0.0]), rates=f32([0.5, 1.0]))
    assert out == [[0, -1, -1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_g1_3_no_drafts(backend):
    assert greedy(backend, full((2, 1)), i32([0, 0]), i32([]), i64([]), i32([[4], [5]]), 0) == [[4], [5]]


# -- K2 ---------------------------------------------------------------------------------------------
TP = f32([[0, 0, 0, 0, 0, 0.9, 0.1, 0], [0, 0, 0, 0, 0, 0.2, 0.1, 0.7]])
DP = f32([[0, 0, 0, 0, 0, 0.8, 0.2, 0], [0, 0, 0, 0, 0, 0.2, 0.4, 0.4]])
NO = torch.tensor([False])


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_g2_1(backend):
    common = (i32([2]), i32([5, 6]))
    tail = (i32([[7]]), i32([3, 2]))
    assert random(backend, full((1, 3)), *common, DP, TP, *tail, f64([0.5, 0.3]), NO, 2) == [[5, 2, -1]]
    assert random(backend, full((1, 3)), *common, None, TP, *tail, f64([0.5, 0.3]), NO, 2) == [[5, 2, -1]]
    assert random(backend, full((1, 3)), *common, DP, TP, *tail, f64([0.5, 0.2]), NO, 2) == [[5, 6, 7]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_g2_2_mixed_batch_keeps_greedy_rows(backend):
    out = random(backend, full((3, 3), -9), i32([0, 2, 2]), i32([5, 6]), DP, TP, i32([[7], [8], [9]]), i32([3, 2]),
                 f64([0.5, 0.3]), torch.tensor([False, True, False]), 2)
    assert out == [[7, -9, -9], [-9, -9, -9], [9, -9, -9]]


def _one(backend, draft, p, q, u, s=1, no_draft=False):
    tp = torch.zeros(1, 8)
    dp = torch.zeros(1, 8)
    tp[0, draft] = p
    dp[0, draft] = q
    return random(backend, full((1, s + 1)), i32([1]), i32([draft]), None if no_draft else dp, tp, i32([[7]]), i32([3]),
                  f64([u]), NO, s)


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_g2_3_boundaries(backend):
    assert _one(backend, 4, 0.0, 0.0, 0.0) == [[3, -1]]  # q == 0 rejects, even at p == u == 0
    assert _one(backend, 4, 0.0, 0.5, 0.0) == [[4, 7]]  # p == 0 < q accepts only at u == 0
    assert _one(backend, 4, 0.0, 0.5, 1e-300) == [[3, -1]]
    assert _one(backend, 1, 0.25, 0.5, 0.5) == [[1, 7]]  # non-strict
    assert _one(backend, 1, 0.5, 1.0, 0.5 + 2**-40) == [[3, -1]]  # u is never narrowed to float32
    assert _one(backend, 1, NAN, 1.0, 0.0, no_draft=True) == [[3, -1]]
    out = random(backend, full((1, 3)), i32([2]), i32([-1, 6]), DP, TP, i32([[7]]), i32([3, 2]), f64([0.0, 0.0]), NO, 2)
    assert out == [[3, -1, -1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_g2_3_no_draft_probs_boundaries(backend):
    # Without draft probabilities the ratio is p itself (q = 1): u == p accepts (non-strict), and so
    # does u == p == 0, a zero-probability draft accepted at the one uniform that equals it.
    assert _one(backend, 2, 0.375, 0.0, 0.375, no_draft=True) == [[2, 7]]
    assert _one(backend, 2, 0.375, 0.0, float(torch.nextafter(torch.tensor(0.375, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))),
                no_draft=True) == [[3, -1]]
    assert _one(backend, 2, 0.0, 0.0, 0.0, no_draft=True) == [[2, 7]]
    assert _one(backend, 2, 0.0, 0.0, 2**-1074, no_draft=True) == [[3, -1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_g2_4_synthetic(backend):
    tp = torch.zeros(3, 8)
    common = dict(cu=i32([3]), dp=None, tp=tp, bonus=i32([[7]]), rec=i32([1, 2, 3]), is_greedy=NO, s=3, rates=f32([0.5, 1.0, 1.0]))
    assert random(backend, full((1, 4)), draft=i32([5, -1, 6]), u=f64([0.3, 0.0, 0.0]), **common) == [[5, 2, -1, -1]]
    assert random(backend, full((1, 4)), draft=i32([5, 6, 200]), u=f64([0.3, 0.99, 0.5]), **common) == [[5, 6, 200, 7]]


# -- K3 ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_expand_goldens(backend):
    for dtype in (torch.int64, torch.int32):
        x = torch.tensor([5, 0, 8], dtype=dtype)
        assert expand(backend, torch.zeros(10, dtype=dtype), x, i32([3, 7, 10]), 0, -1) == [5, 5, 5, -1, -1, -1, -1, 8, 8, 8]
    got = expand(backend, torch.zeros(5), f32([0.7, 0.0, 1.5]), i32([2, 3, 5]), 0, 1)
    assert got == f32([0.7, 0.7, 1.0, 1.5, 1.5]).tolist()
    assert expand(backend, torch.zeros(3, dtype=torch.int32), i32([5, 0, 100]), i32([1, 1, 3]), 0, 0) == [5, 100, 100]
    assert expand(backend, torch.full((6,), -5, dtype=torch.int32), i32([3]), i32([6]), 0, 0, m=4) == [3, 3, 3, 3, -5, -5]


@pytest.mark.parametrize("backend", BACKENDS)
def test_expand_lengths_around_the_cap(backend):
    # Requests of MAX_NUM_TOKENS - 1, MAX_NUM_TOKENS and MAX_NUM_TOKENS + 1 tokens: only the last is cut.
    out = expand(backend, torch.full((12,), -5, dtype=torch.int32), i32([1, 2, 3]), i32([3, 7, 12]), 0, 0, m=4)
    assert out == [1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, -5]


@pytest.mark.parametrize("backend", BACKENDS)
def test_expand_float_keeps_bits(backend):
    out = torch.zeros(3)
    expand(backend, out, f32([-0.0, NAN, 2.5]), i32([1, 2, 3]), 0, 1)
    assert out[0].item() == 1.0 and torch.isnan(out[1]) and out[2].item() == 2.5  # -0.0 == 0 is replaced


# -- K4 ---------------------------------------------------------------------------------------------
T4 = f32([[0.1, 0.2, 0.5, 0.2], [0.1, 0.1, 0.1, 0.7]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_recovered_goldens(backend):
    assert recovered(backend, i32([2]), i32([0, 1]), f32([[0.4, 0.1, 0.1, 0.4], [0.1, 0.5, 0.2, 0.2]]), T4, torch.ones(1, 4)) == [2, 3]
    assert recovered(backend, i32([1, 2]), i32([2, 3]), None, T4, torch.ones(2, 4)) == [1, 0]
    assert recovered(backend, i32([1]), i32([0]), None, f32([[0, 0.3, 0.3, 0.4]]), f32([[1, 2, 2, 1]])) == [1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_recovered_ties_across_tiles(backend):
    ones = torch.ones(1, 8)
    assert recovered(backend, i32([1]), i32([0]), None, f32([[0, 0.3, 0.1, 0.3, 0.3, 0, 0, 0]]), ones, block=4) == [1]
    assert recovered(backend, i32([1]), i32([0]), None, f32([[0, 0.3, 0.1, 0.3, 0.3, 0.31, 0, 0]]), ones, block=4) == [5]


@pytest.mark.parametrize("backend", ("triton", "cpu"))
@pytest.mark.parametrize("width", [torch.float32, torch.float64])
@pytest.mark.parametrize("draft_probs", [True, False])
def test_recovered_ties_across_vectors_and_sub_blocks(backend, width, draft_probs):
    """Scores drawn from four values over 2,600 entries: the maximum recurs in many vector lanes,
    sub-blocks and chunks of the C++ scan and in many Triton tiles, and the lowest index must win
    everywhere; -0.0 ties with 0.0, and NaN never wins. Five rows: a block of four and one more."""
    g = torch.Generator().manual_seed(7)
    rows, vocab = 5, 2600
    tp = torch.tensor([0.0, 0.25, 0.5, 1.0])[torch.randint(0, 4, (rows, vocab), generator=g)]
    tp[0, 1500:] = 2.0  # row 0: the maximum first appears in a later sub-block, then recurs
    tp[1, -3] = 4.0  # row 1: the maximum in the scalar tail
    tp[2, :] = 0.0  # row 2: all zero, some of them -0.0 after the product
    tp[3, ::7] = NAN
    dp = torch.tensor([0.0, 0.25])[torch.randint(0, 2, (rows, vocab), generator=g)] if draft_probs else None
    inv_q = torch.ones(1, vocab, dtype=width)
    inv_q[0, ::3] = -0.0
    cu, draft = i32([rows]), i32([5, 1500, 0, 7, 2599])
    want = recovered("reference", cu, draft, dp, tp, inv_q, block=256)
    assert recovered(backend, cu, draft, dp, tp, inv_q, block=256) == want


@pytest.mark.parametrize("backend", BACKENDS)
def test_recovered_fp64_gumbel_is_never_narrowed(backend):
    tp = f32([[0.3, 0.3, 0, 0]])
    inv_q = f64([[1, 1 + 2**-40, 1, 1]])
    assert recovered(backend, i32([1]), i32([9]), None, tp, inv_q) == [1]
    assert recovered(backend, i32([1]), i32([9]), None, tp, inv_q.float()) == [0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_recovered_nan_never_wins(backend):
    tp = f32([[0.1, NAN, 0.2, 0.1]])
    assert recovered(backend, i32([1]), i32([9]), None, tp, torch.ones(1, 4)) == [2]
    assert recovered(backend, i32([1]), i32([9]), torch.zeros(1, 4), tp, torch.ones(1, 4)) == [2]


# -- invalid input ------------------------------------------------------------------------------------
VALIDATING = ("reference", "cpu")


@pytest.mark.parametrize("backend", VALIDATING)
def test_invalid_input_names_the_argument(backend):
    args = dict(out=full((2, 3)), cu=i32([2, 1]), draft=i32([1, 2]), argmax=i64([1, 2]), bonus=i32([[1], [2]]), s=2)
    with pytest.raises(ValueError, match="cu_num_draft_tokens_ptr"):
        greedy(backend, *args.values())
    with pytest.raises(ValueError, match="output_token_ids_ptr"):
        greedy(backend, full((1, 3)), i32([2, 2]), i32([1, 2]), i64([1, 2]), i32([[1], [2]]), 2)
    with pytest.raises(ValueError, match="max_spec_len"):
        greedy(backend, full((1, 2)), i32([2]), i32([1, 2]), i64([1, 2]), i32([[1]]), 1)
    with pytest.raises(ValueError, match="max_spec_len"):  # a row stride past int64, even with no request
        greedy(backend, full((1, 2)), i32([]), i32([]), i64([]), i32([[1]]), 2**63 - 1)
    with pytest.raises(TypeError, match="draft_token_ids_ptr"):
        greedy(backend, full((1, 3)), i32([2]), f32([1, 2]), i64([1, 2]), i32([[1]]), 2)
    with pytest.raises(TypeError, match="is_greedy_ptr"):
        random(backend, full((1, 3)), i32([2]), i32([5, 6]), DP, TP, i32([[7]]), i32([3, 2]), f64([0.5, 0.3]), None, 2)
    with pytest.raises(ValueError, match="draft_token_ids_ptr"):  # ids >= V outside synthetic mode (C11)
        random(backend, full((1, 3)), i32([2]), i32([5, 8]), DP, TP, i32([[7]]), i32([3, 2]), f64([0.5, 0.3]), NO, 2)
    with pytest.raises(ValueError, match="output_ptr"):
        expand(backend, torch.zeros(2), f32([1.0]), i32([3]), 0, 1)
    with pytest.raises(ValueError, match="inv_q_ptr"):
        recovered(backend, i32([1, 2]), i32([0, 1]), None, T4, torch.ones(1, 4), s=1)


@pytest.mark.parametrize("backend", VALIDATING)
@pytest.mark.parametrize("name", ["draft_token_ids_ptr", "bonus_token_ids_ptr", "recovered_token_ids_ptr"])
def test_ids_must_fit_the_output_dtype(backend, name):
    """An int64 id the kernel may copy into an int32 output must fit it (C5): torch refuses to store
    2**62 there and a cast would wrap it, so it is refused, naming the tensor. An int64 output takes it."""
    big = 2**62
    draft, bonus, rec = i64([5, 6]), i64([[7]]), i64([3, 2])
    ids = {"draft_token_ids_ptr": draft, "bonus_token_ids_ptr": bonus, "recovered_token_ids_ptr": rec}
    ids[name].view(-1)[-1] = big
    g = torch.tensor([False])
    with pytest.raises(ValueError, match=name):
        random(backend, full((1, 3)), i32([2]), draft, DP, TP, bonus, rec, f64([0.5, 0.3]), g, 2, rates=f32([1.0, 1.0]))
    out = full((1, 3), dtype=torch.int64)
    random(backend, out, i32([2]), draft, DP, TP, bonus, rec, f64([0.5, 0.3]), g, 2, rates=f32([1.0, 1.0]))
    if name != "recovered_token_ids_ptr":  # K1 copies drafts (synthetic mode) and bonuses, never recovered ids
        with pytest.raises(ValueError, match=name):
            greedy(backend, full((1, 3)), i32([2]), draft, i64([5, 6]), bonus, 2, u=f64([0.5, 0.3]), rates=f32([1.0, 1.0]))


@pytest.mark.parametrize("backend", VALIDATING)
def test_flags_must_match_tensors(backend):
    with pytest.raises(ValueError, match="NO_DRAFT_PROBS"):
        run(backend, "sample_recovered_tokens_kernel", (1, 1), output_token_ids_ptr=i32([0]), cu_num_draft_tokens_ptr=i32([1]),
            draft_token_ids_ptr=i32([0]), draft_probs_ptr=None, target_probs_ptr=T4[:1], inv_q_ptr=torch.ones(1, 4),
            vocab_size=4, BLOCK_SIZE=8192, NO_DRAFT_PROBS=False, USE_FP64_GUMBEL=False)


