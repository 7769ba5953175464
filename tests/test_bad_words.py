"""Model Runner V2's bad words (K41 ``_bad_words_kernel``): goldens on every backend (prefixes among
committed tokens, drafts and both, too long by one, one-token words, two words banning one token,
rows of one request at local positions 0..K), vLLM's launch form, and invalid input."""

from __future__ import annotations

import math

import pytest
import torch
from support import BACKENDS, i32, refused, run

from contracts import bad_words as contract

backends = pytest.mark.parametrize("backend", BACKENDS)
ours = pytest.mark.parametrize("backend", ["reference", "cpu"])
INF = math.inf


def tables(words: list[list[list[int]]], width: int = 32, most: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(bad_word_token_ids, bad_word_offsets, num_bad_words) of each state's bad words, flattened as
    BadWordsState.add_request does: offsets from 0, one more than the words."""
    tokens = torch.zeros(len(words), width, dtype=torch.int32)
    offsets = torch.zeros(len(words), most + 1, dtype=torch.int32)
    for s, ws in enumerate(words):
        flat = [t for w in ws for t in w]
        tokens[s, : len(flat)] = torch.tensor(flat, dtype=torch.int32)
        offsets[s, 1 : len(ws) + 1] = torch.tensor([len(w) for w in ws], dtype=torch.int32).cumsum(0)
    return tokens, offsets, i32([len(ws) for ws in words])


def args(logits: torch.Tensor, mapping: list[int], words: list[list[list[int]]], history: list[list[int]], prompt: list[int],
         total: list[int], input_ids: list[int], local_pos: list[int], width: int = 32, most: int = 8) -> dict:
    tokens, offsets, num = tables(words, width, most)
    all_ids = torch.zeros(len(history), max(len(h) for h in history) + 3, dtype=torch.int32)
    for s, h in enumerate(history):
        all_ids[s, : len(h)] = torch.tensor(h, dtype=torch.int32)
    return dict(logits_ptr=logits, logits_stride=logits.stride(0), expanded_idx_mapping_ptr=i32(mapping),
                bad_word_token_ids_ptr=tokens, bad_word_token_ids_stride=tokens.stride(0), bad_word_offsets_ptr=offsets,
                bad_word_offsets_stride=offsets.stride(0), num_bad_words_ptr=num, all_token_ids_ptr=all_ids,
                all_token_ids_stride=all_ids.stride(0), prompt_len_ptr=i32(prompt), total_len_ptr=i32(total),
                input_ids_ptr=i32(input_ids), expanded_local_pos_ptr=i32(local_pos))


def banned(backend: str, a: dict, grid: tuple[int, int]) -> list[list[int]]:
    out = run(backend, contract.K41, grid, **a)["logits_ptr"]
    return [sorted(int(c) for c in (row == -INF).nonzero().view(-1)) for row in out]


# State 0: prompt [9, 9], output [3, 4]; three rows at local positions 0, 1, 2 whose input ids are the
# last committed token 4, then drafts 5 and 6. Row 0 sees [3, 4], row 1 [3, 4, 5], row 2 [3, 4, 5, 6].
# State 1 has no bad words (row 3). State 2: prompt [8], no output yet; row 4 (position 0) sees [],
# row 5 (position 1, draft 3) sees [3]; its one bad word leaves six of the grid's seven programs idle.
WORDS = [
    [[7], [4, 5, 1], [5, 6, 2], [3, 4, 8], [9, 3, 4, 5, 0], [6, 7], [2, 3, 9]],
    [],
    [[3, 5]],
]
HISTORY = [[9, 9, 3, 4], [1, 2], [8]]


def golden(logits: torch.Tensor) -> dict:
    return args(logits, [0, 0, 0, 1, 2, 2], WORDS, HISTORY, prompt=[2, 0, 1], total=[4, 2, 1], input_ids=[4, 5, 6, 11, 77, 3],
                local_pos=[0, 1, 2, 0, 0, 1])


@backends
def test_bad_words_golden(backend):
    # Row 0: [7] always; [3, 4, 8]'s prefix is the committed output. Row 1: [4, 5, 1] spans the last
    # committed token and draft 1. Row 2: [5, 6, 2] lies among the drafts; [6, 7] and [7] both ban 7.
    # [9, 3, 4, 5, 0] needs four tokens, row 1 sees three (the prompt's 9 is never seen); [2, 3, 9]'s 2
    # is no output. Row 5: [3, 5] matches draft 3; row 4 sees nothing. Row 3: no bad words.
    x = torch.randn(6, 10)
    a = golden(x.clone())
    want = x.clone()
    for r, cols in enumerate([[7, 8], [1, 7], [2, 7], [], [], [5]]):
        want[r, cols] = -INF
    got = run(backend, contract.K41, (6, 7), **a)["logits_ptr"]
    assert torch.equal(got, want)


@backends
def test_a_banned_column_holding_nan_or_minus_inf_becomes_minus_inf(backend):
    x = torch.randn(6, 10)
    x[0, 7], x[2, 2], x[1, 1], x[3, 4] = float("nan"), -INF, INF, float("nan")
    got = run(backend, contract.K41, (6, 7), **golden(x.clone()))["logits_ptr"]
    assert got[0, 7].item() == -INF and got[2, 2].item() == -INF and got[1, 1].item() == -INF
    assert math.isnan(got[3, 4].item())  # row 3 has no bad words: never written


@backends
def test_rows_at_every_local_position_see_the_drafts_before_them(backend):
    # One request, output [1, 2], drafts 3, 4, 5 at local positions 1..3 (rows 1..3); row 0's input id is
    # the last committed token 2. Bad word [2, 3, 4, 5, 9] bans 9 only at row 3 (position 3 sees all three
    # drafts), [1, 2, 8] only at row 0, [2, 3, 4, 6] only at row 2, [9, 1, 2, 3, 7] nowhere (its prefix of
    # four is one longer than row 1 sees; rows 2 and 3 end otherwise).
    words = [[[2, 3, 4, 5, 9], [1, 2, 8], [2, 3, 4, 6], [9, 1, 2, 3, 7]]]
    a = args(torch.zeros(4, 12), [0, 0, 0, 0], words, [[5, 1, 2]], prompt=[1], total=[3], input_ids=[2, 3, 4, 5],
             local_pos=[0, 1, 2, 3])
    assert banned(backend, a, (4, 4)) == [[8], [], [6], [9]]


@backends
def test_the_rows_of_a_chunk_start_at_a_request(backend):
    # Two requests: rows 0-1 (state 1, output [6], draft 7), rows 2-4 (state 0, output [], drafts 7, 6).
    # [6, 7, 3] bans at state 1's row 1 (it sees [6, 7]); [7, 6, 4] at state 0's row 4 (sees [7, 6]);
    # state 0's row 3 sees [7], not state 1's rows before it ([6, 7, 5] stays); [1, 2]'s 1 is a prompt token.
    words = [[[7, 6, 4], [6, 7, 5]], [[6, 7, 3], [1, 2]]]
    a = args(torch.zeros(5, 8), [1, 1, 0, 0, 0], words, [[1, 1], [1, 6]], prompt=[2, 1], total=[2, 2],
             input_ids=[6, 7, 1, 7, 6], local_pos=[0, 1, 0, 1, 2])
    assert banned(backend, a, (5, 2)) == [[], [3], [], [], [4]]


@ours
def test_vllm_launch_form(backend):
    # BadWordsState's tables (VLLM_MAX_BAD_WORDS_TOTAL_TOKENS = 1024 columns, VLLM_MAX_NUM_BAD_WORDS + 1
    # = 129 offsets), all_token_ids [max_num_reqs, max_model_len], the grid (num_tokens, the batch's
    # largest count), int32 throughout, the non-speculative sampler's rows (one per request, position 0).
    v = 1000
    words = [[[17], [5, 999]], [], [[1, 2, 3]]]
    a = args(torch.randn(3, v), [2, 0, 1], words, [[0, 5], [4], [7, 1, 2]], prompt=[1, 1, 1], total=[2, 1, 3],
             input_ids=[2, 5, 4], local_pos=[0, 0, 0], width=1024, most=128)
    assert a["bad_word_offsets_ptr"].shape == (3, 129) and a["bad_word_token_ids_ptr"].shape == (3, 1024)
    # Row 0 (state 2) sees [1, 2]: [1, 2, 3] bans 3. Row 1 (state 0) sees [5]: [17] and [5, 999].
    assert banned(backend, a, contract.grid(a)) == [[3], [17, 999], []]
    assert contract.grid(a) == (3, 2)


def _args() -> dict:
    return args(torch.zeros(2, 10), [0, 1], [[[3], [4, 5]], [[6]]], [[1, 4], [2]], prompt=[1, 0], total=[2, 1],
                input_ids=[4, 2], local_pos=[0, 0])


def _with(**change) -> dict:
    return _args() | change


@ours
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(expanded_idx_mapping_ptr=i32([0, 2])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(expanded_idx_mapping_ptr=i32([-1, 0])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(expanded_idx_mapping_ptr=i32([0])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(expanded_local_pos_ptr=i32([0, 2])), ValueError, "expanded_local_pos_ptr"),
        (dict(expanded_local_pos_ptr=i32([-1, 0])), ValueError, "expanded_local_pos_ptr"),
        (dict(input_ids_ptr=i32([4])), ValueError, "input_ids_ptr"),
        (dict(num_bad_words_ptr=i32([9, 1])), ValueError, "num_bad_words_ptr"),
        (dict(num_bad_words_ptr=i32([-1, 1])), ValueError, "num_bad_words_ptr"),
        (dict(prompt_len_ptr=i32([3, 0])), ValueError, "total_len_ptr"),
        (dict(total_len_ptr=i32([2, 6])), ValueError, "total_len_ptr"),
        (dict(prompt_len_ptr=i32([1])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(logits_stride=4), ValueError, "logits_stride"),
        (dict(all_token_ids_stride=3), ValueError, "all_token_ids_stride"),
        (dict(bad_word_offsets_stride=1), ValueError, "bad_word_offsets_stride"),
        (dict(logits_ptr=torch.zeros(2, 10, dtype=torch.float64)), TypeError, "logits_ptr"),
        (dict(input_ids_ptr=torch.zeros(2)), TypeError, "input_ids_ptr"),
    ],
)
def test_invalid(backend, change, error, param):
    refused(backend, contract.K41, _args() | change, error, param)


@ours
def test_bad_words_must_hold_a_token_and_ban_a_column(backend):
    a = _args()
    a["bad_word_offsets_ptr"][0, 1] = 0  # bad word 0 empty: it has no token to ban (vLLM would read its predecessor's)
    refused(backend, contract.K41, a, ValueError, "bad_word_offsets_ptr")
    a = _args()
    a["bad_word_offsets_ptr"][0, 2] = 33  # past the 32-token table
    refused(backend, contract.K41, a, ValueError, "bad_word_offsets_ptr")
    for token in (10, -1):  # the banned token must be a column of the 10
        a = _args()
        a["bad_word_token_ids_ptr"][1, 0] = token
        refused(backend, contract.K41, a, ValueError, "bad_word_token_ids_ptr")
    # A prefix token is only compared: any value, as the drafts' placeholder -1.
    a = _args()
    a["bad_word_token_ids_ptr"][0, 1] = -1
    a["input_ids_ptr"][1] = -1
    run(backend, contract.K41, contract.grid(a), **a)


@ours
def test_what_a_row_without_bad_words_never_reads_is_not_checked(backend):
    # State 1 has no bad words: its lengths and offsets are never read, whatever they hold.
    a = _args()
    a["num_bad_words_ptr"][1] = 0
    a["prompt_len_ptr"][1], a["total_len_ptr"][1] = 7, -3
    a["bad_word_offsets_ptr"][1, :3] = torch.tensor([5, 2, -9], dtype=torch.int32)
    got = run(backend, contract.K41, contract.grid(a), **a)["logits_ptr"]
    assert (got[1] == 0).all() and got[0, 3].item() == -INF
