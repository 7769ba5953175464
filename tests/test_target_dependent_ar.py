"""Model Runner V2's EAGLE/MTP drafter (K29-K31): the drafter's prefill over the batch of
tests/test_input_batch.py (a decode row with one draft rejected, a chunked prefill, a last prefill
chunk), its first decode step with and without advancing positions and at max_model_len, a
draft step and the last one, and invalid input on the validating backends."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support import BACKENDS, i32, i64, refused, run

from contracts import target_dependent_ar as contract

P = -9
backends = pytest.mark.parametrize("backend", BACKENDS)
ours = pytest.mark.parametrize("backend", ["reference", "cpu"])
SPECS = {s.name: s for s in contract.SPECS}


def launch(backend: str, kernel: str, **args: Any) -> dict[str, Any]:
    return run(backend, kernel, SPECS[kernel].grid(args), **args)


def prefill_args(**change: Any) -> dict[str, Any]:
    return dict(last_token_indices_ptr=i64([P] * 6), draft_current_step_ptr=torch.tensor(3), draft_input_ids_ptr=i32([P] * 9),
                draft_positions_ptr=i64([P] * 9), draft_query_start_loc_ptr=i32([P] * 7), draft_seq_lens_ptr=i32([P] * 6),
                target_input_ids_ptr=i32([53, 1030, 1031, 2, 3, 4, 5, 403, 404]),
                target_positions_ptr=i64([10, 11, 12, 2, 3, 4, 5, 3, 4]), idx_mapping_ptr=i64([3, 0, 4]),
                last_sampled_ptr=i64([[50], [51], [52], [9], [5]]), next_prefill_tokens_ptr=i32([[6, P, P, P, 0], [7, P, P, P, 0]]),
                num_sampled_ptr=i32([2, 0, 1]), num_rejected_ptr=i32([1, 0, 0]), query_start_loc_ptr=i32([0, 3, 7, 9]),
                seq_lens_ptr=i32([13, 6, 5]), max_num_reqs=5, BLOCK_SIZE=1024) | change


@backends
@pytest.mark.parametrize("tile", [1024, 2])
def test_the_drafter_prefill_shifts_the_query_and_appends_the_next_token(backend, tile):
    a = launch(backend, contract.K29, **prefill_args(BLOCK_SIZE=tile))
    # Row 0 keeps 2 of its 3 tokens (one draft rejected) and continues from state 3's last sampled
    # token 9; row 1 (chunked) from state 0's next prompt token 6; row 2 from state 4's token 5.
    # Token 2, the rejected one, is not the drafter's.
    assert a["draft_input_ids_ptr"].tolist() == [1030, 9, P, 3, 4, 5, 6, 404, 5]
    assert a["draft_positions_ptr"].tolist() == [10, 11, P, 2, 3, 4, 5, 3, 4]
    assert a["last_token_indices_ptr"].tolist() == [1, 6, 8, 0, 0, P]
    # Rows 3 and 4 pad to max_num_reqs = 5: offsets at the last query's end, lengths 0.
    assert a["draft_query_start_loc_ptr"].tolist() == [0, 3, 7, 9, 9, 9, P]
    assert a["draft_seq_lens_ptr"].tolist() == [13, 6, 5, 0, 0, P]
    assert a["draft_current_step_ptr"].item() == 0


@backends
def test_the_last_sampled_token_is_narrowed_to_int32(backend):
    a = launch(backend, contract.K29, **prefill_args(last_sampled_ptr=i64([[50], [51], [52], [2**32 + 9], [5]])))
    assert a["draft_input_ids_ptr"][1].item() == 9


def decode_args(**change: Any) -> dict[str, Any]:
    table = i64([[21, 22], [23, 24], [25, 26]])
    return dict(draft_tokens_ptr=table[:, 0], draft_tokens_stride=table.stride(0), target_seq_lens_ptr=i32([13, 6, 5]),
                num_rejected_ptr=i32([1, 0, 0]), input_ids_ptr=i32([P] * 4), positions_ptr=i64([11, 5, 4, P]),
                sample_src_positions_ptr=i64([12, 6, 5, P]), query_start_loc_ptr=i32([P] * 7), seq_lens_ptr=i32([P] * 6),
                max_model_len=4096, max_num_reqs=5, BLOCK_SIZE=1024, ADVANCE_DRAFT_POSITIONS=True) | change


@backends
@pytest.mark.parametrize("advance, max_model_len, positions, seq_lens", [
    (True, 4096, [12, 6, 5], [13, 7, 6]),
    (True, 12, [11, 6, 5], [12, 7, 6]),  # row 0 reaches max_model_len: clamped
    (False, 4096, [11, 5, 4], [12, 6, 5]),  # positions held (Gemma4 MTP)
])
def test_the_first_decode_step_feeds_the_first_draft(backend, advance, max_model_len, positions, seq_lens):
    a = launch(backend, contract.K30, **decode_args(ADVANCE_DRAFT_POSITIONS=advance, max_model_len=max_model_len))
    assert a["input_ids_ptr"].tolist() == [21, 23, 25, P]
    assert a["sample_src_positions_ptr"].tolist() == [13, 7, 6, P]
    assert a["positions_ptr"].tolist() == positions + [P]
    assert a["seq_lens_ptr"].tolist() == seq_lens + [0, 0, P]
    assert a["query_start_loc_ptr"].tolist() == [0, 1, 2, 3, 3, 3, P]


def update_args(step: int, **change: Any) -> dict[str, Any]:
    hidden = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    following = torch.full((3, 4), float("nan"), dtype=torch.bfloat16)
    out = torch.zeros((5, 3), dtype=torch.int64)
    return dict(output_draft_tokens_ptr=out, output_draft_tokens_stride=out.stride(0), next_input_hidden_states_ptr=following,
                next_input_hidden_states_stride=4, input_ids_ptr=i32([P] * 3), positions_ptr=i64([12, 6, 5]),
                sample_src_positions_ptr=i64([13, 7, 6]), seq_lens_ptr=i32([13, 7, 6]), draft_tokens_ptr=i64([31, 33, 35]),
                current_draft_step_ptr=torch.tensor(step), hidden_states_ptr=hidden, hidden_states_stride=4, hidden_size=4,
                max_model_len=4096, num_speculative_steps=3, BLOCK_SIZE=1024, ADVANCE_DRAFT_POSITIONS=True) | change


@backends
def test_a_draft_step_records_its_token_and_feeds_it_with_its_hidden_state(backend):
    a = launch(backend, contract.K31, **update_args(1))
    assert a["output_draft_tokens_ptr"][:, 1].tolist() == [31, 33, 35, 0, 0]
    assert a["input_ids_ptr"].tolist() == [31, 33, 35]
    assert torch.equal(a["next_input_hidden_states_ptr"], a["hidden_states_ptr"])
    assert a["positions_ptr"].tolist() == [13, 7, 6] and a["seq_lens_ptr"].tolist() == [14, 8, 7]
    assert a["sample_src_positions_ptr"].tolist() == [14, 8, 7]


@backends
def test_the_last_draft_step_only_records_its_token(backend):
    a = launch(backend, contract.K31, **update_args(2))
    assert a["output_draft_tokens_ptr"][:, 2].tolist() == [31, 33, 35, 0, 0]
    assert a["input_ids_ptr"].tolist() == [P, P, P]
    assert a["next_input_hidden_states_ptr"].isnan().all()
    assert a["positions_ptr"].tolist() == [12, 6, 5] and a["sample_src_positions_ptr"].tolist() == [13, 7, 6]


INVALID = [
    (contract.K29, lambda: prefill_args(num_rejected_ptr=i32([3, 0, 0])), "num_rejected_ptr"),  # nothing left of row 0
    (contract.K29, lambda: prefill_args(idx_mapping_ptr=i64([3, 0, 5])), "idx_mapping_ptr"),
    (contract.K29, lambda: prefill_args(draft_query_start_loc_ptr=i32([P] * 5)), "draft_query_start_loc_ptr"),  # 6 needed
    (contract.K29, lambda: prefill_args(target_input_ids_ptr=i32([0] * 8)), "target_input_ids_ptr"),
    (contract.K30, lambda: decode_args(query_start_loc_ptr=i32([P] * 5)), "query_start_loc_ptr"),
    (contract.K30, lambda: decode_args(max_model_len=0), "max_model_len"),
    (contract.K30, lambda: decode_args(positions_ptr=i64([2**31 - 1, 5, 4])), "positions_ptr"),
    (contract.K30, lambda: decode_args(draft_tokens_stride=3), "draft_tokens_ptr"),  # row 2 at flat 6 of 6
    (contract.K31, lambda: update_args(1, current_draft_step_ptr=torch.tensor(9)), "output_draft_tokens_ptr"),  # row 2 at flat 15 of 15
    (contract.K31, lambda: update_args(1, current_draft_step_ptr=torch.tensor(-1)), "current_draft_step_ptr"),
    (contract.K31, lambda: update_args(1, hidden_size=5), "hidden_states_ptr"),
    (contract.K31, lambda: update_args(1, next_input_hidden_states_ptr=torch.zeros((3, 4))), "next_input_hidden_states_ptr"),
]


@ours
@pytest.mark.parametrize("kernel, args, param", INVALID, ids=[f"{k}-{p}-{i}" for i, (k, _, p) in enumerate(INVALID)])
def test_invalid(backend, kernel, args, param):
    refused(backend, kernel, args(), ValueError, param)
