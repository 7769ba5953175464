"""Model Runner V2's rejection sampler (K11–K18): golden examples on every backend, Hypothesis
conformance across the three backends, and invalid input on the reference and CPU launchers."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from support import BACKENDS as BACKEND_NAMES
from support import TRITON_NIGHTLY, composed, f32, i32, i64, run

from conformance.backends import BACKENDS
from contracts import mrv2 as contract
from contracts.spec import KernelSpec

I32, I64 = torch.int32, torch.int64
POISON = -9

backends = pytest.mark.parametrize("backend", BACKEND_NAMES)
cpu_and_reference = pytest.mark.parametrize("backend", ["reference", "cpu"])


def launch(backend: str, spec: KernelSpec, args: dict[str, Any]) -> None:
    run(backend, spec.name, spec.grid(args), **args)


def poisoned(n: int, dtype: torch.dtype = I32) -> torch.Tensor:
    return torch.full((n,), POISON, dtype=dtype)


# -- K11 _gather_draft_sampled_kernel ------------------------------------------------------------------
def gather_args(block: int = 1024, spare: int = 0) -> dict[str, Any]:
    # Two requests: slot 2 with 2 drafts (positions 10..12, prefill 11), slot 0 with none
    # (position 40). Rows read tokens 1..3 and 5 of a 6-token schedule.
    return dict(
        draft_sampled_ptr=poisoned(4 + spare),
        pos_ptr=poisoned(4 + spare, I64),
        input_ids_ptr=i32([90, 91, 92, 93, 94, 95]),
        positions_ptr=i64([9, 10, 11, 12, 39, 40]),
        logits_indices_ptr=i64([1, 2, 3, 5]),
        expanded_idx_mapping_ptr=i64([2, 2, 2, 0]),
        expanded_local_pos_ptr=i32([0, 1, 2, 0]),
        prefill_len_ptr=i32([3, 100, 11]),
        num_logits=4,
        BLOCK_SIZE=block,
    )


@backends
@pytest.mark.parametrize("block", [1024, 2, 1], ids=["call-site-tile", "two-tiles", "one-row-tiles"])
@pytest.mark.parametrize("spare", [0, 2], ids=["exact", "spare-cells"])
def test_golden_gather(backend, block, spare):
    a = gather_args(block, spare)
    launch(backend, contract.GATHER_DRAFT_SAMPLED, a)
    # Row 1 (local 1): 11 - 1 = 10 < prefill 11 -> placeholder; row 2: 12 - 2 = 10 < 11 too.
    # Row 0 is a bonus-position row (local 0), never a placeholder; slot 0's prefill 3 is irrelevant.
    assert a["draft_sampled_ptr"].tolist() == [91, -1, -1, 95] + [POISON] * spare
    assert a["pos_ptr"].tolist() == [10, 11, 12, 40] + [POISON] * spare


@backends
def test_golden_gather_prefill_boundary(backend):
    # position - local_pos == prefill_len is not a placeholder: the step began at the prefill's end.
    a = gather_args()
    a["prefill_len_ptr"] = i32([3, 100, 10])
    launch(backend, contract.GATHER_DRAFT_SAMPLED, a)
    assert a["draft_sampled_ptr"].tolist() == [91, 92, 93, 95]


# -- K12 _flatten_sampled_kernel -----------------------------------------------------------------------
def flatten_args(counts: list[int], spare: int = 0) -> dict[str, Any]:
    sampled = i64([[1, 2, 3, POISON], [4, 5, POISON, POISON], [6, 7, 8, 9]])[:, :3]  # a column slice
    return dict(
        flat_sampled_ptr=torch.zeros(8 + spare, dtype=I64),
        sampled_ptr=sampled,
        sampled_stride=sampled.stride(0),
        num_sampled_ptr=i32(counts),
        cu_num_logits_ptr=i32([0, 3, 5, 8]),
    )


@backends
@pytest.mark.parametrize(
    "counts, flat",
    [
        ([3, 2, 3], [1, 2, 3, 4, 5, 6, 7, 8]),
        ([1, 0, 2], [1, 0, 0, 0, 0, 6, 7, 0]),  # rows past num_sampled keep the host's zeros
        ([0, 0, 0], [0] * 8),
    ],
    ids=["all", "some", "none"],
)
def test_golden_flatten(backend, counts, flat):
    a = flatten_args(counts, spare=2)
    launch(backend, contract.FLATTEN_SAMPLED, a)
    assert a["flat_sampled_ptr"].tolist() == flat + [0, 0]




# -- invalid input -----------------------------------------------------------------------------------
def _refused(backend: str, spec: KernelSpec, a: dict[str, Any], error: type, param: str) -> None:
    before = {k: v.clone() for k, v in a.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(error, match=param):
        BACKENDS[backend].resolve(spec)(**a)
    for k, v in before.items():
        assert torch.equal(a[k], v) or torch.equal(a[k].isnan(), v.isnan()) and torch.equal(a[k].nan_to_num(), v.nan_to_num()), \
            f"{k} was written before the error"


@cpu_and_reference
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(logits_indices_ptr=i64([1, 2, 3, 6])), ValueError, "logits_indices_ptr"),  # past the tokens
        (dict(logits_indices_ptr=i64([1, -1, 3, 5])), ValueError, "logits_indices_ptr"),
        (dict(expanded_idx_mapping_ptr=i64([2, 2, 3, 0])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(positions_ptr=i64([9, -10, 11, 12, 39, 40])), ValueError, "positions_ptr"),  # C25
        (dict(expanded_local_pos_ptr=i32([0, -1, 2, 0])), ValueError, "expanded_local_pos_ptr"),
        (dict(draft_sampled_ptr=poisoned(3)), ValueError, "draft_sampled_ptr"),
        (dict(num_logits=-1), ValueError, "num_logits"),
        (dict(BLOCK_SIZE=3), ValueError, "BLOCK_SIZE"),
        (dict(input_ids_ptr=i64([90, 2**40, 92, 93, 94, 95])), ValueError, "input_ids_ptr"),  # narrows to int32
        (dict(input_ids_ptr=torch.zeros(6)), TypeError, "input_ids_ptr"),
    ],
)
def test_invalid_gather(backend, change, error, param):
    a = gather_args()
    a.update(change)
    _refused(backend, contract.GATHER_DRAFT_SAMPLED, a, error, param)


@cpu_and_reference
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(num_sampled_ptr=i32([4, 0, 0])), ValueError, "num_sampled_ptr"),  # past the request's rows
        (dict(num_sampled_ptr=i32([1, -1, 0])), ValueError, "num_sampled_ptr"),
        (dict(cu_num_logits_ptr=i32([0, 3, 2, 8])), ValueError, "cu_num_logits_ptr"),
        (dict(cu_num_logits_ptr=i32([])), ValueError, "cu_num_logits_ptr"),
        (dict(flat_sampled_ptr=torch.zeros(7, dtype=I64)), ValueError, "flat_sampled_ptr"),
        (dict(sampled_stride=6), ValueError, "sampled_ptr"),  # row 2 lies past the buffer
        (dict(flat_sampled_ptr=torch.zeros(8, dtype=I32), sampled_ptr=i64([[1, 2**40, 3]] * 3), sampled_stride=3),
         ValueError, "sampled_ptr"),
    ],
)
def test_invalid_flatten(backend, change, error, param):
    a = flatten_args([3, 2, 3])
    a.update(change)
    _refused(backend, contract.FLATTEN_SAMPLED, a, error, param)


# -- K13 _compute_local_logits_stats_kernel --------------------------------------------------------------
INF = float("inf")
E1 = float(torch.tensor(math.exp(-1.0), dtype=torch.float32))  # exp32(-1) (C29)


def stats_args(draft_dtype: torch.dtype = torch.float32, block: int = 4) -> dict[str, Any]:
    # Request 0: slot 1, greedy, one draft (rows 0, 1); request 1: slot 0, temperature 2, two drafts
    # (rows 2, 3, 4). Bonus rows 1 and 4 are never computed. V_t = 6 is wider than V = V_d = 5.
    target = f32([[1, 3, 3, -INF, 2, 9], [7] * 6, [0, -1, -1, -1, -INF, 9], [1, -INF, -INF, -INF, 5, 9], [7] * 6])
    draft = f32([[[2, 2, -INF, -INF, 4], [0, 0, 0, 0, 0]], [[7] * 5, [7] * 5]]).to(draft_dtype)
    nb = -(-5 // block)
    out = {name: torch.full((5, nb), float("nan")) for name in ("target_local_max", "target_local_sumexp", "draft_local_max", "draft_local_sumexp")}
    out["target_local_argmax"] = torch.full((5, nb), POISON, dtype=I64)
    args: dict[str, Any] = {}
    for name in ("target_local_argmax", "target_local_max", "target_local_sumexp", "draft_local_max", "draft_local_sumexp"):
        args[f"{name}_ptr"], args[f"{name}_stride"] = out[name], nb
    args.update(
        target_logits_ptr=target, target_logits_stride=6,
        draft_logits_ptr=draft, draft_logits_stride_0=10, draft_logits_stride_1=5,
        expanded_idx_mapping_ptr=i64([1, 1, 0, 0, 0]), expanded_local_pos_ptr=i32([0, 1, 0, 1, 2]),
        temp_ptr=f32([2.0, 0.0]), vocab_size=5, num_logits=5, BLOCK_SIZE=block, HAS_DRAFT_LOGITS=True,
    )
    return args


def cells(t: torch.Tensor) -> list[list[float]]:
    return [[None if v != v else v for v in row] for row in t.tolist()]


N = None  # an untouched (NaN-poisoned) cell


@backends
@pytest.mark.parametrize("draft_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_golden_logits_stats(backend, draft_dtype):
    a = stats_args(draft_dtype)
    launch(backend, contract.LOGITS_STATS, a)
    # Greedy row 0: the first index of each tile's maximum and that maximum, nothing else.
    assert a["target_local_argmax_ptr"].tolist() == [[1, 4]] + [[POISON] * 2] * 4
    assert cells(a["target_local_max_ptr"]) == [[3, 2], [N, N], [0, -INF], [1, 5], [N, N]]
    # Random rows 2 and 3: sums of exp(x - tile max); an all -inf tile sums to 0.
    sumexp = float(torch.tensor(1 + 3 * E1, dtype=torch.float32))
    got = cells(a["target_local_sumexp_ptr"])
    if backend == "vllm":  # float32 exp and sums: the C29 departure, within 1e-5
        assert got[2][0] == pytest.approx(sumexp, rel=1e-5)
        got[2][0] = sumexp
    assert got == [[N, N], [N, N], [sumexp, 0], [1, 1], [N, N]]
    # The draft is divided by the temperature first: [1, 1, -inf, -inf | 2] and [0, 0, 0, 0 | 0].
    assert cells(a["draft_local_max_ptr"]) == [[N, N], [N, N], [1, 2], [0, 0], [N, N]]
    assert cells(a["draft_local_sumexp_ptr"]) == [[N, N], [N, N], [2, 1], [4, 1], [N, N]]


@backends
def test_golden_logits_stats_one_tile_and_negative_zero(backend):
    a = stats_args(block=8192)
    a["target_logits_ptr"][0, :5] = f32([-0.0, 0.0, -0.0, -INF, -1])
    launch(backend, contract.LOGITS_STATS, a)
    # -0.0 reads as +0.0 (C30): the maximum is +0.0 at the first zero.
    assert a["target_local_argmax_ptr"][0].tolist() == [0]
    assert str(float(a["target_local_max_ptr"][0, 0])) == ("0.0" if backend != "vllm" else "-0.0")  # C30 departure



@cpu_and_reference
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(temp_ptr=f32([-1.0, 0.0])), ValueError, "temp_ptr"),
        (dict(temp_ptr=f32([INF, 0.0])), ValueError, "temp_ptr"),
        (dict(expanded_idx_mapping_ptr=i64([1, 1, 2, 0, 0])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(BLOCK_SIZE=3), ValueError, "BLOCK_SIZE"),
        (dict(BLOCK_SIZE=1 << 17), ValueError, "BLOCK_SIZE"),
        (dict(vocab_size=2**31), ValueError, "vocab_size"),  # columns are int32
        (dict(HAS_DRAFT_LOGITS=False), ValueError, "HAS_DRAFT_LOGITS"),
        (dict(target_logits_stride=9), ValueError, "target_logits_ptr"),  # row 3 runs past the buffer
        (dict(draft_logits_stride_1=16), ValueError, "draft_logits_ptr"),  # step 1 runs past the buffer
        (dict(target_local_max_stride=3), ValueError, "target_local_max_ptr"),
        (dict(target_local_sumexp_ptr=torch.zeros(5, 2, dtype=torch.float64)), TypeError, "target_local_sumexp_ptr"),
        (dict(target_logits_ptr=f32([[1, 3, 3, float("nan"), 2, 9]] * 5)), ValueError, "target_logits_ptr"),  # C30
        (dict(target_logits_ptr=f32([[1, 3, 3, INF, 2, 9]] * 5)), ValueError, "target_logits_ptr"),
        (dict(temp_ptr=f32([1e-38, 0.0])), ValueError, "draft_logits_ptr"),  # 4 / 1e-38 overflows
    ],
)
def test_invalid_logits_stats(backend, change, error, param):
    a = stats_args()
    a.update(change)
    _refused(backend, contract.LOGITS_STATS, a, error, param)


def same_as_oracle(backend: str, spec: KernelSpec, a: dict[str, Any]) -> None:
    """Launches ``a`` on ``backend`` and on the oracle: every tensor the same bits afterwards."""
    want = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in a.items()}
    launch("reference", spec, want)
    launch(backend, spec, a)
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v.isnan(), want[k].isnan()) and torch.equal(v.nan_to_num(), want[k].nan_to_num()), k


@pytest.mark.parametrize("backend", ["triton", "cpu"])
@pytest.mark.parametrize("value, column, temp", [(1e-35, 1, 2.0), (1e-35, 4, 2.0), (3e30, 1, 2.0), (5.0, 1, 2.0**21),
                                                 (5.0, 1, 2.0**-21), (1e-38, 1, 4.0), (1e-35, 1, 0.7)],
                         ids=["tiny-whole-tile", "tiny-last-tile", "huge", "hot", "cold", "subnormal-quotient",
                              "tiny-any-temperature"])
def test_logits_stats_general_division(backend, value, column, temp):
    # A draft quotient outside div_by_lanes' range (a logit in (0, 2^-100) or above 2^100, or a
    # temperature outside [2^-20, 2^20]) sends its whole tile to the general division: the same
    # bits as the oracle's, in a whole tile and in a row's last. The port multiplies by the
    # reciprocal of a power-of-two temperature: the same bits too, a subnormal quotient included.
    a = stats_args()
    a["draft_logits_ptr"][0, 0, column] = value
    a["temp_ptr"][0] = temp
    same_as_oracle(backend, contract.LOGITS_STATS, a)


# -- K18 _insert_resampled_kernel -----------------------------------------------------------------------
def insert_args(counts: list[int], maxes: list[list[float]], temps: list[float]) -> dict[str, Any]:
    # Three requests of 2, 0 and 1 drafts in slots 2, 0, 1; two resample tiles each.
    sampled = torch.full((3, 3), POISON, dtype=I64)
    tokens = i64([[5, 1030], [7, 1100], [9, 2000]])
    return dict(
        sampled_ptr=sampled, sampled_stride=3, num_sampled_ptr=i32(counts),
        resampled_local_argmax_ptr=tokens, resampled_local_argmax_stride=2,
        resampled_local_max_ptr=f32(maxes), resampled_local_max_stride=2, resample_num_blocks=2,
        cu_num_logits_ptr=i32([0, 3, 4, 6]), expanded_idx_mapping_ptr=i64([2, 2, 2, 0, 1, 1]),
        temp_ptr=f32(temps), PADDED_RESAMPLE_NUM_BLOCKS=2,
    )


@backends
def test_golden_insert_random(backend):
    a = insert_args([1, 0, 1], [[1.0, 2.0], [3.0, 3.0], [float("nan"), -INF]], [1.0, 1.0, 1.0])
    launch(backend, contract.INSERT_RESAMPLED, a)
    # Tile 1 wins, the first of equal maxima wins, NaN never wins (then tile 1's -inf loses to nothing: tile 0).
    assert a["sampled_ptr"].tolist() == [[POISON, 1030, POISON], [7, POISON, POISON], [POISON, 9, POISON]]
    assert a["num_sampled_ptr"].tolist() == [2, 1, 2]


@backends
def test_golden_insert_greedy(backend):
    # Greedy requests insert only at their bonus row: request 0 was rejected at draft 1 (the argmax
    # is already there), request 2 accepted its one draft (bonus row 5).
    a = insert_args([1, 0, 1], [[1.0, 2.0], [3.0, 3.0], [4.0, 5.0]], [0.0, 0.0, 0.0])
    launch(backend, contract.INSERT_RESAMPLED, a)
    assert a["sampled_ptr"].tolist() == [[POISON] * 3, [7, POISON, POISON], [POISON, 2000, POISON]]
    assert a["num_sampled_ptr"].tolist() == [2, 1, 2]



@cpu_and_reference
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(num_sampled_ptr=i32([3, 0, 0])), ValueError, "num_sampled_ptr"),  # past request 0's two drafts
        (dict(num_sampled_ptr=i32([0, -1, 0])), ValueError, "num_sampled_ptr"),
        (dict(PADDED_RESAMPLE_NUM_BLOCKS=1), ValueError, "PADDED_RESAMPLE_NUM_BLOCKS"),
        (dict(resample_num_blocks=0), ValueError, "resample_num_blocks"),
        (dict(resample_num_blocks=3, PADDED_RESAMPLE_NUM_BLOCKS=4), ValueError, "resampled_local_max_ptr"),
        (dict(sampled_stride=4), ValueError, "sampled_ptr"),
        (dict(temp_ptr=f32([1.0, -1.0, 1.0])), ValueError, "temp_ptr"),
        (dict(cu_num_logits_ptr=i32([0, 3, 2, 6])), ValueError, "cu_num_logits_ptr"),
    ],
)
def test_invalid_insert(backend, change, error, param):
    a = insert_args([1, 0, 1], [[1.0, 2.0], [3.0, 3.0], [4.0, 5.0]], [1.0, 1.0, 1.0])
    a.update(change)
    _refused(backend, contract.INSERT_RESAMPLED, a, error, param)


# -- K14 _compute_cumulative_log_p_kernel ------------------------------------------------------------------
def f32v(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def cumulative_args(draft: bool) -> dict[str, Any]:
    # Request 0: slot 1, random, drafts [0, -1, 1] (rows 0..3); request 1: slot 0, greedy (rows 4, 5).
    # Target rows are [0, 0] (log p = -log 2); draft rows [1, 0] at temperature 2 (log q(0) = 0.5 - log(e^0.5 + 1)).
    target = f32([[0.0, 0.0]] * 6)
    stats = {f"{side}_local_{stat}": f32([[v]] * 6) for side in ("target", "draft")
             for stat, v in (("max", 0.0 if side == "target" else 0.5), ("sumexp", 2.0 if side == "target" else 1 + E_HALF))}
    args: dict[str, Any] = dict(
        cumulative_log_p_ptr=torch.full((6,), float("nan")), target_logits_ptr=target, target_logits_stride=2,
        draft_sampled_ptr=i32([7, 0, -1, 1, 7, 1]),
        draft_logits_ptr=f32([[[9.0, 9.0]] * 3, [[1.0, 0.0]] * 3]) if draft else None,
        draft_logits_stride_0=6 if draft else 0, draft_logits_stride_1=2 if draft else 0,
        cu_num_logits_ptr=i32([0, 4, 6]), idx_mapping_ptr=i64([1, 0]), temp_ptr=f32([0.0, 2.0]),
        vocab_num_blocks=1, PADDED_VOCAB_NUM_BLOCKS=1, HAS_DRAFT_LOGITS=draft)
    for name, t in stats.items():
        args[f"{name}_ptr"], args[f"{name}_stride"] = t, 1
    return args


E_HALF = f32v(math.exp(-0.5))


@backends
@pytest.mark.parametrize("draft", [False, True], ids=["one-hot", "draft-logits"])
def test_golden_cumulative_log_p(backend, draft):
    a = cumulative_args(draft)
    launch(backend, contract.CUMULATIVE_LOG_P, a)
    lp = f32v(0.0 - f32v(math.log(2.0)))
    if draft:  # log q(0) = 0.5 - log(1 + exp32(-0.5)); q(1) = ... for token 1: 0 - same
        lse_d = f32v(0.5 + math.log(1 + E_HALF))
        lq0, lq1 = f32v(0.5 - lse_d), f32v(0.0 - lse_d)
    else:
        lq0 = lq1 = 0.0
    step0 = min(f32v(0.0 + f32v(lp - lq0)), 0.0)
    step2 = min(f32v(step0 + f32v(lp - lq1)), 0.0)
    # The placeholder (step 1) carries step 0's value; the greedy request is skipped.
    got = cells(a["cumulative_log_p_ptr"][None])[0]
    if backend == "vllm":  # float32 exp/log: the C29 departure
        assert got[:3] == pytest.approx([step0, step0, step2], rel=1e-5, abs=1e-6)
        got[:3] = [step0, step0, step2]
    assert got == [step0, step0, step2, N, N, N]



@cpu_and_reference
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(target_local_max_ptr=f32([[-INF]] * 6)), ValueError, "target_local_max_ptr"),
        (dict(target_local_sumexp_ptr=f32([[-1.0]] * 6)), ValueError, "target_local_sumexp_ptr"),
        (dict(draft_sampled_ptr=i32([7, 0, -1, 2, 7, 1])), ValueError, "draft_logits_ptr"),  # token 2 of step 2 lies past it
        (dict(target_logits_ptr=f32([[0.0, 0.0]] * 2)), ValueError, "target_logits_ptr"),  # no row 2
        (dict(cu_num_logits_ptr=i32([0, 4, 4])), ValueError, "cu_num_logits_ptr"),  # a request without its bonus row
        (dict(PADDED_VOCAB_NUM_BLOCKS=3), ValueError, "PADDED_VOCAB_NUM_BLOCKS"),
        (dict(idx_mapping_ptr=i64([1, 2])), ValueError, "idx_mapping_ptr"),
        (dict(cumulative_log_p_ptr=torch.zeros(5)), ValueError, "cumulative_log_p_ptr"),
        (dict(draft_logits_ptr=None), ValueError, "HAS_DRAFT_LOGITS"),
    ],
)
def test_invalid_cumulative_log_p(backend, change, error, param):
    a = cumulative_args(True)
    a.update(change)
    _refused(backend, contract.CUMULATIVE_LOG_P, a, error, param)


# -- K15 _compute_local_residual_mass_kernel -----------------------------------------------------------
def residual_args(block: int) -> dict[str, Any]:
    # Request 0: slot 1 (temperature 2), drafts [0, 1, -1] on rows 0..3; request 1: slot 0, greedy,
    # rows 4..6. Only row 1 has a residual mass: row 0 is a first step, row 2's draft is a
    # placeholder, row 3 a bonus row, request 1 greedy. Row 1's target is [1, 0], its draft [0, 0].
    nb = 2 // block
    target = f32([[0.0, 0.0], [1.0, 0.0]] + [[0.0, 0.0]] * 5)
    tiles = {"max": [1.0, 0.0] if block == 1 else [1.0], "sumexp": [1.0, 1.0] if block == 1 else [1 + E1]}
    flat = {"max": [0.0] * nb, "sumexp": [1.0, 1.0] if block == 1 else [2.0]}
    args: dict[str, Any] = dict(
        local_residual_mass_ptr=torch.full((7, nb), float("nan")), local_residual_mass_stride=nb,
        cumulative_log_p_ptr=f32([0.0] * 7), target_logits_ptr=target, target_logits_stride=2,
        draft_logits_ptr=torch.zeros((2, 3, 2)), draft_logits_stride_0=6, draft_logits_stride_1=2,
        draft_sampled_ptr=i32([9, 0, 1, -1, 9, 0, 1]), expanded_idx_mapping_ptr=i64([1, 1, 1, 1, 0, 0, 0]),
        expanded_local_pos_ptr=i32([0, 1, 2, 3, 0, 1, 2]), temp_ptr=f32([0.0, 2.0]), vocab_size=2, num_logits=7,
        vocab_num_blocks=nb, BLOCK_SIZE=block, PADDED_VOCAB_NUM_BLOCKS=nb)
    for stat in ("max", "sumexp"):
        args[f"target_local_{stat}_ptr"] = f32([flat[stat], tiles[stat]] + [flat[stat]] * 5)
        args[f"draft_local_{stat}_ptr"] = f32([flat[stat]] * 7)
        args[f"target_local_{stat}_stride"] = args[f"draft_local_{stat}_stride"] = nb
    return args


@backends
@pytest.mark.parametrize("block", [2, 1], ids=["one-tile", "two-tiles"])
def test_golden_local_residual_mass(backend, block):
    a = residual_args(block)
    launch(backend, contract.LOCAL_RESIDUAL_MASS, a)
    # p(0) = exp32(1 - LSE), LSE = 1 + log(T) (T: the one float32 tile sum, or the float64 sum of
    # two tiles); q = 1/2 each; p_prev = exp(0) = 1: the mass is p(0) - 1/2 (exact), token 1's term
    # is below 0.
    lse = f32v(1.0 + math.log(f32v(1.0 + E1) if block == 2 else 1.0 + E1))
    mass = f32v(f32v(math.exp(f32v(1.0 - lse))) - 0.5)
    got = cells(a["local_residual_mass_ptr"])
    if backend == "vllm":  # float32 exp, log and sums: the C29 departure
        assert got[1][0] == pytest.approx(mass, rel=1e-5)
        got[1][0] = mass
    assert got == [[N] * (2 // block), [mass] + [0.0] * (2 // block - 1)] + [[N] * (2 // block)] * 5



@pytest.mark.parametrize("backend", ["triton", "cpu"])
@pytest.mark.parametrize("value, temp", [(1e-35, 2.0), (0.0, 2.0**21), (0.0, 2.0**-21)], ids=["tiny", "hot", "cold"])
@pytest.mark.parametrize("block", [2, 1], ids=["one-tile", "two-tiles"])
def test_local_residual_mass_general_division(backend, value, temp, block):
    # As for K13: a draft quotient div_by_lanes cannot give sends the tile to the general division.
    a = residual_args(block)
    a["draft_logits_ptr"][1, 1, 0] = value
    a["temp_ptr"][1] = temp
    same_as_oracle(backend, contract.LOCAL_RESIDUAL_MASS, a)


@cpu_and_reference
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(vocab_num_blocks=2, PADDED_VOCAB_NUM_BLOCKS=2), ValueError, "vocab_num_blocks"),  # not cdiv(2, 2)
        (dict(cumulative_log_p_ptr=f32([0.5] * 7)), ValueError, "cumulative_log_p_ptr"),  # a ratio above 1
        (dict(cumulative_log_p_ptr=f32([float("nan")] * 7)), ValueError, "cumulative_log_p_ptr"),
        (dict(target_local_sumexp_ptr=f32([[0.5]] * 7)), ValueError, "target_local_max_ptr"),  # LSE below the logit
        (dict(draft_logits_ptr=torch.full((2, 3, 2), 3.0)), ValueError, "draft_local_max_ptr"),  # not the draft's stats
        (dict(temp_ptr=f32([0.0, -1.0])), ValueError, "temp_ptr"),
        (dict(local_residual_mass_ptr=torch.zeros((1, 1))), ValueError, "local_residual_mass_ptr"),
        (dict(draft_logits_ptr=torch.zeros((1, 3, 2))), ValueError, "draft_logits_ptr"),  # slot 1 lies past it
        (dict(BLOCK_SIZE=1 << 17), ValueError, "BLOCK_SIZE"),
        (dict(vocab_size=2**31), ValueError, "vocab_size"),  # columns are int32
    ],
)
def test_invalid_local_residual_mass(backend, change, error, param):
    a = residual_args(2)
    a.update(change)
    _refused(backend, contract.LOCAL_RESIDUAL_MASS, a, error, param)


# -- K16 _rejection_kernel -------------------------------------------------------------------------------
def rejection_args(target: list[list[float]], drafts: list[list[int]], temps: list[float], mode: str = "standard",
                   window: int = 0) -> dict[str, Any]:
    """Requests in slots 1, 0, 2, ... (permuted), with one-hot drafts; target rows as given (one
    per draft plus a bonus row each, vocabulary 4, one tile); K13-K14 inputs from the oracle."""
    from reference import mrv2 as oracle

    r = len(drafts)
    cu = [0]
    for d in drafts:
        cu.append(cu[-1] + len(d) + 1)
    nl, slots = cu[-1], [1, 0, 2, 3][:r]
    tokens = [t for d in drafts for t in [7, *d]]  # row i + 1 holds draft i; a request's first row holds its last token
    row_slot = [slots[q] for q in range(r) for _ in range(len(drafts[q]) + 1)]
    row_step = [i for d in drafts for i in range(len(d) + 1)]
    temp = f32([temps[slots.index(s)] if s in slots else 1.0 for s in range(max(slots) + 1)])
    stats: dict[str, Any] = {}
    for name in ("target_local_argmax", "target_local_max", "target_local_sumexp", "draft_local_max", "draft_local_sumexp"):
        stats[f"{name}_ptr"] = torch.zeros((nl, 1), dtype=I64 if "argmax" in name else torch.float32)
        stats[f"{name}_stride"] = 1
    logits = f32(target)
    oracle._compute_local_logits_stats_kernel(**stats, target_logits_ptr=logits, target_logits_stride=4, draft_logits_ptr=None,
                                              draft_logits_stride_0=0, draft_logits_stride_1=0,
                                              expanded_idx_mapping_ptr=i64(row_slot), expanded_local_pos_ptr=i32(row_step),
                                              temp_ptr=temp, vocab_size=4, num_logits=nl, BLOCK_SIZE=4, HAS_DRAFT_LOGITS=False)
    args: dict[str, Any] = dict(
        sampled_ptr=torch.full((r, 4), POISON, dtype=I64), sampled_stride=4, rejected_steps_ptr=poisoned(r),
        target_rejected_logsumexp_ptr=torch.full((r,), float("nan")), draft_rejected_logsumexp_ptr=torch.full((r,), float("nan")),
        target_logits_ptr=logits, target_logits_stride=4, **stats, draft_sampled_ptr=i32(tokens), draft_logits_ptr=None,
        draft_logits_stride_0=0, draft_logits_stride_1=0, cu_num_logits_ptr=i32(cu), idx_mapping_ptr=i64(slots),
        temp_ptr=temp, seed_ptr=i64([11, 22, 33, 44][: len(temp)]), pos_ptr=i64(list(range(100, 100 + nl))),
        synthetic_conditional_rates_ptr=f32([1.0, 0.0, 1.0]) if mode == "synthetic" else None,
        cumulative_log_p_ptr=None, local_residual_mass_ptr=None, local_residual_mass_stride=0,
        fly_entropy_ptr=f32([0.9] * nl) if window else None, fly_entropy_threshold=0.5,
        vocab_num_blocks=1, PADDED_VOCAB_NUM_BLOCKS=1, HAS_DRAFT_LOGITS=False, SYNTHETIC_MODE=mode == "synthetic",
        USE_BLOCK_VERIFICATION=mode == "block", FLY_WINDOW_SIZE=window)
    for name in ("draft_local_max_ptr", "draft_local_sumexp_ptr"):
        args[name] = args[name].zero_()
    if mode == "block":
        cum = dict(cumulative_log_p_ptr=torch.zeros(nl), cu_num_logits_ptr=args["cu_num_logits_ptr"],
                   idx_mapping_ptr=args["idx_mapping_ptr"], temp_ptr=temp, vocab_num_blocks=1, PADDED_VOCAB_NUM_BLOCKS=1,
                   HAS_DRAFT_LOGITS=False, draft_sampled_ptr=args["draft_sampled_ptr"], target_logits_ptr=logits,
                   target_logits_stride=4, draft_logits_ptr=None, draft_logits_stride_0=0, draft_logits_stride_1=0)
        cum.update({k: v for k, v in stats.items() if "argmax" not in k})
        oracle._compute_cumulative_log_p_kernel(**cum)
        args["cumulative_log_p_ptr"] = cum["cumulative_log_p_ptr"]
    return args


SURE, NEVER = [0.0, -INF, -INF, -INF], [-INF, 0.0, 0.0, 0.0]  # token 0 holds all, or none, of the mass
P = POISON


def lse(row: list[float]) -> float:
    return f32v(max(row) + math.log(sum(math.exp(x - max(row)) for x in row)))


@backends
def test_golden_rejection_greedy(backend):
    # Argmaxes 2, 1, 3 at the draft rows: drafts [2, 0] accept 2 and put the argmax 1 in place of
    # 0; drafts [3] accept all; the request without drafts records nothing.
    rows = [[0, 1, 9, 2], [0, 5, 1, 2], [0, 0, 0, 0], [1, 2, 3, 4], [0, 0, 0, 0], [0, 0, 0, 0]]
    a = rejection_args(rows, [[2, 0], [3], []], [0.0, 0.0, 0.0])
    launch(backend, contract.REJECTION, a)
    assert a["sampled_ptr"].tolist() == [[2, 1, P, P], [3, P, P, P], [P, P, P, P]]
    assert a["rejected_steps_ptr"].tolist() == [1, 1, 0]
    assert a["target_rejected_logsumexp_ptr"].tolist() == [0.0] * 3  # greedy requests need no log-sum-exp
    assert a["draft_rejected_logsumexp_ptr"].tolist() == [0.0] * 3


@backends
def test_golden_rejection_random(backend):
    # One-hot drafts: p(d) = 1 is always accepted (log 1 = 0 > log u), p(d) = 0 never. Request 0
    # stops at its second draft and keeps that step's log-sum-exps; request 1 takes all of them.
    a = rejection_args([SURE, NEVER, SURE, [0] * 4, SURE, SURE, [0] * 4], [[0, 0, 0], [0, 0]], [1.0, 0.5])
    launch(backend, contract.REJECTION, a)
    assert a["sampled_ptr"].tolist() == [[0, 0, P, P], [0, 0, P, P]]
    assert a["rejected_steps_ptr"].tolist() == [1, 2]
    got = a["target_rejected_logsumexp_ptr"].tolist()
    if backend == "vllm":  # C29: float32 exp, log and sums
        assert got == pytest.approx([lse(NEVER), 0.0], abs=1e-6)
    else:
        assert got == [f32v(lse(NEVER)), 0.0]
    assert a["draft_rejected_logsumexp_ptr"].tolist() == [0.0, 0.0]


@backends
def test_golden_rejection_synthetic(backend):
    # Rates [1, 0, 1]: u < 1 always holds, u < 0 never: greedy and random requests alike accept one
    # draft, whatever the logits say (the greedy request writes its argmax at the rejection).
    rows = [NEVER, NEVER, NEVER, [0] * 4, NEVER, NEVER, NEVER, [0] * 4]
    a = rejection_args(rows, [[0, 0, 0], [0, 0, 0]], [1.0, 0.0], mode="synthetic")
    launch(backend, contract.REJECTION, a)
    assert a["rejected_steps_ptr"].tolist() == [1, 1]
    assert a["sampled_ptr"].tolist() == [[0, 0, P, P], [0, 1, P, P]]


@backends
def test_golden_rejection_block_verification(backend):
    # One-hot drafts of probability 1 keep the joint ratio at 1: every step is accepted. Request 1's
    # first draft has probability 0: every ratio after it is 0 and no step is accepted (u > 0), so
    # the rejected row is its first; it still writes each verified draft.
    a = rejection_args([SURE, SURE, [0] * 4, NEVER, SURE, [0] * 4], [[0, 0], [0, 0]], [1.0, 1.0], mode="block")
    launch(backend, contract.REJECTION, a)
    assert a["rejected_steps_ptr"].tolist() == [2, 0]
    assert a["sampled_ptr"].tolist() == [[0, 0, P, P], [0, 0, P, P]]
    got = a["target_rejected_logsumexp_ptr"].tolist()
    if backend == "vllm":
        assert got == pytest.approx([0.0, lse(NEVER)], abs=1e-6)
    else:
        assert got == [0.0, f32v(lse(NEVER))]


@backends
def test_golden_rejection_fly(backend):
    # FLy, window 1, greedy: draft 0 misses the argmax but may defer (its logit is finite, the
    # entropy 0.9 >= 0.5, a step remains); draft 1 hits and confirms the window: 2 accepted. Draft 2
    # misses with no room left: its argmax (3) replaces it.
    rows = [[0, 9, 0, 0], [0, 0, 9, 0], [0, 0, 0, 9], [0] * 4]
    a = rejection_args(rows, [[0, 2, 0]], [0.0], window=1)
    launch(backend, contract.REJECTION, a)
    assert a["rejected_steps_ptr"].tolist() == [2]
    assert a["sampled_ptr"].tolist() == [[0, 2, 3, P]]



@cpu_and_reference
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(FLY_WINDOW_SIZE=-1), ValueError, "FLY_WINDOW_SIZE"),
        (dict(sampled_stride=1), ValueError, "sampled_stride"),  # narrower than a request's drafts
        (dict(sampled_ptr=torch.zeros((1, 4), dtype=I64)), ValueError, "sampled_ptr"),  # request 1's row lies past it
        (dict(seed_ptr=i64([1])), ValueError, "idx_mapping_ptr"),  # slot 1 has no seed
        (dict(seed_ptr=i32([1, 2])), TypeError, "seed_ptr"),
        (dict(pos_ptr=i64([0] * 3)), ValueError, "pos_ptr"),
        (dict(draft_sampled_ptr=i32([7, 0, 0, 30, 7, 0, 0])), ValueError, "target_logits_ptr"),  # row 2, token 30: past it
        (dict(target_local_sumexp_ptr=f32([[-1.0]] * 7)), ValueError, "target_local_sumexp_ptr"),
        (dict(fly_entropy_ptr=f32([0.5] * 7)), ValueError, "FLY_WINDOW_SIZE"),  # FLy data without a window
        (dict(rejected_steps_ptr=poisoned(1)), ValueError, "rejected_steps_ptr"),
        (dict(fly_entropy_threshold="0.3"), TypeError, "fly_entropy_threshold"),
        (dict(cu_num_logits_ptr=i32([0, 4, 4])), ValueError, "cu_num_logits_ptr"),
    ],
)
def test_invalid_rejection(backend, change, error, param):
    a = rejection_args([SURE, NEVER, SURE, [0] * 4, SURE, SURE, [0] * 4], [[0, 0, 0], [0, 0]], [1.0, 0.5])
    a.update(change)
    _refused(backend, contract.REJECTION, a, error, param)


@cpu_and_reference
@pytest.mark.parametrize("mode, change, param", [
    ("block", dict(cumulative_log_p_ptr=f32([0.5] * 6)), "cumulative_log_p_ptr"),  # a joint ratio above 1
    ("block", dict(SYNTHETIC_MODE=True, synthetic_conditional_rates_ptr=f32([1.0] * 3)), "USE_BLOCK_VERIFICATION"),
    ("synthetic", dict(synthetic_conditional_rates_ptr=f32([1.0])), "synthetic_conditional_rates_ptr"),  # 2 drafts
])
def test_invalid_rejection_modes(backend, mode, change, param):
    a = rejection_args([SURE, SURE, [0] * 4, NEVER, SURE, [0] * 4], [[0, 0], [0, 0]], [1.0, 1.0], mode=mode)
    a.update(change)
    _refused(backend, contract.REJECTION, a, ValueError, param)


# -- K17 _resample_kernel --------------------------------------------------------------------------------
def resample_args(target: list[list[float]], drafts: list[list[int]], steps: list[int], temps: list[float],
                  fp64: bool = False, draft: list[list[list[float]]] | None = None, block: int = 2) -> dict[str, Any]:
    """Requests in slots 1, 0, 2 with their drafts, resampled at ``steps``; vocabulary 4 in tiles of
    ``block``; K16's log-sum-exps fixed at 2 (target) and 1.5 (draft)."""
    r = len(drafts)
    cu = [0]
    for d in drafts:
        cu.append(cu[-1] + len(d) + 1)
    slots = [1, 0, 2][:r]
    nb = 4 // block
    dl = None if draft is None else f32(draft)
    return dict(
        resampled_local_argmax_ptr=torch.full((r, nb), POISON, dtype=I64), resampled_local_argmax_stride=nb,
        resampled_local_max_ptr=torch.full((r, nb), float("nan"), dtype=torch.float64 if fp64 else torch.float32),
        resampled_local_max_stride=nb, target_logits_ptr=f32(target), target_logits_stride=4,
        target_rejected_logsumexp_ptr=f32([2.0] * r), draft_logits_ptr=dl,
        draft_logits_stride_0=0 if dl is None else dl.stride(0), draft_logits_stride_1=0 if dl is None else dl.stride(1),
        draft_rejected_logsumexp_ptr=f32([1.5] * r), rejected_step_ptr=i32(steps), cu_num_logits_ptr=i32(cu),
        expanded_idx_mapping_ptr=i64([slots[q] for q in range(r) for _ in range(len(drafts[q]) + 1)]),
        draft_sampled_ptr=i32([t for d in drafts for t in [7, *d]]),
        temp_ptr=f32([temps[slots.index(s)] if s in slots else 1.0 for s in range(3)]), seed_ptr=i64([5, 6, 7]),
        pos_ptr=i64([40 + i for i in range(cu[-1])]), cumulative_log_p_ptr=None, contexts_ptr=None, contexts_stride=0,
        watermarking_ptr=None, watermarking_skip_mask_ptr=None, watermark_key_0=0, watermark_key_1=0, vocab_size=4,
        BLOCK_SIZE=block, HAS_DRAFT_LOGITS=dl is not None, USE_FP64=fp64, USE_BLOCK_VERIFICATION=False, CONTEXT_WIDTH=1,
        WATERMARK=False, DEDUPLICATE_CONTEXTS=False)


def noise32(seed: int, pos: int, col: int) -> float:
    from reference import gumbel

    return float(gumbel.gumbel32(gumbel.murmur3_uniform32(i64([seed]), i64([pos]), i64([col])))[0])


@backends
@pytest.mark.parametrize("fp64", [False, True], ids=["float32", "float64"])
def test_golden_resample_greedy(backend, fp64):
    # Greedy requests: request 0 accepted both drafts (its bonus row 2 is resampled: the plain argmax
    # per tile, no noise); request 1 was rejected at a draft (K16 stored the argmax): untouched.
    rows = [[0] * 4, [0] * 4, [3, 5, 5, -INF], [0] * 4, [0] * 4]
    a = resample_args(rows, [[1, 1], [1]], [2, 0], [0.0, 0.0], fp64=fp64)
    launch(backend, contract.RESAMPLE, a)
    assert a["resampled_local_argmax_ptr"].tolist() == [[1, 2], [P, P]]  # ties: the first index
    assert cells(a["resampled_local_max_ptr"]) == [[5.0, 5.0], [N, N]]
    assert a["resampled_local_max_ptr"].dtype == (torch.float64 if fp64 else torch.float32)


@backends
def test_golden_resample_one_hot(backend):
    # Random requests with one-hot drafts. Token 0 holds (almost) all the mass: request 0 rejected
    # draft 0 and must resample from the rest; request 1's rejected draft is a placeholder, so its
    # residual is the target itself and token 0 wins.
    heavy = [60.0, 0.0, 0.0, 0.0]
    a = resample_args([[0] * 4, heavy, [0] * 4, heavy, [0] * 4], [[5, 0], [-1]], [1, 0], [1.0, 1.0])
    launch(backend, contract.RESAMPLE, a)
    tokens, scores = a["resampled_local_argmax_ptr"].tolist(), a["resampled_local_max_ptr"].tolist()
    # Request 0 (slot 1, seed 6, row 1 at position 41): tile 0 is token 1 alone, tile 1 the better of 2, 3.
    want0 = [noise32(6, 41, c) for c in range(4)]
    best = 2 if want0[2] >= want0[3] else 3
    assert tokens[0] == [1, best]
    assert scores[0] == [f32v(0.0 + want0[1]), f32v(0.0 + want0[best])]
    assert tokens[1][0] == 0 and scores[1][0] == f32v(60.0 + noise32(5, 43, 0))


@backends
def test_golden_resample_draft_logits(backend):
    # Target [0, 0, 1, 0] against a uniform draft (log p = x - 2, log q = -1.5): only token 2 has
    # p > q, so tile 0 is all -inf (index 0) and tile 1 holds token 2's residual plus its noise.
    a = resample_args([[0] * 4, [0, 0, 1, 0], [0] * 4], [[5, 3]], [1], [1.0], draft=[[[0.0] * 4] * 2] * 2)
    if (why := BACKENDS[backend].unsupported(contract.RESAMPLE, a)) is not None:
        pytest.skip(f"{backend} declares it does not support this case: {why}")
    launch(backend, contract.RESAMPLE, a)
    ratio = f32v(math.exp(f32v(-1.5 - f32v(1.0 - 2.0))))
    residual = f32v(f32v(1.0 - 2.0) + f32v(math.log1p(-ratio)))
    want = f32v(residual + noise32(6, 41, 2))
    assert a["resampled_local_argmax_ptr"].tolist() == [[0, 2]]
    got = a["resampled_local_max_ptr"].tolist()[0]
    assert got[0] == -INF
    if backend == "vllm":  # float32 exp, log1p and noise: the C29 departure
        assert got[1] == pytest.approx(want, rel=1e-5)
    else:
        assert got[1] == want



def wide_resample_args(style: str, block: bool) -> dict[str, Any]:
    """16 requests of one draft over a vocabulary of 8192 in tiles of 256, resampled at the draft
    (a residual with draft logits) or at the bonus row, at temperatures 1, 0.7 and 0 (a greedy bonus
    row: no noise). Logits: N(0, 3) with the draft N(0, 1) away ("plain"), all equal ("flat"), or a
    draft equal to the target in the first requests (every ratio 1: tiles of -inf scores)."""
    g = torch.Generator().manual_seed(12)
    r, v, tile = 16, 8192, 256
    target = torch.randn((2 * r, v), generator=g) * 3
    if style == "flat":
        target[:] = 0.25
    draft = (target[0::2] + torch.randn((r, v), generator=g)).reshape(r, 1, v)
    if style == "equal":
        draft[:4, 0] = target[0:8:2]
    temps = [1.0, 0.7, 1.0, 0.0, 1.0, 1.0, 0.7, 1.0] * 2
    steps = [0, 0, 0, 1, 1, 0, 0, 0] * 2  # requests 3 and 11 are greedy: only their bonus rows write
    rows = [2 * q + steps[q] for q in range(r)]
    lse_t = f32([float(torch.logsumexp(target[row], 0)) for row in rows])
    lse_d = f32([float(torch.logsumexp(draft[q, 0] / max(temps[q], 1e-3), 0)) for q in range(r)])
    return dict(
        resampled_local_argmax_ptr=torch.full((r, v // tile), POISON, dtype=I64), resampled_local_argmax_stride=v // tile,
        resampled_local_max_ptr=torch.full((r, v // tile), float("nan")), resampled_local_max_stride=v // tile,
        target_logits_ptr=target, target_logits_stride=v, target_rejected_logsumexp_ptr=lse_t, draft_logits_ptr=draft,
        draft_logits_stride_0=v, draft_logits_stride_1=v, draft_rejected_logsumexp_ptr=lse_d,
        rejected_step_ptr=i32(steps), cu_num_logits_ptr=i32(list(range(0, 2 * r + 1, 2))),
        expanded_idx_mapping_ptr=i64([q for q in range(r) for _ in range(2)]),
        draft_sampled_ptr=i32([t for q in range(r) for t in (7, 100 + q)]), temp_ptr=f32(temps),
        seed_ptr=i64([11 * q - 40 for q in range(r)]), pos_ptr=i64(list(range(1000, 1000 + 2 * r))),
        cumulative_log_p_ptr=f32([-0.5 * (q % 3) for q in range(2 * r)]) if block else None, contexts_ptr=None,
        contexts_stride=0, watermarking_ptr=None, watermarking_skip_mask_ptr=None, watermark_key_0=0, watermark_key_1=0,
        vocab_size=v, BLOCK_SIZE=tile, HAS_DRAFT_LOGITS=True, USE_FP64=False, USE_BLOCK_VERIFICATION=block,
        CONTEXT_WIDTH=1, WATERMARK=False, DEDUPLICATE_CONTEXTS=False)


@pytest.mark.parametrize("backend", [TRITON_NIGHTLY, "cpu"])
@pytest.mark.parametrize("style, block", [("plain", False), ("plain", True), ("flat", False), ("equal", False)])
def test_resample_wide_tiles(backend, style, block):
    # Tiles of many vectors, as the call site's 8192 columns are: the port scores only the vectors
    # whose bounds (csrc/vmath.h) exceed the best score so far. 512 tiles a case; a
    # bound low by 0.1 loses maxima here (tests/test_gumbel.py checks the bounds themselves on every
    # input). Equal draft and target make whole tiles -inf (index 0).
    a = wide_resample_args(style, block)
    same_as_oracle(backend, contract.RESAMPLE, a)
    if style == "equal":
        assert a["resampled_local_max_ptr"][[0, 2]].isneginf().all()  # request 1's draft is divided by 0.7
        assert (a["resampled_local_argmax_ptr"][[0, 2]] == torch.arange(0, 8192, 256)).all()


@cpu_and_reference
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(WATERMARK=True), ValueError, "WATERMARK"),
        (dict(rejected_step_ptr=i32([3, 0])), ValueError, "rejected_step_ptr"),  # request 0 has 2 drafts
        (dict(USE_FP64=True), ValueError, "USE_FP64"),  # the scores are float32
        (dict(seed_ptr=i64([1])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(resampled_local_max_ptr=torch.zeros((1, 2))), ValueError, "resampled_local_max_ptr"),
        (dict(target_rejected_logsumexp_ptr=f32([float("nan")] * 2)), ValueError, "target_rejected_logsumexp_ptr"),
        (dict(BLOCK_SIZE=3), ValueError, "BLOCK_SIZE"),
        (dict(vocab_size=2**31), ValueError, "vocab_size"),  # columns are int32
        (dict(temp_ptr=f32([1.0, float("inf")])), ValueError, "temp_ptr"),
        (dict(target_logits_ptr=f32([[0.0, float("nan"), 0, 0]] * 5)), ValueError, "target_logits_ptr"),
    ],
)
def test_invalid_resample(backend, change, error, param):
    a = resample_args([[0] * 4] * 5, [[5, 0], [1]], [1, 0], [1.0, 1.0], draft=[[[0.0] * 4] * 2] * 2)
    a.update(change)
    _refused(backend, contract.RESAMPLE, a, error, param)


# -- the host composition rejection_sample -------------------------------------------------------------
@st.composite
def mrv2_batches(draw: st.DrawFn) -> dict[str, Any]:
    """rejection_sample's inputs from a scene: drafts often the target's argmax or its draws."""
    from conformance.strategies import generator, seeds
    from conformance.strategies.mrv2 import likely_drafts, scenes

    sc = draw(scenes())
    assume(sc.lay.requests > 0)  # vLLM asserts unit-stride logits; an empty (0, 1) tensor may have another
    g = generator(draw(seeds))
    lay = sc.lay
    mode = draw(st.sampled_from(["standard", "synthetic", "block"]))
    return dict(
        target_logits=sc.target, draft_logits=sc.draft, draft_sampled=likely_drafts(draw, g, sc).to(I32),
        cu_num_logits=i32(lay.cu), pos=torch.randint(0, 2**40, (lay.num_logits,), generator=g),
        idx_mapping=i64(lay.slots), expanded_idx_mapping=i64(lay.row_slot), expanded_local_pos=i32(lay.row_step),
        temperature=sc.temp, seed=sc.seed, num_speculative_steps=lay.k,
        synthetic_conditional_rates=torch.rand(lay.k, generator=g) if mode == "synthetic" else None,
        use_fp64=draw(st.booleans()), use_block_verification=mode == "block")


def accepted(sampled: torch.Tensor, num_sampled: torch.Tensor) -> list[list[int]]:
    """Each request's tokens: the accepted drafts and the resampled or bonus token."""
    return [sampled[r, : int(n)].tolist() for r, n in enumerate(num_sampled)]


def subset(batch: dict[str, Any], reqs: list[int]) -> dict[str, Any]:
    """The batch of requests ``reqs`` only, in that order (slots, seeds and draft logits unchanged)."""
    cu = batch["cu_num_logits"].tolist()
    rows = torch.tensor([i for r in reqs for i in range(cu[r], cu[r + 1])], dtype=I64)
    new_cu = [0]
    for r in reqs:
        new_cu.append(new_cu[-1] + cu[r + 1] - cu[r])
    out = dict(batch)
    out.update(target_logits=batch["target_logits"][rows], draft_sampled=batch["draft_sampled"][rows], cu_num_logits=i32(new_cu),
               pos=batch["pos"][rows], idx_mapping=batch["idx_mapping"][reqs], expanded_idx_mapping=batch["expanded_idx_mapping"][rows],
               expanded_local_pos=batch["expanded_local_pos"][rows])
    return out


@composed
@given(batch=mrv2_batches())
def test_composition_backends_agree(batch):
    from compositions.sampler import mrv2_rejection_sample

    results = {b: accepted(*mrv2_rejection_sample(**batch, backend=b)) for b in BACKEND_NAMES if b != "vllm"}
    want = results.pop("reference")
    for b, got in results.items():
        assert got == want, f"{b} differs from the oracle"
    assert all(1 <= len(t) <= d + 1 for t, d in zip(want, (batch["cu_num_logits"].diff() - 1).tolist()))


@given(batch=mrv2_batches(), data=st.data())
def test_composition_batch_invariance(batch, data):
    # A request's tokens depend on its own rows, slot, seed and positions only: running any subset
    # of the requests, in any order, gives each the same tokens (so chunked batches equal the whole).
    from compositions.sampler import mrv2_rejection_sample

    whole = accepted(*mrv2_rejection_sample(**batch, backend="cpu"))
    reqs = data.draw(st.permutations(range(len(whole))))
    keep = reqs[: data.draw(st.integers(0, len(reqs)))]
    part = accepted(*mrv2_rejection_sample(**subset(batch, keep), backend="cpu"))
    assert part == [whole[r] for r in keep]


@settings(max_examples=25)
@given(batch=mrv2_batches())
def test_composition_seeded_streams_reproduce_across_steps(batch):
    # Three decoding steps of the same requests (positions advanced by the accepted count, as the
    # engine steps them), then step 1 again, alone, after step 2: the streams are functions of
    # (seed, position, column) with no state carried between launches, so the replay equals the
    # first run, and every backend agrees at every step.
    from compositions.sampler import mrv2_rejection_sample

    def step(k: int, backend: str) -> list[list[int]]:
        return accepted(*mrv2_rejection_sample(**{**batch, "pos": batch["pos"] + 3 * k}, backend=backend))

    runs = [step(k, "cpu") for k in range(3)]
    assert step(1, "cpu") == runs[1]
    assert [step(k, "reference") for k in range(3)] == runs


def wide_batch(seed: int, draft_dtype: torch.dtype, spread: float, block: bool, one_hot: bool) -> dict[str, Any]:
    """Six requests (0 to 3 drafts) over 4099 columns: full eight-lane vectors and a tail in every
    tile. Logits N(0, spread) with some -inf columns; spread 60 puts exp results in float32's
    subnormal range. Temperatures 0, 0.7, 1 and 1.3."""
    g = torch.Generator().manual_seed(seed)
    drafts, v = [3, 0, 2, 3, 1, 3], 4099
    n, k, rows = len(drafts), max(drafts), sum(drafts) + len(drafts)
    target = torch.randn(rows, v, generator=g) * spread
    target[:, torch.randint(0, v, (40,), generator=g)] = -math.inf
    draft = (torch.randn(n, k, v, generator=g) * spread).to(draft_dtype)
    cu = [0]
    for d in drafts:
        cu.append(cu[-1] + d + 1)
    return dict(target_logits=target, draft_logits=None if one_hot else draft,
                draft_sampled=torch.randint(0, v, (rows,), generator=g, dtype=I32), cu_num_logits=i32(cu),
                pos=torch.randint(0, 2**40, (rows,), generator=g), idx_mapping=i64(list(range(n))),
                expanded_idx_mapping=i64([r for r, d in enumerate(drafts) for _ in range(d + 1)]),
                expanded_local_pos=i32([s for d in drafts for s in range(d + 1)]),
                temperature=f32([0.0, 0.7, 1.0, 1.3, 1.0, 0.7]),
                seed=torch.randint(-(2**63), 2**63 - 1, (n,), generator=g), num_speculative_steps=k,
                use_block_verification=block)


@pytest.mark.parametrize("draft_dtype", [torch.float32, torch.bfloat16], ids=["f32-drafts", "bf16-drafts"])
@pytest.mark.parametrize("spread", [3.0, 60.0], ids=["typical", "subnormal-exps"])
@pytest.mark.parametrize("mode", ["standard", "block", "one-hot"])
def test_wide_vocabulary_kernels_match_the_oracle(monkeypatch, draft_dtype, spread, mode):
    """The C++ port's vectorized tiles (csrc/vmath.h) give the oracle's bits: every kernel the
    composition launches runs on the oracle's inputs on both backends, outputs compared bit for bit."""
    import compositions.sampler as compositions
    import contracts

    real = compositions.launch
    checked = []

    def both(backend: str, kernel: str, grid: tuple[int, ...], **args: Any) -> None:
        spec = contracts.get(kernel)
        mine = {name: a.clone() if isinstance(a, torch.Tensor) else a for name, a in args.items()}
        real("reference", kernel, grid, **args)
        real("cpu", kernel, grid, **mine)
        for p in spec.outputs:
            if isinstance(args[p.name], torch.Tensor):
                want, got = args[p.name], mine[p.name]
                assert torch.equal(want.view(-1).view(torch.int8), got.view(-1).view(torch.int8)), f"{kernel}: {p.name}"
        checked.append(kernel)

    monkeypatch.setattr(compositions, "launch", both)
    batch = wide_batch(11, draft_dtype, spread, mode == "block", mode == "one-hot")
    compositions.mrv2_rejection_sample(**batch, backend="reference")
    assert "_resample_kernel" in checked and "_compute_local_logits_stats_kernel" in checked
    assert ("_compute_local_residual_mass_kernel" in checked) == (mode == "block")


@cpu_and_reference
def test_every_float16_draft_logit_reads_exactly(backend):
    # Every float16 bit pattern the contract accepts (all but NaN and +inf), one per tile of one
    # column: each tile's maximum is the logit as float32, which the port converts by its bits.
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    values = bits.view(torch.float16)
    values = values[~torch.isnan(values) & (values != INF)]
    v = values.numel()
    out = {n: torch.full((2, v), float("nan")) for n in ("target_local_max", "target_local_sumexp", "draft_local_max", "draft_local_sumexp")}
    a: dict[str, Any] = {"target_local_argmax_ptr": torch.full((2, v), POISON, dtype=I64), "target_local_argmax_stride": v}
    for n, t in out.items():
        a[f"{n}_ptr"], a[f"{n}_stride"] = t, v
    a.update(target_logits_ptr=torch.zeros(2, v), target_logits_stride=v, draft_logits_ptr=values.reshape(1, 1, v),
             draft_logits_stride_0=v, draft_logits_stride_1=v, expanded_idx_mapping_ptr=i64([0, 0]),
             expanded_local_pos_ptr=i32([0, 1]), temp_ptr=f32([1.0]), vocab_size=v, num_logits=2, BLOCK_SIZE=1,
             HAS_DRAFT_LOGITS=True)
    launch(backend, contract.LOGITS_STATS, a)
    want = values.float()
    want[want == 0] = 0.0  # -0.0 reads as +0.0 (C30)
    got = a["draft_local_max_ptr"][0]
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
