"""Model Runner V2's logprob kernels (K43 ``_topk_log_softmax_kernel``, K44 ``_ranks_kernel``, K45
``_fill_logprob_token_ids_kernel``): goldens worked out by hand on every backend, C29's tree against
tile order, vLLM's launch forms, and invalid input."""

from __future__ import annotations

import math

import pytest
import torch
from support import BACKENDS, f32, i32, i64, refused, run

from contracts import logprob as contract
from contracts import numerics

backends = pytest.mark.parametrize("backend", BACKENDS)
ours = pytest.mark.parametrize("backend", ["reference", "cpu"])
INF = math.inf


def log_softmax(backend: str, logits: torch.Tensor, ids: torch.Tensor, block: int = 16, topk_block: int = 4) -> torch.Tensor:
    n, topk = ids.shape
    out = torch.full((n, topk), 7.0)
    run(backend, contract.K43, (n,), output_ptr=out, logits_ptr=logits, logits_stride=logits.stride(0), topk_ids_ptr=ids,
        topk_ids_stride=ids.stride(0), topk=topk, vocab_size=logits.shape[1], BLOCK_SIZE=block, TOPK_BLOCK_SIZE=topk_block)
    return out


def ranks(backend: str, logits: torch.Tensor, tokens: list[int], block: int = 8) -> list[int]:
    out = torch.full((logits.shape[0],), -9, dtype=torch.int64)
    run(backend, contract.K44, (logits.shape[0],), output_ptr=out, logits_ptr=logits, logits_stride=logits.stride(0),
        token_ids_ptr=i64(tokens), vocab_size=logits.shape[1], BLOCK_SIZE=block)
    return out.tolist()


def rn32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float64).to(torch.float32))


def same_scores(backend: str, got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit for bit; vLLM's own kernel within C29's departure (its float32 exp, log and sums: 1e-5
    relative, 1e-6 absolute; docs/logprob.md)."""
    want = torch.as_tensor(want, dtype=torch.float32)
    if backend != "vllm":
        return torch.equal(got, want)
    return torch.allclose(got, want, rtol=1e-5, atol=1e-6) and torch.equal(got.isinf(), want.isinf())


@backends
def test_equal_logits_score_minus_log_v(backend):
    # Every x - G is 0, exp32(0) = 1 exactly, so the tiles sum to 16, 16, ..., 4 (V = 100, 16-wide
    # tiles), T = 100 exactly and L = RN(ln 100): each score is 0 - L. The row's level changes nothing.
    for level in (0.0, 5.25, -3e4):
        x = torch.full((2, 100), level)
        got = log_softmax(backend, x, i64([[0, 99, 50], [7, 7, 7]]))
        assert same_scores(backend, got, [[-rn32(math.log(100))] * 3] * 2)


@backends
def test_tiny_terms_truncate_and_minus_inf_scores_minus_inf(backend):
    # Row 0: exp32(-100) is below C29's unit 2^-46, so T = 1, L = 0: the maximum scores 0 and the other
    # logit its own difference, -100, exactly. Row 1: two equal maxima and -inf columns: T = 2 exactly,
    # the maxima score -RN(ln 2), the -inf columns -inf. Ids repeat and run past one 2-wide chunk.
    x = f32([[0.0, -100.0, -100.0, -100.0, -100.0], [3.0, -INF, 3.0, -INF, -INF]])
    got = log_softmax(backend, x, i64([[0, 1, 0, 4, 1], [2, 1, 0, 2, 3]]), block=4, topk_block=2)
    ln2 = rn32(math.log(2))
    assert same_scores(backend, got, [[0.0, -100.0, 0.0, -100.0, -100.0], [-ln2, -INF, -ln2, -ln2, -INF]])


@backends
def test_half_precision_logits_read_as_float32(backend):
    # bfloat16 and float16 values are float32 values: the same scores as their float32 copies.
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(4)) * 4
    ids = torch.randint(0, 40, (3, 6), generator=torch.Generator().manual_seed(5))
    for dtype in (torch.bfloat16, torch.float16):
        low = x.to(dtype)
        assert torch.equal(log_softmax(backend, low, ids), log_softmax(backend, low.float(), ids))


@ours
def test_scores_are_c29s_log_softmax(backend):
    # The oracle's statement, computed here from C29's parts: tile sums of exp32, their tree_sum, its log.
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 300, generator=g) * 6
    x[1, ::4] = -INF
    ids = torch.randint(0, 300, (2, 9), generator=g)
    got = log_softmax(backend, x, ids, block=64, topk_block=8)
    for r in range(2):
        top = x[r].max()
        tiles = torch.cat([x[r], torch.full((20,), -INF)]).view(5, 64)
        total = numerics.tree_sum(numerics.exact_sum(numerics.exp32(tiles - top)))
        want = (x[r][ids[r]] - top) - torch.log(total).to(torch.float32)
        assert torch.equal(got[r], want)
        assert torch.allclose(got[r].double(), torch.log_softmax(x[r].double(), 0)[ids[r]], atol=1e-5)


@backends
def test_tiles_are_summed_in_c29s_tree_not_in_order(backend):
    # Tile sums whose total passes 2^10 while others are a few units of 2^-46: float64 rounds, so the
    # fold in halves and a sum in tile order differ (in float64; float32's L rarely shows it). Every
    # backend's normalizer is the tree's, over 188 tiles (a width of 256: 68 padding tiles).
    v, block = 3000, 16
    nb = -(-v // block)
    g = torch.Generator().manual_seed(3)
    kind = torch.randint(0, 3, (nb,), generator=g).repeat_interleave(block)[:v]
    x = torch.where(kind == 1, -30.0 - 3 * torch.rand(v, generator=g), torch.where(kind == 2, -1e-3 * torch.rand(v, generator=g), 0.0))
    tiles = torch.cat([x, torch.full((nb * block - v,), -INF)]).view(nb, block)
    sums = numerics.exact_sum(numerics.exp32(tiles - x.max())).double()
    in_order = 0.0
    for s in sums.tolist():
        in_order += s
    tree = float(numerics.tree_sum(sums))
    assert in_order != tree
    lse = torch.tensor(rn32(math.log(tree)))
    got = log_softmax(backend, x.view(1, v), i64([[0, 5, 2999]]), block=block)
    assert same_scores(backend, got[0], (x[[0, 5, 2999]] - x.max()) - lse)


@backends
def test_ranks_count_ties(backend):
    # Row: 3, -1, 3, -0.0, 0.0, 2, 3 (V = 7 in one 8-wide tile). Token 0 (3): the three 3s. Token 4 (+0.0):
    # the -0.0 ties with it, the -1 stays below: 6. Token 1 (-1): all 7. The last row has a NaN at
    # column 1, which never counts: token 5 (2) ranks 4 (the 2 and the three 3s).
    x = f32([[3.0, -1.0, 3.0, -0.0, 0.0, 2.0, 3.0]] * 3 + [[3.0, float("nan"), 3.0, -0.0, 0.0, 2.0, 3.0]])
    assert ranks(backend, x, [0, 4, 1, 5]) == [3, 6, 7, 4]


@backends
def test_rank_of_a_token_at_minus_inf(backend):
    # A sampled (or forced) token at -inf: every column of [0, V) is >= it. V = 5 in an 8-wide tile, and
    # V = 19 over three 8-wide tiles, one -inf column besides.
    x = f32([[0.5, -INF, 2.0, -1.0, 3.0]])
    y = torch.arange(19, dtype=torch.float32).view(1, 19)
    y[0, 4] = y[0, 11] = -INF
    want = [[5], [19]]
    if backend == "vllm":  # its masked lanes load -inf and tie with the token: finding (docs/logprob.md)
        want = [[8], [24]]
    assert [ranks(backend, x, [1]), ranks(backend, y, [11])] == want


@backends
def test_rank_of_a_nan_token_is_zero(backend):
    x = f32([[1.0, float("nan"), -INF]])
    assert ranks(backend, x, [1]) == [0]


def fill(backend: str, counts: list[int], mapping: list[int], num_topk: int, padded: int, width: int,
         topk: torch.Tensor | None = None) -> tuple[list[list[int]], list[list[bool]]]:
    n = len(mapping)
    table = torch.arange(1000, 1000 + 8 * len(counts), dtype=torch.int32).view(len(counts), 8)
    topk = table if topk is None else topk  # NUM_TOPK == 0: vLLM passes the table as a placeholder
    out = torch.zeros(n, width, dtype=torch.int64)
    valid = torch.zeros(n, width, dtype=torch.bool)
    run(backend, contract.K45, (n,), out_token_ids_ptr=out, out_token_ids_stride=out.stride(0), out_valid_mask_ptr=valid,
        out_valid_mask_stride=valid.stride(0), sampled_token_ids_ptr=i64([900 + r for r in range(n)]), topk_indices_ptr=topk,
        topk_indices_stride=topk.stride(0), expanded_idx_mapping_ptr=i32(mapping), num_per_req_token_ids_ptr=i32(counts),
        per_req_token_ids_ptr=table, per_req_token_ids_stride=table.stride(0), NUM_TOPK=num_topk, PADDED_COLS=padded)
    return out.tolist(), valid.tolist()


@backends
def test_fill_custom_ids_override_the_top_k(backend):
    # State 1 names two ids (1008, 1009: row 1 of the table), state 0 none. Rows 0 and 2 (state 1) take
    # them; row 1 (state 0) its three top-k ids. Columns past those written stay zero / False.
    topk = i32([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
    ids, valid = fill(backend, [0, 2], [1, 0, 1], 3, 4, 5, topk)
    assert ids == [[900, 1008, 1009, 0, 0], [901, 20, 21, 22, 0], [902, 1008, 1009, 0, 0]]
    assert valid == [[True, True, True, False, False], [True, True, True, True, False], [True, True, True, False, False]]


@backends
def test_fill_without_top_k(backend):
    # NUM_TOPK == 0 (prompt-only ids): a request without ids writes its sampled token alone.
    ids, valid = fill(backend, [3, 0], [0, 1], 0, 4, 4)
    assert ids == [[900, 1000, 1001, 1002], [901, 0, 0, 0]]
    assert valid == [[True] * 4, [True, False, False, False]]


@backends
def test_vllm_launch_forms(backend):
    # compute_topk_scores: ids = [sampled, top-k] (int64), K43 at BLOCK_SIZE 1024 and TOPK_BLOCK_SIZE
    # min(next_power_of_2(1 + k), 1024), K44 at 8192; with per-request ids, K45 at PADDED_COLS
    # next_power_of_2(num_cols) over the host's zeros.
    g = torch.Generator().manual_seed(8)
    x = torch.randn(3, 2500, generator=g) * 3
    sampled = i64([5, 17, 2400])
    top = torch.topk(x, 4, dim=-1).indices
    ids = torch.cat((sampled.unsqueeze(-1), top), dim=1)
    got = log_softmax(backend, x, ids, block=1024, topk_block=8)
    assert torch.allclose(got.double(), torch.log_softmax(x.double(), -1).gather(1, ids), rtol=0, atol=2e-6)
    assert ranks(backend, x, sampled.tolist(), block=8192) == [int((x[r] >= x[r, sampled[r]]).sum()) for r in range(3)]
    table = torch.zeros(4, 128, dtype=torch.int32)
    table[2, :6] = torch.arange(100, 106)
    out, valid = torch.zeros(3, 7, dtype=torch.int64), torch.zeros(3, 7, dtype=torch.bool)
    run(backend, contract.K45, (3,), out_token_ids_ptr=out, out_token_ids_stride=7, out_valid_mask_ptr=valid,
        out_valid_mask_stride=7, sampled_token_ids_ptr=sampled, topk_indices_ptr=top.to(torch.int32), topk_indices_stride=4,
        expanded_idx_mapping_ptr=i32([0, 2, 3]), num_per_req_token_ids_ptr=i32([0, 0, 6, 0]), per_req_token_ids_ptr=table,
        per_req_token_ids_stride=128, NUM_TOPK=4, PADDED_COLS=8)
    assert out[1].tolist() == [17, *range(100, 106)] and torch.equal(out[[0, 2], :5], torch.cat((sampled[[0, 2], None], top[[0, 2]]), 1))
    assert valid.sum(1).tolist() == [5, 7, 5]


# -- invalid input ------------------------------------------------------------------------------------
def _k43_args() -> dict:
    return dict(output_ptr=torch.zeros(2, 3), logits_ptr=torch.zeros(2, 8), logits_stride=8, topk_ids_ptr=i64([[0, 1, 2]] * 2),
                topk_ids_stride=3, topk=3, vocab_size=8, BLOCK_SIZE=8, TOPK_BLOCK_SIZE=2)


def _with_logit(r: int, c: int, value: float) -> dict:
    x = torch.zeros(2, 8)
    x[r, c] = value
    return dict(logits_ptr=x)


@ours
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(topk_ids_ptr=i64([[0, 1, 2], [0, 8, 1]])), ValueError, "topk_ids_ptr"),
        (dict(topk_ids_ptr=i64([[0, -1, 2], [0, 1, 1]])), ValueError, "topk_ids_ptr"),
        (dict(topk_ids_ptr=i64([[0, 1, 2]])), ValueError, "topk_ids_ptr"),
        (dict(output_ptr=torch.zeros(1, 5)), ValueError, "output_ptr"),
        (_with_logit(1, 3, float("nan")), ValueError, "logits_ptr"),
        (_with_logit(0, 0, INF), ValueError, "logits_ptr"),
        (dict(logits_ptr=torch.full((2, 8), -INF)), ValueError, "logits_ptr"),
        (dict(vocab_size=9), ValueError, "logits_stride"),
        (dict(logits_stride=4), ValueError, "logits_stride"),
        (dict(topk_ids_stride=2), ValueError, "topk_ids_stride"),
        (dict(BLOCK_SIZE=6), ValueError, "BLOCK_SIZE"),
        (dict(BLOCK_SIZE=2**17), ValueError, "BLOCK_SIZE"),
        (dict(TOPK_BLOCK_SIZE=3), ValueError, "TOPK_BLOCK_SIZE"),
        (dict(topk=-1), ValueError, "topk"),
        (dict(vocab_size=2**31 - 4), ValueError, "vocab_size"),
        (dict(output_ptr=torch.zeros(2, 3, dtype=torch.float64)), TypeError, "output_ptr"),
        (dict(topk_ids_ptr=f32([[0, 1, 2]] * 2)), TypeError, "topk_ids_ptr"),
    ],
)
def test_log_softmax_invalid(backend, change, error, param):
    refused(backend, contract.K43, _k43_args() | change, error, param)


@ours
def test_log_softmax_judges_only_rows_it_scores(backend):
    # topk == 0 scores nothing: a row of NaN is never read there.
    a = _k43_args() | dict(logits_ptr=torch.full((2, 8), float("nan")), topk=0)
    run(backend, contract.K43, (2,), **a)
    assert bool((a["output_ptr"] == 0).all())


def _k44_args() -> dict:
    return dict(output_ptr=torch.zeros(2, dtype=torch.int64), logits_ptr=torch.zeros(2, 8), logits_stride=8,
                token_ids_ptr=i64([0, 7]), vocab_size=8, BLOCK_SIZE=8)


@ours
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(token_ids_ptr=i64([0, 8])), ValueError, "token_ids_ptr"),
        (dict(token_ids_ptr=i64([-1, 0])), ValueError, "token_ids_ptr"),
        (dict(token_ids_ptr=i64([0])), ValueError, "token_ids_ptr"),
        (dict(output_ptr=torch.zeros(1, dtype=torch.int64)), ValueError, "output_ptr"),
        (dict(logits_stride=7), ValueError, "logits_stride"),
        (dict(BLOCK_SIZE=12), ValueError, "BLOCK_SIZE"),
        (dict(output_ptr=torch.zeros(2, dtype=torch.int32)), TypeError, "output_ptr"),
    ],
)
def test_ranks_invalid(backend, change, error, param):
    refused(backend, contract.K44, _k44_args() | change, error, param)


def _k45_args() -> dict:
    table = torch.arange(16, dtype=torch.int32).view(2, 8)
    return dict(out_token_ids_ptr=torch.zeros(2, 5, dtype=torch.int64), out_token_ids_stride=5,
                out_valid_mask_ptr=torch.zeros(2, 5, dtype=torch.bool), out_valid_mask_stride=5,
                sampled_token_ids_ptr=i64([1, 2]), topk_indices_ptr=i32([[1, 2, 3], [4, 5, 6]]), topk_indices_stride=3,
                expanded_idx_mapping_ptr=i32([0, 1]), num_per_req_token_ids_ptr=i32([4, 0]), per_req_token_ids_ptr=table,
                per_req_token_ids_stride=8, NUM_TOPK=3, PADDED_COLS=4)


@ours
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(num_per_req_token_ids_ptr=i32([5, 0]), out_token_ids_ptr=torch.zeros(2, 9, dtype=torch.int64),
              out_token_ids_stride=9), ValueError, "num_per_req_token_ids_ptr"),  # more ids than PADDED_COLS
        (dict(num_per_req_token_ids_ptr=i32([4, 0]), PADDED_COLS=8, per_req_token_ids_ptr=torch.zeros(2, 3, dtype=torch.int32),
              per_req_token_ids_stride=3), ValueError, "num_per_req_token_ids_ptr"),  # wider than the table's rows
        (dict(out_token_ids_ptr=torch.zeros(2, 4, dtype=torch.int64), out_token_ids_stride=4), ValueError, "out_token_ids_stride"),
        (dict(out_token_ids_ptr=torch.zeros(2, 5, dtype=torch.int64)[:, :4]), ValueError, "out_token_ids_ptr"),
        (dict(out_valid_mask_ptr=torch.zeros(2, 6, dtype=torch.bool)[:, :4], out_valid_mask_stride=6), ValueError,
         "out_valid_mask_ptr"),
        (dict(expanded_idx_mapping_ptr=i32([0, 2])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(expanded_idx_mapping_ptr=i32([-1, 0])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(sampled_token_ids_ptr=i64([1])), ValueError, "sampled_token_ids_ptr"),
        (dict(topk_indices_ptr=i32([[1, 2, 3]])), ValueError, "topk_indices_ptr"),
        (dict(NUM_TOPK=5), ValueError, "NUM_TOPK"),
        (dict(PADDED_COLS=6), ValueError, "PADDED_COLS"),
        (dict(per_req_token_ids_stride=4), ValueError, "per_req_token_ids_stride"),
        (dict(out_token_ids_ptr=torch.zeros(2, 5, dtype=torch.int32)), TypeError, "out_token_ids_ptr"),
    ],
)
def test_fill_invalid(backend, change, error, param):
    refused(backend, contract.K45, _k45_args() | change, error, param)


@ours
def test_fill_reads_the_top_k_only_where_a_row_takes_it(backend):
    # Every row names its own ids: a one-row top-k tensor is never read past its row 0.
    a = _k45_args() | dict(num_per_req_token_ids_ptr=i32([2, 3]), topk_indices_ptr=i32([[1, 2, 3]]))
    run(backend, contract.K45, (2,), **a)
    assert a["out_token_ids_ptr"].tolist() == [[1, 0, 1, 0, 0], [2, 8, 9, 10, 0]]
