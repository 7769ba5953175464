"""Model Runner V2's penalties (K39 ``_penalties_kernel``, K40 ``_bincount_kernel``): goldens worked out
by hand on every backend, the earlier drafts counted, the rounding of each step, vLLM's launch forms,
and invalid input."""

from __future__ import annotations

import math

import pytest
import torch
from support import BACKENDS, f32, i32, i64, refused, run

from contracts import penalties as contract

backends = pytest.mark.parametrize("backend", BACKENDS)
ours = pytest.mark.parametrize("backend", ["reference", "cpu"])
INF = math.inf


def words(states: int, v: int, prompts: dict[int, list[int]]) -> torch.Tensor:
    """A prompt bitmask written by hand: bit t % 32 of word t // 32 (bit 31 as a negative int32)."""
    w = [[0] * -(-v // 32) for _ in range(states)]
    for s, tokens in prompts.items():
        for t in tokens:
            w[s][t // 32] |= 1 << (t % 32)
    return torch.tensor([[x - 2**32 if x >= 2**31 else x for x in row] for row in w], dtype=torch.int32)


def penalise(backend: str, logits: torch.Tensor, mapping: list[int], penalties: list[tuple[float, float, float]],
             prompts: dict[int, list[int]] | None = None, counts: dict[tuple[int, int], int] | None = None,
             token_ids: list[int] | None = None, local_pos: list[int] | None = None, block: int = 32) -> torch.Tensor:
    """K39 over ``logits`` (changed in place and returned): per-state (repetition, frequency, presence)."""
    n, v = logits.shape
    states = len(penalties)
    bins = torch.zeros(states, v, dtype=torch.int32)
    for (s, t), c in (counts or {}).items():
        bins[s, t] = c
    run(backend, contract.K39, (n, -(-v // block)), logits_ptr=logits, logits_stride=logits.stride(0),
        expanded_idx_mapping_ptr=i64(mapping), token_ids_ptr=i32(token_ids or [0] * n),
        expanded_local_pos_ptr=i32(local_pos or [0] * n), repetition_penalty_ptr=f32([p[0] for p in penalties]),
        frequency_penalty_ptr=f32([p[1] for p in penalties]), presence_penalty_ptr=f32([p[2] for p in penalties]),
        prompt_bin_mask_ptr=(m := words(states, v, prompts or {})), prompt_bin_mask_stride=m.stride(0),
        output_bin_counts_ptr=bins, output_bin_counts_stride=bins.stride(0), vocab_size=v, BLOCK_SIZE=block)
    return logits


def bits(x: torch.Tensor) -> list[int]:
    """Float32 values as their bit patterns: -0.0 differs from +0.0."""
    return x.contiguous().view(torch.int32).reshape(-1).tolist()


@backends
def test_repetition_golden(backend):
    # V = 40: two 32-wide tiles, the second partial; two bitmask words, the second partial. State 1
    # (rep 2) has prompt tokens 3, 31 (bit 31: a negative word) and 39 (V - 1), and token 5 twice in its
    # output. Row 0 is state 1, row 1 state 0 (no penalty: untouched, its NaN never read).
    x = torch.zeros(2, 40)
    x[0, [3, 31, 39, 5, 6, 7]] = f32([4.0, -3.0, 1.5, 1.0, 8.0, -8.0])
    x[1, 9] = float("nan")
    got = penalise(backend, x, [1, 0], [(1.0, 0.0, 0.0), (2.0, 0.0, 0.0)], prompts={1: [3, 31, 39]}, counts={(1, 5): 2})
    want = torch.zeros(40)
    want[[3, 31, 39, 5, 6, 7]] = f32([2.0, -6.0, 0.75, 0.5, 8.0, -8.0])  # 6 and 7 are in neither
    assert bits(got[0]) == bits(want)
    assert math.isnan(got[1, 9].item()) and got[1].nan_to_num(7.0).tolist() == [0.0] * 9 + [7.0] + [0.0] * 30


@backends
def test_repetition_signs_and_infinities(backend):
    # Every column is in the prompt, rep 4: positive logits times RN(1/4) = 0.25, others times 4; zeros
    # keep their sign, infinities stay.
    x = f32([[3.0, -3.0, 0.0, -0.0, -INF, INF, 2.0**-149, -(2.0**-149)]])
    got = penalise(backend, x, [0], [(4.0, 0.0, 0.0)], prompts={0: list(range(8))})
    assert bits(got) == bits(f32([[0.75, -12.0, 0.0, -0.0, -INF, INF, 0.0, -(2.0**-147)]]))


def _compiled_vllm(backend: str) -> bool:
    from conformance.backends import BACKENDS as REGISTERED

    return backend == "vllm" and "compiled" in REGISTERED["vllm"].mode()


def _exact_reciprocal(backend: str) -> None:
    """vLLM's compiled `1.0 / scale` is approximate: departure C6 (docs/penalties.md)."""
    if _compiled_vllm(backend):
        pytest.skip("departure C6: vLLM's compiled division is approximate (<= 2 ulp)")


def _rounded_products(backend: str) -> None:
    """vLLM's compiled `logits - freq * counts` is one fma: departure C42 (docs/penalties.md)."""
    if _compiled_vllm(backend):
        pytest.skip("departure C42: compiled Triton fuses vLLM's frequency product into the subtraction")


@backends
def test_repetition_multiplies_by_the_rounded_reciprocal(backend):
    _exact_reciprocal(backend)
    # rep 3: RN(1/3) is no third, and x * RN(1/3) differs from x / 3 for about a third of x: the contract
    # is vLLM's 1.0 / scale then a product (two roundings), not a division.
    x = torch.linspace(0.5, 50.0, 1024, dtype=torch.float32).view(1, 1024)
    third = f32(1.0) / f32(3.0)
    got = penalise(backend, x.clone(), [0], [(3.0, 0.0, 0.0)], prompts={0: list(range(1024))}, block=256)
    assert torch.equal(got, x * third)
    assert not torch.equal(got, x / f32(3.0))


@backends
def test_tiny_and_huge_repetition_penalties(backend):
    _exact_reciprocal(backend)
    # rep 1e-45 (the least subnormal): RN(1/rep) overflows to inf, so positive logits become inf and
    # negative ones shrink to a subnormal or -0.0. rep 2**127: RN(1/rep) = 2**-127 (subnormal), negative
    # logits overflow to -inf past 2**1.
    x = f32([[2.0, -1.0, -0.25, 0.0], [1.0, -1.0, -2.0, 3.0]])
    got = penalise(backend, x, [0, 1], [(1e-45, 0.0, 0.0), (2.0**127, 0.0, 0.0)], prompts={0: [0, 1, 2, 3], 1: [0, 1, 2, 3]})
    assert bits(got) == bits(f32([[INF, -1e-45, -0.0, 0.0], [2.0**-127, -(2.0**127), -INF, 3 * 2.0**-127]]))


@backends
def test_penalties_of_one_and_zero_leave_the_row_unwritten(backend):
    # rep 1, freq 0 and presence -0.0 (equal to 0): not penalised, so nothing is read (the NaN) or
    # written (the -0.0 stays), whatever the counts and prompt say.
    x = f32([[float("nan"), -0.0, 5.0, -5.0]])
    got = penalise(backend, x.clone(), [0], [(1.0, 0.0, -0.0)], prompts={0: [0, 1, 2, 3]}, counts={(0, 2): 3},
                   token_ids=[2], local_pos=[0], block=32)
    assert bits(got) == bits(x)


@backends
def test_frequency_and_presence_golden(backend):
    # freq 0.5, presence 0.25, no repetition penalty: a token with count c loses 0.5 c + 0.25 (c > 0).
    x = f32([[1.0, 1.0, 1.0, 1.0, -INF, 2.0]])
    got = penalise(backend, x, [0], [(1.0, 0.5, 0.25)], counts={(0, 1): 1, (0, 2): 4, (0, 4): 2})
    assert got.tolist() == [[1.0, 0.25, -1.25, 1.0, -INF, 2.0]]


@backends
def test_earlier_drafts_count_as_output(backend):
    # Row 0 is another request (state 0, no penalty). Rows 1-4 are one request (state 1) at local
    # positions 0..3: token_ids[1] = 7 is its last committed token (never counted), its drafts are
    # 9, 9, 11. Row at position p counts the drafts at positions 1..p. Token 2 is in its output once.
    # freq 0.5, presence 0.25: c > 0 loses 0.5 c + 0.25.
    x = torch.zeros(5, 12)
    got = penalise(backend, x, [0, 1, 1, 1, 1], [(1.0, 0.0, 0.0), (1.0, 0.5, 0.25)], counts={(1, 2): 1},
                   token_ids=[3, 7, 9, 9, 11], local_pos=[0, 0, 1, 2, 3])
    want = torch.zeros(5, 12)
    want[1:, 2] = -0.75
    want[2, 9] = -0.75  # one 9
    want[3, 9] = want[4, 9] = -1.25  # two 9s
    want[4, 11] = -0.75
    assert got.tolist() == want.tolist()


@backends
def test_a_token_penalised_only_for_an_earlier_draft(backend):
    # Token 9 is in neither the prompt nor the output (repetition 2 only): the row at local position 1
    # halves its positive logit and doubles its negative one, as drafted; position 0 does not. A draft
    # of -1 (vLLM's placeholder for a draft not yet proposed) and one past V count nowhere.
    x = f32([[4.0, -4.0] * 6] * 3)
    x[:, 9] = 4.0
    x[:, 10] = -4.0
    got = penalise(backend, x.clone(), [0, 0, 0], [(2.0, 0.0, 0.0)], prompts={0: [0]}, token_ids=[5, 9, 10],
                   local_pos=[0, 1, 2])
    want = x.clone()
    want[:, 0] = 2.0  # the prompt token
    want[1:, 9] = 2.0
    want[2, 10] = -8.0
    assert got.tolist() == want.tolist()
    y = f32([[1.0] * 12] * 3)
    got = penalise(backend, y.clone(), [0, 0, 0], [(1.0, 1.0, 0.0)], token_ids=[5, -1, 12], local_pos=[0, 1, 2])
    assert got.tolist() == y.tolist()


@backends
def test_the_frequency_product_rounds_before_the_subtraction(backend):
    _rounded_products(backend)
    # freq = RN(0.1), count 3: the product RN(freq * 3) is inexact. A logit equal to it loses exactly
    # itself: 0.0. Fused into one rounding (x - freq * 3 exactly, an fma), the difference would be the
    # product's rounding error, about 1e-8, instead.
    freq = f32(0.1)
    product = freq * f32(3.0)  # rounded once
    error = float(product) - float(freq) * 3.0  # exact in float64: 24-bit operands
    assert error != 0.0
    x = product.reshape(1, 1).clone()
    got = penalise(backend, x, [0], [(1.0, 0.1, 0.0)], counts={(0, 0): 3})
    assert bits(got) == bits(f32([[0.0]]))


@backends
def test_a_count_past_2_24_rounds_to_float32(backend):
    # count 2**24 + 1 converts to float32 as 2**24 (ties to even); freq 1: 0 - 2**24.
    x = f32([[0.0, 0.0]])
    got = penalise(backend, x, [0], [(1.0, 1.0, 0.0)], counts={(0, 0): 2**24 + 1, (0, 1): 2**24 + 3})
    assert got.tolist() == [[-(2.0**24), -(2.0**24 + 4)]]


@backends
def test_signed_zero_penalties_still_subtract(backend):
    # rep 2 penalises the row; freq = -0.0 and presence = -0.0 are off but still subtracted: a -0.0
    # logit minus (-0.0 x 0) = -0.0 - -0.0 = +0.0 (IEEE), as vLLM's unconditional subtraction does.
    x = f32([[-0.0, -0.0, 3.0]])
    got = penalise(backend, x, [0], [(2.0, -0.0, -0.0)], prompts={0: [1]})
    assert bits(got) == bits(f32([[0.0, 0.0, 3.0]]))


@backends
def test_bit_31_and_the_last_token(backend):
    # V = 64, BLOCK_SIZE 64: tokens 31 and 63 are bit 31 of words 0 and 1 (both words negative), 63 = V - 1.
    x = torch.full((1, 64), 2.0)
    got = penalise(backend, x, [0], [(2.0, 0.0, 0.0)], prompts={0: [31, 63, 32]}, block=64)
    want = torch.full((64,), 2.0)
    want[[31, 32, 63]] = 1.0
    assert got[0].tolist() == want.tolist()


@backends
def test_strided_rows(backend):
    # Rows of 10 inside a buffer of 16 columns: the 6 columns past V stay.
    buf = torch.full((3, 16), 3.0)
    x = buf[:, :10]
    penalise(backend, x, [0, 1, 0], [(1.0, 1.0, 0.0), (1.0, 0.0, 0.0)], counts={(0, 4): 1, (0, 2): 2})
    want = torch.full((3, 16), 3.0)
    want[[0, 2], 4] = 2.0
    want[[0, 2], 2] = 1.0
    assert buf.tolist() == want.tolist()


# -- K40 ---------------------------------------------------------------------------------------------
def bincount(backend: str, mapping: list[int], tokens: torch.Tensor, prompt_len: list[int], prefill_len: list[int],
             mask: torch.Tensor, counts: torch.Tensor, block: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max((prefill_len[s] for s in mapping), default=0)
    run(backend, contract.K40, (len(mapping), -(-longest // block)), expanded_idx_mapping_ptr=i64(mapping),
        all_token_ids_ptr=tokens, all_token_ids_stride=tokens.stride(0), prompt_len_ptr=i32(prompt_len),
        prefill_len_ptr=i32(prefill_len), prompt_bin_mask_ptr=mask, prompt_bin_mask_stride=mask.stride(0),
        output_bin_counts_ptr=counts, output_bin_counts_stride=counts.stride(0), BLOCK_SIZE=block)
    return mask, counts


@backends
def test_bincount_golden(backend):
    # V = 48 (two words). State 2: prompt [5, 31, 5] (prompt_len 3), outputs [7, 7, 40] (prefill_len 6,
    # tiles of 4: the prompt ends inside tile 0). Its word 0 already holds bit 0, its count of 7 is 1:
    # OR-ed and added to. State 0: prompt [1, 2, 33, 47] fills tile 0 exactly (prefill_len 4 < the
    # longest, 6: its tile 1 does nothing). State 1 is not among the rows: untouched.
    tokens = torch.full((3, 8), 46, dtype=torch.int32)
    tokens[2, :6] = i32([5, 31, 5, 7, 7, 40])
    tokens[0, :4] = i32([1, 2, 33, 47])
    mask = torch.zeros(3, 2, dtype=torch.int32)
    mask[2, 0], mask[1, 0] = 1, 8
    counts = torch.zeros(3, 48, dtype=torch.int32)
    counts[2, 7], counts[1, 7] = 1, 5
    mask, counts = bincount(backend, [2, 0], tokens, [4, 0, 3], [4, 2, 6], mask, counts)
    assert mask.tolist() == [[(1 << 1) | (1 << 2), (1 << 1) | (1 << 15)], [8, 0], [1 + (1 << 5) - 2**31, 0]]
    want = torch.zeros(3, 48, dtype=torch.int32)
    want[2, 7], want[2, 40], want[1, 7] = 3, 1, 5
    assert counts.tolist() == want.tolist()


@backends
def test_bincount_two_rows_of_one_state_add_twice(backend):
    # The call site passes distinct new requests; the contract accepts a state named twice: its bits
    # once (an OR), its outputs counted once per row, in any order (vLLM's atomics).
    tokens = i32([[3, 3, 9, 9, 9]])
    mask, counts = bincount(backend, [0, 0], tokens, [2], [5], torch.zeros(1, 1, dtype=torch.int32),
                            torch.zeros(1, 10, dtype=torch.int32))
    assert mask.tolist() == [[1 << 3]] and counts[0, 9].item() == 6 and int(counts.sum()) == 6


# -- vLLM's launch forms ---------------------------------------------------------------------------
@backends
def test_vllm_launch_forms(backend):
    # bincount then apply_penalties as PenaltiesState runs them: V = 9000 (not a multiple of 32 or of
    # the tile), max_num_reqs = 4, tables the host zeroed, int64 mappings, int32 token ids and
    # positions; bincount's grid (N, cdiv(max_prefill_len, 1024)), apply_penalties' (T, cdiv(V, B)).
    # The tile is vLLM's CPU worker's 1024 (8192 on a GPU: the interpreter takes minutes there).
    g = torch.Generator().manual_seed(3)
    v, states, block = 9000, 4, 1024
    all_token_ids = torch.randint(0, v, (states, 3000), generator=g, dtype=torch.int32)
    prompt_len, prefill_len = [1500, 10, 0, 700], [2100, 10, 0, 1200]
    mask = torch.zeros(states, -(-v // 32), dtype=torch.int32)
    counts = torch.zeros(states, v, dtype=torch.int32)
    new = i64([3, 0])
    b = dict(expanded_idx_mapping_ptr=new, all_token_ids_ptr=all_token_ids, all_token_ids_stride=all_token_ids.stride(0),
             prompt_len_ptr=i32(prompt_len), prefill_len_ptr=i32(prefill_len), prompt_bin_mask_ptr=mask,
             prompt_bin_mask_stride=mask.stride(0), output_bin_counts_ptr=counts, output_bin_counts_stride=counts.stride(0),
             BLOCK_SIZE=contract.BINCOUNT_BLOCK_SIZE)
    assert contract.BINCOUNT.call_site(b)
    run(backend, contract.K40, (2, -(-max(prefill_len) // 1024)), **b)
    unpacked = ((mask.long() & 0xFFFFFFFF)[:, :, None] >> torch.arange(32)).bitwise_and(1).reshape(states, -1)[:, :v].bool()
    for s in range(states):
        toks = all_token_ids[s].long()
        n_prompt, n_prefill = (prompt_len[s], prefill_len[s]) if s in (3, 0) else (0, 0)
        assert torch.equal(counts[s], torch.bincount(toks[n_prompt:n_prefill], minlength=v).int())
        seen = torch.zeros(v, dtype=torch.bool)
        seen[toks[:n_prompt]] = True
        assert torch.equal(unpacked[s], seen)
    # A step: request 3 verifies two drafts (rows 0-2: its last committed token 17, drafts V - 1 and
    # 17), request 0 samples one row (row 3).
    x = torch.randn(4, v, generator=g) * 3
    mapping, local_pos = i64([3, 3, 3, 0]), i32([0, 1, 2, 0])
    token_ids = i32([17, v - 1, 17, 4])
    rep, freq, pres = f32([1.3, 1.0, 1.0, 1.1]), f32([0.0, 0.0, 0.0, -0.5]), f32([0.2, 0.0, 0.0, 0.0])
    want = x.clone()
    for r, s in enumerate(mapping.tolist()):
        c = counts[s].long().clone()
        for t in token_ids[r - int(local_pos[r]) + 1 : r + 1].tolist():
            c[t] += 1
        hit = (c > 0) | unpacked[s]
        y = torch.where(hit, torch.where(want[r] > 0, want[r] * (f32(1.0) / rep[s]), want[r] * rep[s]), want[r])
        want[r] = y - freq[s] * c.float() - pres[s] * (c > 0).float()
    a = dict(logits_ptr=x, logits_stride=x.stride(0), expanded_idx_mapping_ptr=mapping, token_ids_ptr=token_ids,
             expanded_local_pos_ptr=local_pos, repetition_penalty_ptr=rep, frequency_penalty_ptr=freq, presence_penalty_ptr=pres,
             prompt_bin_mask_ptr=mask, prompt_bin_mask_stride=mask.stride(0), output_bin_counts_ptr=counts,
             output_bin_counts_stride=counts.stride(0), vocab_size=v, BLOCK_SIZE=block)
    assert contract.PENALTIES.call_site(a)
    _exact_reciprocal(backend)
    run(backend, contract.K39, (4, -(-v // block)), **a)
    assert bits(x) == bits(want)


# -- invalid input ---------------------------------------------------------------------------------
def _args() -> dict:
    return dict(logits_ptr=torch.zeros(2, 40), logits_stride=40, expanded_idx_mapping_ptr=i64([0, 1]), token_ids_ptr=i32([3, 4]),
                expanded_local_pos_ptr=i32([0, 1]), repetition_penalty_ptr=f32([2.0, 1.0]), frequency_penalty_ptr=f32([0.0, 0.5]),
                presence_penalty_ptr=f32([0.0, 0.0]), prompt_bin_mask_ptr=torch.zeros(2, 2, dtype=torch.int32),
                prompt_bin_mask_stride=2, output_bin_counts_ptr=torch.zeros(2, 40, dtype=torch.int32),
                output_bin_counts_stride=40, vocab_size=40, BLOCK_SIZE=32)


@ours
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(expanded_idx_mapping_ptr=i64([0, 2])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(expanded_idx_mapping_ptr=i64([-1, 0])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(expanded_local_pos_ptr=i32([0])), ValueError, "expanded_local_pos_ptr"),
        (dict(expanded_local_pos_ptr=i32([0, 3])), ValueError, "expanded_local_pos_ptr"),
        (dict(expanded_local_pos_ptr=i32([0, -1])), ValueError, "expanded_local_pos_ptr"),
        (dict(token_ids_ptr=i32([3])), ValueError, "token_ids_ptr"),
        (dict(repetition_penalty_ptr=f32([0.0, 1.0])), ValueError, "repetition_penalty_ptr"),
        (dict(repetition_penalty_ptr=f32([-2.0, 1.0])), ValueError, "repetition_penalty_ptr"),
        (dict(repetition_penalty_ptr=f32([INF, 1.0])), ValueError, "repetition_penalty_ptr"),
        (dict(frequency_penalty_ptr=f32([0.0, float("nan")])), ValueError, "frequency_penalty_ptr"),
        (dict(frequency_penalty_ptr=f32([0.0, 2.0**97])), ValueError, "frequency_penalty_ptr"),
        (dict(presence_penalty_ptr=f32([INF, 0.0])), ValueError, "presence_penalty_ptr"),
        (dict(prompt_bin_mask_ptr=torch.zeros(2, 1, dtype=torch.int32), prompt_bin_mask_stride=1), ValueError, "prompt_bin_mask_ptr"),
        (dict(output_bin_counts_ptr=torch.zeros(2, 39, dtype=torch.int32), output_bin_counts_stride=39), ValueError,
         "output_bin_counts_ptr"),
        (dict(output_bin_counts_stride=41), ValueError, "output_bin_counts_ptr"),
        (dict(logits_stride=30), ValueError, "logits_stride"),
        (dict(vocab_size=41), ValueError, "logits_stride"),
        (dict(BLOCK_SIZE=16), ValueError, "BLOCK_SIZE"),
        (dict(BLOCK_SIZE=48), ValueError, "BLOCK_SIZE"),
        (dict(vocab_size=-1), ValueError, "vocab_size"),
        (dict(prompt_bin_mask_ptr=torch.zeros(2, 2, dtype=torch.int64)), TypeError, "prompt_bin_mask_ptr"),
        (dict(logits_ptr=torch.zeros(2, 40, dtype=torch.float64)), TypeError, "logits_ptr"),
        (dict(repetition_penalty_ptr=torch.tensor([2.0, 1.0], dtype=torch.float64)), TypeError, "repetition_penalty_ptr"),
    ],
)
def test_penalties_invalid(backend, change, error, param):
    refused(backend, contract.K39, _args() | change, error, param)


@ours
def test_penalties_refuses_what_makes_nan_or_wraps(backend):
    a = _args()
    a["logits_ptr"][1, 5] = float("nan")
    refused(backend, contract.K39, a, ValueError, "logits_ptr")
    a["frequency_penalty_ptr"] = f32([0.0, 0.0])  # row 1 is not penalised: its NaN is never read
    run(backend, contract.K39, (2, 2), **a)
    # A count plus the earlier drafts past int32 would wrap.
    b = _args()
    b["output_bin_counts_ptr"][1, 4] = 2**31 - 1
    refused(backend, contract.K39, b, ValueError, "output_bin_counts_ptr")
    b["token_ids_ptr"] = i32([3, 41])  # a draft outside the vocabulary counts nowhere: no wrap
    run(backend, contract.K39, (2, 2), **b)


def _bincount_args() -> dict:
    tokens = i32([[1, 2, 3, 4], [5, 6, 7, 8]])
    return dict(expanded_idx_mapping_ptr=i64([1]), all_token_ids_ptr=tokens, all_token_ids_stride=4, prompt_len_ptr=i32([0, 2]),
                prefill_len_ptr=i32([0, 4]), prompt_bin_mask_ptr=torch.zeros(2, 1, dtype=torch.int32), prompt_bin_mask_stride=1,
                output_bin_counts_ptr=torch.zeros(2, 9, dtype=torch.int32), output_bin_counts_stride=9, BLOCK_SIZE=4)


@ours
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(expanded_idx_mapping_ptr=i64([2])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(expanded_idx_mapping_ptr=i64([-1])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(prompt_len_ptr=i32([0, 5])), ValueError, "prompt_len_ptr"),
        (dict(prompt_len_ptr=i32([0, -1])), ValueError, "prompt_len_ptr"),
        (dict(prefill_len_ptr=i32([0, 5]), prompt_len_ptr=i32([0, 0])), ValueError, "all_token_ids_ptr"),
        (dict(output_bin_counts_ptr=torch.zeros(2, 8, dtype=torch.int32), output_bin_counts_stride=8), ValueError, "all_token_ids_ptr"),
        (dict(all_token_ids_ptr=i32([[1, 2, 3, 4], [5, 32, 7, 8]])), ValueError, "all_token_ids_ptr"),
        (dict(all_token_ids_ptr=i32([[1, 2, 3, 4], [-5, 6, 7, 8]])), ValueError, "all_token_ids_ptr"),
        (dict(all_token_ids_ptr=i32([[1, 2, 3, 4], [5, 6, 7, -8]])), ValueError, "all_token_ids_ptr"),
        (dict(all_token_ids_stride=5), ValueError, "all_token_ids_ptr"),
        (dict(output_bin_counts_stride=10), ValueError, "output_bin_counts_ptr"),
        (dict(BLOCK_SIZE=3), ValueError, "BLOCK_SIZE"),
        (dict(output_bin_counts_ptr=torch.zeros(2, 9, dtype=torch.int64)), TypeError, "output_bin_counts_ptr"),
    ],
)
def test_bincount_invalid(backend, change, error, param):
    refused(backend, contract.K40, _bincount_args() | change, error, param)


@ours
def test_bincount_refuses_a_count_that_wraps(backend):
    a = _bincount_args()
    a["output_bin_counts_ptr"][1, 8] = 2**31 - 1
    refused(backend, contract.K40, a, ValueError, "output_bin_counts_ptr")
    a["expanded_idx_mapping_ptr"] = i64([1, 1])  # twice: 2**31 - 2 + 2 wraps too
    a["output_bin_counts_ptr"][1, 8] = 2**31 - 2
    refused(backend, contract.K40, a, ValueError, "output_bin_counts_ptr")
    a["expanded_idx_mapping_ptr"] = i64([1])
    run(backend, contract.K40, (1, 1), **a)
    assert a["output_bin_counts_ptr"][1, 8].item() == 2**31 - 1
