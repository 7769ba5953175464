"""Model Runner V2's batch state (K22-K28): one step of a three-request batch worked by hand on
every backend (a decode row verifying two drafts, a chunked prefill, a last prefill chunk), the
rows that cross the prompt's end or are skipped, and invalid input on the validating backends."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support import BACKENDS, i32, i64, refused, run

from contracts import input_batch as contract

P = -9  # poison: a cell no kernel writes keeps it
backends = pytest.mark.parametrize("backend", BACKENDS)
ours = pytest.mark.parametrize("backend", ["reference", "cpu"])

# The batch: row 0 is request state 3 (decoding, two drafts), row 1 state 0 (a chunked prefill),
# row 2 state 4 (its last prefill chunk). States 1 and 2 are not in the batch.
IDX, QSL, CU = [3, 0, 4], [0, 3, 7, 9], [0, 3, 4, 5]
PREFILL = [8, 99, 99, 4, 5]
COMPUTED = [2, 77, 77, 10, 3]


def launch(backend: str, kernel: str, **args: Any) -> dict[str, Any]:
    spec = contract.PREPARE_PREFILL_INPUTS if kernel == contract.K22 else next(s for s in contract.SPECS if s.name == kernel)
    return run(backend, kernel, spec.grid(args), **args)


def prefill_args(lookahead: int = 2) -> dict[str, Any]:
    tokens = torch.tensor([[100 * s + j for j in range(12)] for s in range(5)], dtype=torch.int32)
    nxt = torch.full((lookahead, 5), P, dtype=torch.int32)
    return dict(input_ids_ptr=torch.full((9,), P, dtype=torch.int32), next_prefill_tokens_ptr=nxt,
                next_prefill_tokens_stride=nxt.stride(0), num_lookahead=lookahead, idx_mapping_ptr=i64(IDX),
                query_start_loc_ptr=i32(QSL), all_token_ids_ptr=tokens, all_token_ids_stride=tokens.stride(0),
                prefill_lens_ptr=i32(PREFILL), num_computed_tokens_ptr=i32(COMPUTED), BLOCK_SIZE=1024,
                LOOKAHEAD_BLOCK=max(1, 1 << (lookahead - 1).bit_length()))


@backends
@pytest.mark.parametrize("tile", [1024, 2])
def test_prefill_rows_copy_their_prompt_and_the_lookahead(backend, tile):
    a = launch(backend, contract.K22, **(prefill_args() | {"BLOCK_SIZE": tile}))
    # Row 1 (state 0) copies prompt tokens [2, 6); row 2 (state 4) [3, 5). The decode row writes nothing.
    assert a["input_ids_ptr"].tolist() == [P, P, P, 2, 3, 4, 5, 403, 404]
    # State 0's next two prompt tokens are 6 and 7; state 4's run past prefill_len = 5: zeros.
    assert a["next_prefill_tokens_ptr"].tolist() == [[6, P, P, P, 0], [7, P, P, P, 0]]


def pos_args(max_num_reqs: int = 5) -> dict[str, Any]:
    return dict(pos_ptr=torch.full((10,), P, dtype=torch.int64), seq_lens_ptr=torch.full((6,), P, dtype=torch.int32),
                idx_mapping_ptr=i64(IDX), query_start_loc_ptr=i32(QSL), num_computed_tokens_ptr=i32(COMPUTED),
                max_num_reqs=max_num_reqs, BLOCK_SIZE=1024)


@backends
def test_positions_continue_from_the_computed_tokens_and_padded_rows_are_empty(backend):
    a = launch(backend, contract.K23, **pos_args())
    assert a["pos_ptr"].tolist() == [10, 11, 12, 2, 3, 4, 5, 3, 4, P]
    # Rows 3 and 4 pad the batch to max_num_reqs = 5 for full CUDA graphs; the sixth is past it.
    assert a["seq_lens_ptr"].tolist() == [13, 6, 5, 0, 0, P]


def combine_args(input_ids: list[int], **change: Any) -> dict[str, Any]:
    drafts = torch.tensor([[1000 + 10 * s, 1001 + 10 * s] for s in range(5)], dtype=torch.int64)
    return dict(input_ids_ptr=i32(input_ids), idx_mapping_ptr=i64(IDX), last_sampled_tokens_ptr=i64([[50], [51], [52], [53], [54]]),
                query_start_loc_ptr=i32(QSL), seq_lens_ptr=i32([13, 6, 5]), prefill_len_ptr=i32(PREFILL),
                draft_tokens_ptr=drafts, draft_tokens_stride=drafts.stride(0), cu_num_logits_ptr=i32(CU),
                logits_indices_ptr=torch.full((6,), P, dtype=torch.int64), BLOCK_SIZE=4, NUM_NEW_SAMPLED_TOKENS=1) | change


@backends
def test_the_last_sampled_token_and_the_drafts_enter_the_decode_rows_only(backend):
    a = launch(backend, contract.K24, **combine_args([P, P, P, 2, 3, 4, 5, 403, 404]))
    # Row 0: the last sampled token of state 3, then its two drafts; the prefill rows keep their prompt.
    assert a["input_ids_ptr"].tolist() == [53, 1030, 1031, 2, 3, 4, 5, 403, 404]
    # Each row's logits are its query's last rows.
    assert a["logits_indices_ptr"].tolist() == [0, 1, 2, 6, 8, P]


@backends
def test_a_query_that_crosses_the_prompts_end_keeps_its_prompt_token(backend):
    # One row: prefill_len 10, 8 computed, 4 query tokens (two prompt tokens, two drafts): seq_len 12.
    # Its three logits rows start at sequence position 9, inside the prompt: only the drafts are written.
    a = combine_args([7, 7, 7, 7], idx_mapping_ptr=i64([0]), query_start_loc_ptr=i32([0, 4]), seq_lens_ptr=i32([12]),
                     prefill_len_ptr=i32([10]), cu_num_logits_ptr=i32([0, 3]))
    launch(backend, contract.K24, **a)
    assert a["input_ids_ptr"].tolist() == [7, 7, 1000, 1001]
    assert a["logits_indices_ptr"].tolist() == [1, 2, 3, P, P, P]


@backends
def test_without_a_bonus_token_every_logits_row_is_a_draft(backend):
    a = combine_args([P, P, P], idx_mapping_ptr=i64([3]), query_start_loc_ptr=i32([0, 3]), seq_lens_ptr=i32([13]),
                     cu_num_logits_ptr=i32([0, 2]), NUM_NEW_SAMPLED_TOKENS=0)
    launch(backend, contract.K24, **a)
    assert a["input_ids_ptr"].tolist() == [P, 1030, 1031]
    assert a["logits_indices_ptr"].tolist()[:2] == [1, 2]


@backends
def test_chunked_prefills_emit_and_reject_nothing(backend):
    a = launch(backend, contract.K25, num_sampled_ptr=i32([2, 1, 1]), num_rejected_ptr=i32([P, P, P, P]),
               seq_lens_ptr=i32([13, 6, 5]), cu_num_logits_ptr=i32(CU), idx_mapping_ptr=i64(IDX), prefill_len_ptr=i32(PREFILL))
    # Row 1 is still prefilling (6 < 8); row 2 ends its prompt (5 == 5) and keeps its sampled token.
    assert a["num_sampled_ptr"].tolist() == [2, 0, 1]
    assert a["num_rejected_ptr"].tolist() == [1, 0, 0, P]


def post_args(**change: Any) -> dict[str, Any]:
    sampled = i64([[7, 9, P], [P, P, P], [5, P, P], [6, P, P]])
    history = torch.zeros((5, 16), dtype=torch.int32)
    bins = torch.zeros((5, 10), dtype=torch.int32)
    return dict(idx_mapping_ptr=i64([3, 0, 4, -1]), num_computed_tokens_ptr=i32(COMPUTED),
                last_sampled_tokens_ptr=i64([[50], [51], [52], [53], [54]]), output_bin_counts_ptr=bins,
                output_bin_counts_stride=bins.stride(0), sampled_tokens_ptr=sampled, sampled_tokens_stride=sampled.stride(0),
                num_sampled_ptr=i32([2, 0, 1, 1]), num_rejected_ptr=i32([1, 0, 0, 0]), query_start_loc_ptr=i32(QSL + [10]),
                all_token_ids_ptr=history, all_token_ids_stride=history.stride(0), total_len_ptr=i32([8, 30, 30, 11, 5]),
                draft_tokens_ptr=i64([[21, 22], [23, 24], [25, 26], [27, 28]]),
                draft_tokens_out_ptr=torch.zeros((5, 2), dtype=torch.int64), num_draft_tokens=2) | change


@backends
def test_the_step_is_committed_to_each_request_state_and_skipped_rows_change_nothing(backend):
    a = launch(backend, contract.K26, **post_args())
    # State 3 emitted 7 and 9 (one draft rejected): appended at 11, 12; 3 query tokens - 1 rejected computed.
    # State 4 emitted 5 at 5. State 0 (chunked) emitted nothing but computed its 4 tokens. Row 3 is skipped.
    assert a["num_computed_tokens_ptr"].tolist() == [6, 77, 77, 12, 5]
    assert a["total_len_ptr"].tolist() == [8, 30, 30, 13, 6]
    assert a["last_sampled_tokens_ptr"].flatten().tolist() == [50, 51, 52, 9, 5]
    history = a["all_token_ids_ptr"]
    assert history[3, 11:13].tolist() == [7, 9] and history[4, 5].item() == 5
    assert int(history.count_nonzero()) == 3
    bins = a["output_bin_counts_ptr"]
    assert bins[3].tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 0, 1] and bins[4, 5].item() == 1 and int(bins.sum()) == 3
    # Drafts received by row b go to its request state's row; the skipped row's do not.
    assert a["draft_tokens_out_ptr"].tolist() == [[23, 24], [0, 0], [0, 0], [21, 22], [25, 26]]


@backends
def test_a_token_emitted_twice_is_counted_twice(backend):
    a = launch(backend, contract.K26, **post_args(sampled_tokens_ptr=i64([[7, 7, P], [P, P, P], [5, P, P], [6, P, P]])))
    assert a["output_bin_counts_ptr"][3, 7].item() == 2


@backends
def test_without_optional_tensors_only_the_rejected_roll_back(backend):
    a = launch(backend, contract.K26, **post_args(output_bin_counts_ptr=None, output_bin_counts_stride=0, query_start_loc_ptr=None,
                                                  draft_tokens_ptr=None, draft_tokens_out_ptr=None, num_draft_tokens=0))
    # Without query offsets a query counts as empty: state 3 loses its one rejected token.
    assert a["num_computed_tokens_ptr"].tolist() == [2, 77, 77, 9, 3]
    assert a["total_len_ptr"].tolist() == [8, 30, 30, 13, 6]


@backends
def test_computed_tokens_advance_by_the_query(backend):
    a = launch(backend, contract.K27, idx_mapping_ptr=i64(IDX), num_computed_tokens_ptr=i32(COMPUTED), query_start_loc_ptr=i32(QSL))
    assert a["num_computed_tokens_ptr"].tolist() == [6, 77, 77, 13, 5]


@backends
def test_each_logits_row_gets_its_request_state_and_place(backend):
    a = launch(backend, contract.K28, idx_mapping_ptr=i64(IDX), expanded_idx_mapping_ptr=i64([P] * 6),
               expanded_local_pos_ptr=i32([P] * 6), cu_num_logits_ptr=i32(CU), BLOCK_SIZE=4)
    assert a["expanded_idx_mapping_ptr"].tolist() == [3, 3, 3, 0, 4, P]
    assert a["expanded_local_pos_ptr"].tolist() == [0, 1, 2, 0, 0, P]


def test_the_shared_name_is_told_apart_by_its_module():
    import contracts

    # Model Runner V2's batch state and its EAGLE/MTP drafter each have a _prepare_prefill_inputs_kernel.
    with pytest.raises(KeyError, match="ambiguous: give one of input_batch._prepare_prefill_inputs_kernel, "
                                      "target_dependent_ar._prepare_prefill_inputs_kernel"):
        contracts.get("_prepare_prefill_inputs_kernel")
    assert contracts.get(contract.K22).function == "_prepare_prefill_inputs_kernel"
    assert contract.PREPARE_PREFILL_INPUTS.qualname == "vllm.v1.worker.gpu.input_batch._prepare_prefill_inputs_kernel"
    assert contracts.get("_post_update_kernel") is contract.POST_UPDATE  # a unique name may be given bare


# -- invalid input: the validating backends refuse it, naming the argument, writing nothing --------
INVALID = [
    (contract.K22, lambda: prefill_args() | dict(idx_mapping_ptr=i64([3, 0, 3])), "idx_mapping_ptr"),  # one state twice
    (contract.K22, lambda: prefill_args() | dict(idx_mapping_ptr=i64([3, 0, 5])), "idx_mapping_ptr"),  # past the states
    # State 4 reads flat [19, 21) of 20 (a read past a row's end is the next row's, as in the engine).
    (contract.K22, lambda: prefill_args() | dict(all_token_ids_ptr=torch.zeros((5, 4), dtype=torch.int32),
                                                 all_token_ids_stride=4), "all_token_ids_ptr"),
    (contract.K22, lambda: prefill_args(3) | dict(LOOKAHEAD_BLOCK=2), "num_lookahead"),
    (contract.K23, lambda: pos_args() | dict(seq_lens_ptr=i32([P] * 4)), "seq_lens_ptr"),
    (contract.K23, lambda: pos_args() | dict(num_computed_tokens_ptr=i32([2, 0, 0, 2**31 - 2, 3])), "num_computed_tokens_ptr"),
    (contract.K24, lambda: combine_args([0] * 9, cu_num_logits_ptr=i32([0, 4, 5, 6])), "cu_num_logits_ptr"),  # 4 logits, 3 tokens
    (contract.K24, lambda: combine_args([0] * 9, BLOCK_SIZE=2), "cu_num_logits_ptr"),
    (contract.K24, lambda: combine_args([0] * 9, NUM_NEW_SAMPLED_TOKENS=2), "NUM_NEW_SAMPLED_TOKENS"),
    (contract.K25, lambda: dict(num_sampled_ptr=i32([4, 1, 1]), num_rejected_ptr=i32([0, 0, 0]), seq_lens_ptr=i32([13, 6, 5]),
                                cu_num_logits_ptr=i32(CU), idx_mapping_ptr=i64(IDX), prefill_len_ptr=i32(PREFILL)), "num_sampled_ptr"),
    # Row 2's 2**31 + 1 logits: its rejected count would not fit int32 (the fuzz found the oracle's
    # store overflowing where the contract had accepted it).
    (contract.K25, lambda: dict(num_sampled_ptr=i32([2, 1, 1]), num_rejected_ptr=i32([0, 0, 0]), seq_lens_ptr=i32([13, 6, 5]),
                                cu_num_logits_ptr=i64([0, 3, 4, 2**31 + 5]), idx_mapping_ptr=i64(IDX), prefill_len_ptr=i32(PREFILL)),
     "cu_num_logits_ptr"),
    (contract.K26, lambda: post_args(idx_mapping_ptr=i64([3, 0, 3, -1])), "idx_mapping_ptr"),
    (contract.K26, lambda: post_args(sampled_tokens_ptr=i64([[7, -2, P], [P, P, P], [5, P, P], [6, P, P]])), "sampled_tokens_ptr"),
    # State 4 (the last row of both) counts token 10 of 10 and appends at column 16 of 16.
    (contract.K26, lambda: post_args(sampled_tokens_ptr=i64([[7, 9, P], [P, P, P], [10, P, P], [6, P, P]])), "output_bin_counts_ptr"),
    (contract.K26, lambda: post_args(total_len_ptr=i32([8, 30, 30, 11, 16])), "all_token_ids_ptr"),
    (contract.K26, lambda: post_args(draft_tokens_out_ptr=None), "draft_tokens_out_ptr"),
    (contract.K27, lambda: dict(idx_mapping_ptr=i64([3, 3]), num_computed_tokens_ptr=i32(COMPUTED), query_start_loc_ptr=i32(QSL)),
     "idx_mapping_ptr"),
    (contract.K28, lambda: dict(idx_mapping_ptr=i64(IDX), expanded_idx_mapping_ptr=i64([0] * 4), expanded_local_pos_ptr=i32([0] * 5),
                                cu_num_logits_ptr=i32(CU), BLOCK_SIZE=4), "expanded_idx_mapping_ptr"),
]


@ours
@pytest.mark.parametrize("kernel, args, param", INVALID, ids=[f"{k}-{p}-{i}" for i, (k, _, p) in enumerate(INVALID)])
def test_invalid(backend, kernel, args, param):
    refused(backend, kernel, args(), ValueError, param)
