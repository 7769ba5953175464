"""SGLang's speculative verification (K46 ``speculative_sampling_classic_kernel``, K47
``verify_tree_greedy_kernel_triton``, K48 ``tree_speculative_sampling_target_only``): goldens worked
out by hand on every backend (SGLang's own Triton kernels too, where its backend is available), the
cross-engine cases SD1-SD16 of docs/sglang_verify.md, and invalid input."""

from __future__ import annotations

import pytest
import torch
from support import f32, i64, refused, run

from contracts import sglang_verify as contract

OURS = ("reference", "triton", "cpu")


def _sglang() -> tuple[str, ...]:
    """SGLang's own kernels join the goldens when its engine backend is registered and available."""
    from conformance.backends import BACKENDS as REGISTERED

    backend = REGISTERED.get("sglang")
    return ("sglang",) if backend is not None and backend.unavailable() is None else ()


ENGINES = OURS + _sglang()
backends = pytest.mark.parametrize("backend", ENGINES)
hosted = pytest.mark.parametrize("backend", ["reference", "cpu"])  # K48: a CUDA kernel in SGLang, no Triton form
ours = pytest.mark.parametrize("backend", ["reference", "cpu"])


# -- K46 -------------------------------------------------------------------------------------------
def chain_args(p: list, q: list, drafts: list, coins: list, final: list, block: bool = False, block_v: int = 16) -> dict:
    """SGLang's call-site layout: request b's node s at slot b * n + s, predicts pre-filled 0 and
    accept_index -1. ``p``: [bs, n, V], ``q``: [bs, n - 1, V], ``drafts``: [bs, n - 1], ``coins``:
    [bs, n - 1] (a last, unused column is added as the call site has it), ``final``: [bs]."""
    tp = f32(p)
    bs, n, v = tp.shape
    dp = f32(q).reshape(bs, n - 1, v) if n > 1 else torch.zeros(bs, 0, v)
    cand = i64([[0] + list(d) for d in drafts]) if n > 1 else torch.zeros(bs, 1, dtype=torch.int64)
    idx = torch.arange(bs * n, dtype=torch.int64).view(bs, n)
    uni = torch.cat([f32(coins).reshape(bs, n - 1), torch.full((bs, 1), 0.5)], 1)
    return dict(Predicts=torch.zeros(bs * n, dtype=torch.int32), AcceptIndex=torch.full((bs, n), -1, dtype=torch.int32),
                AcceptTokenNum=torch.full((bs,), -7, dtype=torch.int32), Candidates=cand, RetriveIndex=idx,
                UniformSamples=uni, UniformSamplesFinal=f32(final), TargetProbs=tp, DraftProbs=dp,
                stride_cand_b=cand.stride(0), stride_cand_s=cand.stride(1), stride_idx_b=idx.stride(0), stride_idx_s=idx.stride(1),
                stride_uni_b=uni.stride(0), stride_uni_s=uni.stride(1), stride_tp_b=tp.stride(0), stride_tp_s=tp.stride(1),
                stride_tp_v=tp.stride(2), stride_dp_b=dp.stride(0), stride_dp_s=dp.stride(1), stride_dp_v=dp.stride(2),
                NUM_SLOTS=n, VOCAB_SIZE=v, BLOCK_V=block_v, BLOCK_VERIFICATION=block, BLOCK_REDUCE=block_v)


def chain(backend: str, **kw) -> tuple[list[int], list[list[int]], list[int]]:
    """(accepted drafts per request, accept_index, predicts) of one K46 launch."""
    a = run(backend, contract.K46, (len(kw["p"]),), **chain_args(**kw))
    return a["AcceptTokenNum"].tolist(), a["AcceptIndex"].tolist(), a["Predicts"].tolist()


@backends
def test_sd1_the_product_rule_is_strict(backend):
    # p = .25, q = .5: coin .5 gives .5 * .5 = .25, not below p: rejected (vLLM's p/q >= u accepts). The
    # residual max(p - q, 0) = [0, .25] then draws token 1. At coin .4999 the product .24995 < .25:
    # accepted, and the bonus comes from row 1 = [0, 1]: token 1.
    rows = dict(p=[[[0.25, 0.75], [0.0, 1.0]]], q=[[[0.5, 0.5]]], drafts=[[0]], final=[0.0])
    assert chain(backend, coins=[[0.5]], **rows) == ([0], [[0, -1]], [1, 0])
    assert chain(backend, coins=[[0.4999]], **rows) == ([1], [[0, 1]], [0, 1])


@backends
def test_sd2_zero_target_mass_rejects_at_coin_zero(backend):
    # p(d) = 0, q = .5, coin 0.0: 0 * .5 < 0 is false (vLLM's 0/.5 >= 0 accepts, C9). Residual [0, .5]: token 1.
    got = chain(backend, p=[[[0.0, 1.0], [1.0, 0.0]]], q=[[[0.5, 0.5]]], drafts=[[0]], coins=[[0.0]], final=[0.3])
    assert got == ([0], [[0, -1]], [1, 0])


@backends
def test_sd3_the_rounded_product_decides(backend):
    # u * q < p exactly, but the float32 product rounds up to p: rejected (vLLM's quotient accepts).
    p, q, u = 0.6494157314300537, 0.9879068732261658, 0.6573653221130371
    assert float(f32(u) * f32(q)) == float(f32(p))
    got = chain(backend, p=[[[p, 1 - p], [0.0, 1.0]]], q=[[[q, 1 - q]]], drafts=[[0]], coins=[[u]], final=[0.0])
    assert got[0] == [0]


@backends
@pytest.mark.parametrize("q", [1.5, 0.0, float("nan"), -0.25])
def test_sd4_a_draft_probability_outside_0_1_rejects(backend, q):
    # p = .9 at any coin: q > 1 (vLLM accepts: .9 / 1.5 >= .5), q = 0, NaN or negative reject. The residual
    # counts that q as 0: w = [.9, .1] - [0, .1] = [.9, 0], so the draw gives token 0.
    got = chain(backend, p=[[[0.9, 0.1], [0.0, 1.0]]], q=[[[q, 0.1]]], drafts=[[0]], coins=[[0.5]], final=[0.99])
    assert got == ([0], [[0, -1]], [0, 0])


@backends
def test_sd6_the_residual_counts_invalid_q_as_zero(backend):
    # Draft 1 has q = 0 (rejected); q = [1.5, 0] counts as [0, 0], so w = p = [.6, .4] (vLLM: [0, .4]).
    # Final coins .1 and .55 fall in token 0's [0, .6), .7 in token 1's.
    for final, token in ((0.1, 0), (0.55, 0), (0.7, 1)):
        got = chain(backend, p=[[[0.6, 0.4], [0.5, 0.5]]], q=[[[1.5, 0.0]]], drafts=[[1]], coins=[[0.0]], final=[final])
        assert got == ([0], [[0, -1]], [token, 0]), final
    # NaN q (SD6''): p = [.5, .5], q = [.2, NaN], draft 1 rejected: w = [.3, .5] (vLLM's C16: [.3, 0]).
    for final, token in ((0.25, 0), (0.5, 1)):
        got = chain(backend, p=[[[0.5, 0.5], [0.5, 0.5]]], q=[[[0.2, float("nan")]]], drafts=[[1]], coins=[[0.0]], final=[final])
        assert got == ([0], [[0, -1]], [token, 0]), final


@backends
def test_sd8_an_all_zero_residual_draws_the_last_token(backend):
    # p = [.2, .1, 0, 0], q = [.5, .5, 0, 0], draft 0: .5 * .5 < .2 is false; w = 0 everywhere: V - 1 = 3
    # (vLLM's K4: token 0, the rejected draft itself).
    got = chain(backend, p=[[[0.2, 0.1, 0.0, 0.0], [0.25] * 4]], q=[[[0.5, 0.5, 0.0, 0.0]]], drafts=[[0]], coins=[[0.5]],
                final=[0.3])
    assert got == ([0], [[0, -1]], [3, 0])


@backends
def test_the_draw_is_an_inverse_cdf_with_a_strict_cut(backend):
    # No drafts (n = 1): the bonus from p = [.125, .25, .125, .5]. Coin .5 cuts at exactly .5 = the prefix
    # sum at token 2, which must be exceeded: token 3. Coin .499: token 2; coin 0: token 0; coin 1 (SD9):
    # no prefix exceeds the whole sum: V - 1 = 3, as for a zero-probability last token below.
    p = [[[0.125, 0.25, 0.125, 0.5]]]
    for final, token in ((0.5, 3), (0.499, 2), (0.0, 0), (0.124, 0), (0.126, 1), (1.0, 3)):
        assert chain(backend, p=p, q=[[]], drafts=[[]], coins=[[]], final=[final]) == ([0], [[0]], [token]), final
    assert chain(backend, p=[[[0.5, 0.5, 0.0, 0.0]]], q=[[]], drafts=[[]], coins=[[]], final=[1.0])[2] == [3]


@backends
def test_every_draft_accepted_takes_the_bonus_from_the_last_row(backend):
    # Three drafts, each with p = q = 1 at its token (any coin below 1 accepts): predicts holds the drafts
    # at slots 0-2 and the bonus, drawn from row 3 = one-hot at token 2, at slot 3. A second request
    # rejects its first draft (p = .5, q = 1, coin 1.0: 1 < .5 is false) and draws from row 0's residual
    # max([0, 0, .5, .5] - [0, 0, 1, 0], 0) = [0, 0, 0, .5]: token 3.
    one = lambda t: [1.0 if c == t else 0.0 for c in range(4)]  # noqa: E731
    p = [[one(1), one(3), one(0), one(2)], [[0.0, 0.0, 0.5, 0.5]] + [one(0)] * 3]
    q = [[one(1), one(3), one(0)], [[0.0, 0.0, 1.0, 0.0]] + [one(0)] * 2]
    got = chain(backend, p=p, q=q, drafts=[[1, 3, 0], [2, 0, 0]], coins=[[0.9, 0.0, 0.99], [1.0, 0.0, 0.0]], final=[0.7, 0.2])
    assert got == ([3, 0], [[0, 1, 2, 3], [4, -1, -1, -1]], [1, 3, 0, 2, 3, 0, 0, 0])


@backends
def test_sd16_block_verification_accepts_a_prefix_token_by_token_rejects(backend):
    # p1(d1) = .25, q1 = .5 (h1 = .5); p2(d2) = .5, q2 = .25 (h2 = min(.5 * 2, 1) = 1). Longest first:
    # coin .3 < h2 = 1 at the last step accepts both; the bonus row [0, 1] gives token 1. Token by token,
    # .9 * .5 < .25 is false: rejected, and the residual [0, .25] gives token 1 at slot 0.
    rows = dict(p=[[[0.25, 0.75], [0.5, 0.5], [0.0, 1.0]]], q=[[[0.5, 0.5], [0.25, 0.75]]], drafts=[[0, 0]], coins=[[0.9, 0.3]],
                final=[0.5])
    assert chain(backend, block=True, **rows) == ([2], [[0, 1, 2]], [0, 0, 1])
    assert chain(backend, block=False, **rows) == ([0], [[0, -1, -1]], [1, 0, 0])


@backends
def test_block_verification_takes_the_residual_mass_at_the_next_row(backend):
    # h1 = .25 / .5 = .5; step 2 (d2 = 1): h2 = .5 * .5 / .9 = .278, coin .5 is not below it. Step 1: coin
    # .2 < h1, and 0 < h1 < 1, so the residual mass at row 1 decides: m = max(.5 * .5 - .1, 0) +
    # max(.25 - .9, 0) = .15, accept_prob = .15 / (1.15 - .5) = .2308 > .2: one draft accepted; the final
    # draw from that residual [.15, 0] gives token 0. At coin .24 (> .2308) nothing is accepted.
    # Token by token, .2 * .5 < .25 and .5 * .9 < .5 accept both drafts instead.
    rows = dict(p=[[[0.25, 0.75], [0.5, 0.5], [0.0, 1.0]]], q=[[[0.5, 0.5], [0.1, 0.9]]], drafts=[[0, 1]], final=[0.9])
    assert chain(backend, block=True, coins=[[0.2, 0.5]], **rows) == ([1], [[0, 1, -1]], [0, 0, 0])
    assert chain(backend, block=True, coins=[[0.24, 0.5]], **rows)[0] == [0]
    assert chain(backend, block=False, coins=[[0.2, 0.5]], **rows) == ([2], [[0, 1, 2]], [0, 1, 1])


@backends
def test_block_verification_mass_takes_the_raw_q(backend):
    # Row 1's q = [.1, 1.5]. The mass takes the raw q: m = max(.25 - .1, 0) + max(.25 - 1.5, 0) = .15 (a q'
    # of 0 would give .4 and accept_prob .4 / .9 = .444); at coin .24 the test .24 < .2308 fails: nothing
    # accepted, token 1 from row 0's residual [0, .25]. At coin .2 one draft is accepted, and the draw
    # keeps that mass as its total: the weights [.15, .25] (q' = 0 there) are cut at .99 * .15, so token 0
    # (normalising by their own sum .4 would give token 1).
    rows = dict(p=[[[0.25, 0.75], [0.5, 0.5], [0.0, 1.0]]], q=[[[0.5, 0.5], [0.1, 1.5]]], drafts=[[0, 1]], final=[0.99])
    assert chain(backend, block=True, coins=[[0.24, 0.5]], **rows) == ([0], [[0, -1, -1]], [1, 0, 0])
    assert chain(backend, block=True, coins=[[0.2, 0.5]], **rows) == ([1], [[0, 1, -1]], [0, 0, 0])


@backends
def test_a_vocabulary_off_the_tile(backend):
    # V = 37 in 16-wide tiles, the bonus one-hot at token 36 (the last tile's last column), and at token
    # 17 (the second tile): the draw crosses tiles with its carry.
    for hot in (36, 17, 0):
        p = [[[1.0 if c == hot else 0.0 for c in range(37)]]]
        assert chain(backend, p=p, q=[[]], drafts=[[]], coins=[[]], final=[0.61])[2] == [hot]


@backends
def test_the_call_site_tile(backend):
    # SGLang's BLOCK_V 4096 over V = 4100: the bonus's mass in the second tile, at token 4099 and 4096.
    for hot in (4099, 4096):
        p = torch.zeros(1, 1, 4100)
        p[0, 0, hot] = 0.75
        p[0, 0, 5] = 0.25
        a = chain_args(p=p.tolist(), q=[[]], drafts=[[]], coins=[[]], final=[0.5], block_v=4096)
        a["BLOCK_REDUCE"] = 8192
        assert run(backend, contract.K46, (1,), **a)["Predicts"].tolist() == [hot]


def _classic_invalid() -> dict:
    return chain_args(p=[[[0.5, 0.5], [0.5, 0.5]]], q=[[[0.5, 0.5]]], drafts=[[1]], coins=[[0.5]], final=[0.5])


@ours
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(Candidates=i64([[0, -1]])), ValueError, "Candidates"),
        (dict(Candidates=i64([[0, 2]])), ValueError, "Candidates"),
        (dict(RetriveIndex=i64([[0, 2]]), AcceptIndex=torch.full((1, 2), -1, dtype=torch.int32)), ValueError, "RetriveIndex"),
        (dict(RetriveIndex=i64([[1, 1]])), ValueError, "RetriveIndex"),
        (dict(UniformSamples=f32([[1.5, 0.5]])), ValueError, "UniformSamples"),
        (dict(UniformSamplesFinal=f32([float("nan")])), ValueError, "UniformSamplesFinal"),
        (dict(TargetProbs=f32([[[0.5, float("nan")], [0.5, 0.5]]])), ValueError, "TargetProbs"),
        (dict(TargetProbs=f32([[[0.5, 1.5], [0.5, 0.5]]])), ValueError, "TargetProbs"),
        (dict(stride_tp_s=3), ValueError, "stride_tp_s"),
        (dict(stride_cand_s=2), ValueError, "stride_cand_s"),
        (dict(AcceptIndex=torch.full((1, 3), -1, dtype=torch.int32)), ValueError, "AcceptIndex"),
        (dict(BLOCK_V=12), ValueError, "BLOCK_V"),
        (dict(NUM_SLOTS=3), ValueError, "Candidates"),
        (dict(VOCAB_SIZE=3), ValueError, "TargetProbs"),
        (dict(BLOCK_VERIFICATION=True, DraftProbs=f32([[[-0.5, 0.5]]])), ValueError, "DraftProbs"),
        (dict(TargetProbs=torch.full((1, 2, 2), 0.5, dtype=torch.float64)), TypeError, "TargetProbs"),
    ],
)
def test_classic_invalid(backend, change, error, param):
    refused(backend, contract.K46, _classic_invalid() | change, error, param)


@ours
def test_classic_accepts_what_only_token_by_token_reads(backend):
    # Negative and NaN q are refused only under block verification (its mass takes the raw q).
    a = _classic_invalid() | dict(DraftProbs=f32([[[-0.5, float("nan")]]]))
    assert run(backend, contract.K46, (1,), **a)["AcceptTokenNum"].tolist() == [0]


# -- K47 -------------------------------------------------------------------------------------------
# Root 0 with children 1 and 2 (siblings), 2 with child 3: next_token [1, -1, 3, -1], next_sibling [-1, 2, -1, -1].
TREE = dict(next_token=[1, -1, 3, -1], next_sibling=[-1, 2, -1, -1])


def greedy_args(cand: list, target: list, next_token: list, next_sibling: list, spec: int, dtype: torch.dtype = torch.int64) -> dict:
    c = torch.tensor(cand, dtype=dtype)
    bs, n = c.shape
    t = lambda x: torch.tensor(x, dtype=dtype)  # noqa: E731
    return dict(predicts_ptr=torch.zeros(bs * n, dtype=torch.int32), accept_index_ptr=torch.full((bs, spec), -1, dtype=torch.int32),
                accept_token_num_ptr=torch.full((bs,), -7, dtype=torch.int32), candidates_ptr=c,
                retrieve_index_ptr=torch.arange(bs * n, dtype=dtype).view(bs, n), retrieve_next_token_ptr=t(next_token),
                retrieve_next_sibling_ptr=t(next_sibling), target_predict_ptr=t(target), batch_size=bs,
                num_speculative_tokens=spec, num_draft_tokens=n)


def greedy(backend: str, **kw) -> tuple[list[int], list[list[int]], list[int]]:
    a = run(backend, contract.K47, (len(kw["cand"]),), **greedy_args(**kw))
    return a["accept_token_num_ptr"].tolist(), a["accept_index_ptr"].tolist(), a["predicts_ptr"].tolist()


@backends
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_greedy_tree_walks_siblings(backend, dtype):
    # Request 0: the root's argmax 20 misses node 1 (10), matches its sibling node 2 (20); node 2's argmax 30
    # matches its child node 3: two drafts, the bonus node 3's argmax 7. Request 1 (slots 4-7): the root's
    # argmax 99 matches no child: no draft, the correction 99 at slot 4.
    cand = [[5, 10, 20, 30], [5, 10, 20, 30]]
    target = [[20, 0, 30, 7], [99, 0, 30, 7]]
    kw = dict(next_token=[TREE["next_token"]] * 2, next_sibling=[TREE["next_sibling"]] * 2, spec=3, dtype=dtype)
    got = greedy(backend, cand=cand, target=target, **kw)
    assert got == ([2, 0], [[0, 2, 3], [4, -1, -1]], [20, 0, 30, 7, 99, 0, 0, 0])


@backends
def test_greedy_tree_stops_at_spec_and_at_leaves(backend):
    # A deep chain 0 -> 1 -> 2 -> 3 -> 4, every draft matching: spec = 3 accepts two drafts (the bonus at
    # node 2's slot), spec = 6 accepts all four and stops at the leaf (node 4: its argmax at slot 4).
    chain_links = dict(next_token=[[1, 2, 3, 4, -1]], next_sibling=[[-1] * 5])
    cand, target = [[9, 1, 2, 3, 4]], [[1, 2, 3, 4, 8]]
    assert greedy(backend, cand=cand, target=target, spec=3, **chain_links) == ([2], [[0, 1, 2]], [1, 2, 3, 0, 0])
    got = greedy(backend, cand=cand, target=target, spec=6, **chain_links)
    assert got == ([4], [[0, 1, 2, 3, 4, -1]], [1, 2, 3, 4, 8])


@ours
@pytest.mark.parametrize(
    "change, param",
    [
        (dict(retrieve_next_sibling_ptr=i64([[-1, 2, 1, -1]])), "retrieve_next_sibling_ptr"),  # a sibling cycle
        (dict(retrieve_next_token_ptr=i64([[1, -1, 4, -1]])), "retrieve_next_token_ptr"),
        (dict(retrieve_next_sibling_ptr=i64([[-1, -2, -1, -1]])), "retrieve_next_sibling_ptr"),
        (dict(retrieve_index_ptr=i64([[0, 1, 2, 4]])), "retrieve_index_ptr"),
        (dict(retrieve_index_ptr=i64([[0, 1, 1, 3]])), "retrieve_index_ptr"),
        (dict(target_predict_ptr=i64([[2**31, 0, 0, 0]])), "target_predict_ptr"),
        (dict(accept_index_ptr=torch.full((1, 2), -1, dtype=torch.int32)), "accept_index_ptr"),
        (dict(num_draft_tokens=3), "candidates_ptr"),
    ],
)
def test_greedy_refuses_malformed_trees(backend, change, param):
    a = greedy_args(cand=[[5, 10, 20, 30]], target=[[20, 0, 30, 7]], spec=3, next_token=[TREE["next_token"]],
                    next_sibling=[TREE["next_sibling"]])
    refused(backend, contract.K47, a | change, ValueError, param)


# -- K48 -------------------------------------------------------------------------------------------
def target_only_args(p: list, cand: list, next_token: list, next_sibling: list, coins: list, final: list, spec: int,
                     single: float = 1.0, acc: float = 1.0) -> dict:
    tp = f32(p)
    bs, n, v = tp.shape
    return dict(predicts=torch.zeros(bs * n, dtype=torch.int32), accept_index=torch.full((bs, spec), -1, dtype=torch.int32),
                accept_token_num=torch.full((bs,), -7, dtype=torch.int32), candidates=i64(cand),
                retrive_index=torch.arange(bs * n).view(bs, n), retrive_next_token=i64(next_token),
                retrive_next_sibling=i64(next_sibling), uniform_samples=f32(coins), uniform_samples_for_final_sampling=f32(final),
                target_probs=tp, draft_probs=torch.zeros_like(tp), threshold_single=single, threshold_acc=acc, deterministic=True)


def target_only(backend: str, **kw) -> dict:
    return run(backend, contract.K48, (len(kw["cand"]),), **target_only_args(**kw))


# Root 0 with children 1 and 2 (siblings), drafting tokens 1 and 3; the root's row p = [.1, .2, .3, .4].
ROOT_ROW = [0.1, 0.2, 0.3, 0.4]
SIBLINGS = dict(cand=[[0, 1, 3]], next_token=[[1, -1, -1]], next_sibling=[[-1, 2, -1]], spec=2)


@hosted
def test_target_only_siblings_share_the_level_coin(backend):
    # Coin .45: node 1 (p = .2) runs the level's sum to .2, not above .45: rejected, its lane of draft_probs
    # becomes .2; node 2 (p = .4) runs it to .6 > .45: accepted. spec = 2: the bonus from node 2's row
    # one-hot at token 2.
    p = [[ROOT_ROW, [0.25] * 4, [0.0, 0.0, 1.0, 0.0]]]
    a = target_only(backend, p=p, coins=[[0.45, 0.0, 0.0]], final=[0.5], **SIBLINGS)
    assert a["accept_token_num"].tolist() == [1] and a["accept_index"].tolist() == [[0, 2]]
    assert a["predicts"].tolist() == [3, 0, 2]
    want = torch.zeros(1, 3, 4)
    want[0, 0, 1] = 0.2
    assert torch.equal(a["draft_probs"], want)


@hosted
def test_target_only_draws_from_p_without_the_rejected_siblings(backend):
    # Coin .95: both siblings rejected (sums .2 and .6), lanes 1 and 3 of row 0 take p; the residual
    # p - draft_probs = [.1, 0, .3, 0], total .4: final coin .5 cuts at .2, inside token 2's (.1, .4].
    p = [[ROOT_ROW, [0.25] * 4, [0.25] * 4]]
    a = target_only(backend, p=p, coins=[[0.95, 0.0, 0.0]], final=[0.5], **SIBLINGS)
    assert a["accept_token_num"].tolist() == [0] and a["accept_index"].tolist() == [[0, -1]]
    assert a["predicts"].tolist() == [2, 0, 0]
    assert a["draft_probs"][0, 0].tolist() == [0.0, f32(0.2).item(), 0.0, f32(0.4).item()]
    # The final coin 1.0 overruns the sum: the last positive lane, 2 (the chain kernel would say V - 1).
    assert target_only(backend, p=p, coins=[[0.95, 0.0, 0.0]], final=[1.0], **SIBLINGS)["predicts"].tolist() == [2, 0, 0]


@hosted
def test_target_only_thresholds_and_zero_mass(backend):
    # threshold_single .35: node 2's p = .4 >= .35 is accepted at coin .95 (SD15).
    p = [[ROOT_ROW, [0.25] * 4, [0.0, 1.0, 0.0, 0.0]]]
    got = target_only(backend, p=p, coins=[[0.95, 0.0, 0.0]], final=[0.5], single=0.35, **SIBLINGS)
    assert got["accept_index"].tolist() == [[0, 2]] and got["predicts"].tolist() == [3, 0, 1]
    # p = 1 at threshold 1 accepts at coin 1.0; p = 0 (SGLang #35771) never, not even at coin 0.
    p = [[[0.0, 1.0, 0.0, 0.0], [0.25] * 4, [0.0, 1.0, 0.0, 0.0]]]
    got = target_only(backend, p=p, coins=[[1.0, 0.0, 0.0]], final=[0.5], **SIBLINGS)
    assert got["accept_index"].tolist() == [[0, 1]]
    p = [[[0.0, 0.0, 0.0, 1.0], [0.25] * 4, [0.25] * 4]]
    got = target_only(backend, p=p, coins=[[0.0, 0.0, 0.0]], final=[0.5], cand=[[0, 0, 3]], next_token=[[1, -1, -1]],
                      next_sibling=[[-1, 2, -1]], spec=2)
    # node 1 (token 0, p = 0) rejected at coin 0; node 2 (token 3, p = 1) accepted; the bonus row [.25] * 4
    # cut at .5 gives token 2 (the prefix sum .5 at token 1 is not above it).
    assert got["accept_index"].tolist() == [[0, 2]] and got["predicts"].tolist() == [3, 0, 2]


@hosted
def test_target_only_on_a_chain_takes_the_accepted_nodes_coin(backend):
    # A chain 0 -> 1 -> 2 (spec 3): level 1 uses coin column 0 (.5 < p = .6), level 2 the accepted node 1's
    # column (.9, not below p = .3): one draft; node 2's lane of row 1 takes p; the residual of row 1 is
    # [.7, 0] - ... = p with lane 1 zeroed: [.7, 0] gives token 0.
    p = [[[0.4, 0.6], [0.7, 0.3], [0.5, 0.5]]]
    a = target_only(backend, p=p, cand=[[0, 1, 1]], next_token=[[1, 2, -1]], next_sibling=[[-1, -1, -1]], coins=[[0.5, 0.9, 0.0]],
                    final=[0.99], spec=3)
    assert a["accept_token_num"].tolist() == [1] and a["predicts"].tolist() == [1, 0, 0]
    assert a["draft_probs"][0, 1].tolist() == [0.0, f32(0.3).item()]


@ours
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(candidates=i64([[0, 1, 4]])), ValueError, "candidates"),
        (dict(retrive_next_sibling=i64([[-1, 2, 1]])), ValueError, "retrive_next_sibling"),
        (dict(threshold_acc=1.5), ValueError, "threshold_acc"),
        (dict(uniform_samples=f32([[0.5, -0.1, 0.0]])), ValueError, "uniform_samples"),
        (dict(candidates=torch.tensor([[0, 1, 3]], dtype=torch.int32)), TypeError, "candidates"),
        (dict(draft_probs=torch.full((1, 3, 4), 2.0)), ValueError, "draft_probs"),
        (dict(predicts=torch.zeros(4, dtype=torch.int32)), ValueError, "predicts"),
    ],
)
def test_target_only_invalid(backend, change, error, param):
    a = target_only_args(p=[[ROOT_ROW] * 3], coins=[[0.5, 0.5, 0.5]], final=[0.5], **SIBLINGS)
    refused(backend, contract.K48, a | change, error, param)
