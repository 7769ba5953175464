"""Model Runner V2's logit bias (K42 ``_bias_kernel``): goldens on every backend (allowed ids with
duplicates, a bias on a disallowed column, min tokens on either side of ``pos + 1 == min_len``, the
all-masked restore taken and not, saved infinities not restored, vocabularies off the tile width),
vLLM's launch form, and invalid input."""

from __future__ import annotations

import math

import pytest
import torch
from support import BACKENDS, i32, i64, refused, run

from contracts import logit_bias as contract

backends = pytest.mark.parametrize("backend", BACKENDS)
ours = pytest.mark.parametrize("backend", ["reference", "cpu"])
INF = math.inf
NINF = -math.inf


def _table(lists: list[list[int]], width: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    t = torch.zeros(len(lists), width, dtype=dtype)
    for s, ids in enumerate(lists):
        t[s, : len(ids)] = torch.tensor(ids, dtype=dtype)
    return t


def args(logits: torch.Tensor, mapping: list[int], pos: list[int], allowed: list[list[int]], bias: list[dict[int, float]],
         stop: list[list[int]], min_lens: list[int], restore: list[int], check: bool, block: int = 8, logits_block: int = 4,
         widths: tuple[int, int, int] = (8, 8, 8), vocab_size: int | None = None) -> dict:
    """A launch as LogitBiasState stages it: each state's lists in its table rows, their lengths in the counts."""
    allowed_t = _table(allowed, widths[0])
    bias_ids = _table([list(b) for b in bias], widths[1])
    bias_t = _table([list(b.values()) for b in bias], widths[1], torch.float32)
    stop_t = _table(stop, widths[2])
    return dict(logits_ptr=logits, logits_stride=logits.stride(0), vocab_size=logits.shape[1] if vocab_size is None else vocab_size,
                expanded_idx_mapping_ptr=i32(mapping), num_allowed_token_ids_ptr=i32([len(x) for x in allowed]),
                allowed_token_ids_ptr=allowed_t, allowed_token_ids_stride=allowed_t.stride(0),
                num_logit_bias_ptr=i32([len(b) for b in bias]), bias_token_ids_ptr=bias_ids, bias_token_ids_stride=bias_ids.stride(0),
                bias_ptr=bias_t, bias_stride=bias_t.stride(0), pos_ptr=i64(pos), min_lens_ptr=i32(min_lens),
                num_stop_token_ids_ptr=i32([len(x) for x in stop]), restore_when_all_masked_ptr=i32(restore),
                stop_token_ids_ptr=stop_t, stop_token_ids_stride=stop_t.stride(0), BLOCK_SIZE=block, LOGITS_BLOCK_SIZE=logits_block,
                CHECK_ALL_MASKED_ROWS=check)


def bias(backend: str, a: dict) -> torch.Tensor:
    return run(backend, contract.K42, (a["logits_ptr"].shape[0],), **a)["logits_ptr"]


def same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit for bit, NaN where NaN."""
    return torch.equal(got.view(torch.int32), want.view(torch.int32))


@backends
def test_allowed_ids_and_bias_golden(backend):
    # x[r, c] = 10 r + c over 10 columns, tiles of 4 (the last one partial). State 0 allows [2, 5, 5, 9]
    # (5 twice) and biases 5 by +1.5 and 3 by +2 (3 is not allowed: -inf + 2 stays -inf); its column 2
    # holds -inf (kept) and column 4 NaN (masked). State 1 biases 0 by -0.25 and 9 by +100, allows all.
    # State 2 does nothing: its NaN stays as it was.
    x = (torch.arange(40, dtype=torch.float32)).view(4, 10)
    x[0, 2], x[0, 4], x[2, 6] = NINF, float("nan"), float("nan")
    a = args(x.clone(), [0, 1, 2, 0], [0, 0, 0, 0], allowed=[[2, 5, 5, 9], [], []], bias=[{5: 1.5, 3: 2.0}, {0: -0.25, 9: 100.0}, {}],
             stop=[[], [], []], min_lens=[0, 0, 0], restore=[0, 0, 0], check=False)
    want = torch.full((4, 10), NINF)
    want[0, 5], want[0, 9] = 6.5, 9.0
    want[3, 2], want[3, 5], want[3, 9] = 32.0, 36.5, 39.0
    want[1] = x[1]
    want[1, 0], want[1, 9] = 9.75, 119.0
    want[2] = x[2]
    assert same(bias(backend, a), want)


def _min_tokens(check: bool, restore: int) -> tuple[dict, torch.Tensor]:
    # State 0: stop tokens [1, 4, 1] (1 twice), min_len 5: rows at positions 2 and 3 mask them (pos + 1 < 5),
    # 4 (pos + 1 == min_len) and 5 do not. States 1-4 restore when `restore`, min_len 100:
    #   state 1: stop [0, 3]; column 1 stays live, so nothing is restored.
    #   state 2: allowed [0, 3] = stop [0, 3]: the mask leaves the row all -inf; restored, 0 and 3 come back.
    #   state 3: allowed = stop = [0, 3, 5] holding +inf, 2.5, -inf: only the finite 2.5 comes back.
    #   state 4: allowed [1], bias {1: +0.5, 2: +3}, stop [1]: restored, 1 comes back biased.
    x = torch.tensor([[0.5, 1.5, 2.5, 3.5, 4.5, 5.5]] * 8)
    x[5, 2], x[5, 4], x[5, 5] = NINF, NINF, NINF
    x[7, 0], x[7, 3], x[7, 5] = INF, 2.5, NINF
    a = args(x.clone(), [0, 0, 0, 0, 2, 1, 4, 3], [2, 3, 4, 5, 0, 0, 0, 0], allowed=[[], [], [0, 3], [0, 3, 5], [1]],
             bias=[{}, {}, {}, {}, {1: 0.5, 2: 3.0}], stop=[[1, 4, 1], [0, 3], [0, 3], [0, 3, 5], [1]], min_lens=[5, 100, 100, 100, 100],
             restore=[0, restore, restore, restore, restore], check=check, block=4)
    want = x.clone()
    want[0:2, [1, 4]] = NINF
    want[4] = torch.tensor([0.5, NINF, NINF, 3.5, NINF, NINF]) if check and restore else NINF
    want[5] = torch.tensor([NINF, 1.5, NINF, NINF, NINF, NINF])
    want[6] = torch.tensor([NINF, 2.0, NINF, NINF, NINF, NINF]) if check and restore else NINF
    want[7] = torch.tensor([NINF, NINF, NINF, 2.5, NINF, NINF]) if check and restore else NINF
    return a, want


@backends
@pytest.mark.parametrize("check, restore", [(True, 1), (True, 0), (False, 1)])
def test_min_tokens_golden(backend, check, restore):
    a, want = _min_tokens(check, restore)
    assert same(bias(backend, a), want)


@backends
def test_vllm_launch_form(backend):
    # apply_logit_bias: tables of 1024, 1024 and 128 columns, BLOCK_SIZE = next_power_of_2(1024),
    # LOGITS_BLOCK_SIZE 8192 over 9000 columns (a partial second tile), CHECK_ALL_MASKED_ROWS = any
    # restore flag. Row 0 allows [8999, 0, 8192] and biases 8192 by +1; row 1 (min tokens, stop 7 and
    # 8191) has live logits left, so nothing is restored.
    x = torch.randn(2, 9000)
    a = args(x.clone(), [0, 1], [3, 3], allowed=[[8999, 0, 8192], []], bias=[{8192: 1.0}, {}], stop=[[], [7, 8191]],
             min_lens=[0, 9], restore=[0, 1], check=True, block=1024, logits_block=8192, widths=(1024, 1024, 128))
    assert a["BLOCK_SIZE"] == 1 << (max(a["allowed_token_ids_ptr"].shape[1], a["stop_token_ids_ptr"].shape[1]) - 1).bit_length()
    want = torch.full((2, 9000), NINF)
    want[0, [8999, 0, 8192]] = x[0, [8999, 0, 8192]]
    want[0, 8192] += 1.0
    want[1] = x[1]
    want[1, [7, 8191]] = NINF
    assert same(bias(backend, a), want)


def _args(**change) -> dict:
    a = args(torch.zeros(2, 6), [0, 1], [0, 0], allowed=[[1, 2], []], bias=[{}, {3: 1.0}], stop=[[4], [5]], min_lens=[9, 9],
             restore=[1, 0], check=True, block=4)
    return a | change


@ours
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(expanded_idx_mapping_ptr=i32([0, 2])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(expanded_idx_mapping_ptr=i32([-1, 0])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(pos_ptr=i64([0])), ValueError, "pos_ptr"),
        (dict(pos_ptr=i64([-1, 0])), ValueError, "pos_ptr"),
        (dict(pos_ptr=i64([2**31 - 1, 0])), ValueError, "pos_ptr"),
        (dict(num_allowed_token_ids_ptr=i32([9, 0])), ValueError, "num_allowed_token_ids_ptr"),
        (dict(num_allowed_token_ids_ptr=i32([-1, 0])), ValueError, "num_allowed_token_ids_ptr"),
        (dict(num_allowed_token_ids_ptr=i32([5, 0])), ValueError, "BLOCK_SIZE"),
        (dict(num_logit_bias_ptr=i32([0, 9])), ValueError, "num_logit_bias_ptr"),
        (dict(num_stop_token_ids_ptr=i32([-2, 1])), ValueError, "num_stop_token_ids_ptr"),
        (dict(min_lens_ptr=i32([9])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(vocab_size=5), ValueError, "stop_token_ids_ptr"),
        (dict(vocab_size=7), ValueError, "logits_stride"),
        (dict(logits_stride=3), ValueError, "logits_stride"),
        (dict(bias_stride=1), ValueError, "bias_stride"),
        (dict(LOGITS_BLOCK_SIZE=6), ValueError, "LOGITS_BLOCK_SIZE"),
        (dict(BLOCK_SIZE=3), ValueError, "BLOCK_SIZE"),
        (dict(logits_ptr=torch.zeros(2, 6, dtype=torch.float64)), TypeError, "logits_ptr"),
        (dict(bias_ptr=torch.zeros(2, 8, dtype=torch.float64)), TypeError, "bias_ptr"),
        (dict(stop_token_ids_ptr=torch.zeros(2, 8)), TypeError, "stop_token_ids_ptr"),
    ],
)
def test_invalid(backend, change, error, param):
    refused(backend, contract.K42, _args(**change), error, param)


@ours
@pytest.mark.parametrize("table, column", [("allowed_token_ids_ptr", 0), ("bias_token_ids_ptr", 1), ("stop_token_ids_ptr", 2)])
@pytest.mark.parametrize("token", [-1, 6])
def test_ids_must_be_columns(backend, table, column, token):
    a = _args()
    a[table][0 if table == "allowed_token_ids_ptr" else 1 if table == "bias_token_ids_ptr" else 0, 0] = token
    refused(backend, contract.K42, a, ValueError, table)


@ours
def test_a_stop_list_never_read_is_not_checked(backend):
    # min_len 1 at position 0: min tokens hold no longer (0 + 1 == 1), so the stop ids are never read.
    a = _args(min_lens_ptr=i32([1, 1]))
    a["stop_token_ids_ptr"][0, 0] = 99
    got = bias(backend, a)
    assert got[0].tolist() == [NINF, 0.0, 0.0, NINF, NINF, NINF] and got[1].tolist() == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]


@ours
def test_bias_ids_are_distinct_and_biases_finite(backend):
    # vLLM's ids are a dict's keys; two lanes adding to one column would race, compiled.
    a = _args(num_logit_bias_ptr=i32([0, 2]))
    a["bias_token_ids_ptr"][1, :2] = torch.tensor([3, 3], dtype=torch.int32)
    refused(backend, contract.K42, a, ValueError, "bias_token_ids_ptr")
    for value in (INF, float("nan")):
        a = _args()
        a["bias_ptr"][1, 0] = value
        refused(backend, contract.K42, a, ValueError, "bias_ptr")


@ours
def test_nan_is_refused_only_where_the_kernel_computes_with_it(backend):
    # A NaN at a biased live column: its sum's bits are the platform's.
    a = _args()
    a["logits_ptr"][1, 3] = float("nan")
    refused(backend, contract.K42, a, ValueError, "logits_ptr")
    # Row 0 restores when masked whole: a NaN among its live columns decides the scan's maximum.
    a = _args()
    a["logits_ptr"][0, 2] = float("nan")
    refused(backend, contract.K42, a, ValueError, "logits_ptr")
    # Where it is only moved, masked or compared, a NaN is accepted: a disallowed column of row 0, its
    # stop column 4 (masked before the scan), row 1's unbiased column 0.
    a = _args()
    a["logits_ptr"][0, 0] = a["logits_ptr"][0, 4] = a["logits_ptr"][1, 0] = float("nan")
    got = bias(backend, a)
    assert got[0].tolist() == [NINF, 0.0, 0.0, NINF, NINF, NINF] and math.isnan(got[1, 0].item())
