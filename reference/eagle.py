"""The PyTorch oracle of the EAGLE input-preparation kernels: the readable specification.

Each function has the vLLM kernel's name, parameters and order, runs on CPU tensors and
writes the caller's buffers in place, in their own dtype. Semantics follow docs/spec.md §2.5–§2.8
and the contract decisions C19–C21 and C24. Values are computed in int64 (every offset and
product exact, C4) and narrowed only by the store into the caller's buffer.
"""

from __future__ import annotations

import torch

from contracts._checks import flat_view
from contracts.spec import counts

I64 = torch.int64


def eagle_step_slot_mapping_metadata_kernel(
    positions_ptr: torch.Tensor,
    block_table_ptr: torch.Tensor,
    block_table_stride: int,
    seq_lens_ptr: torch.Tensor,
    out_clamped_positions_ptr: torch.Tensor,
    out_slot_mapping_ptr: torch.Tensor,
    block_size: int,
    max_model_len: int,
    n_blocks_per_req: int,
    PAD_ID: int,
    batch_size: int,
) -> None:
    b = batch_size
    # Every position is read before anything is written: positions may alias
    # out_clamped_positions (C21).
    position = positions_ptr[:b].to(I64)
    # position + 1 >= max_model_len neutralises the request: position 0, slot PAD_ID, seq_len 1.
    over = position >= max_model_len - 1
    new_position = torch.where(over, 0, position + 1)
    # The block column is clamped to the table's width: a wrong but in-range slot (C21).
    column = torch.clamp(new_position // block_size, max=n_blocks_per_req - 1)
    block_id = flat_view(block_table_ptr)[torch.arange(b) * block_table_stride + column].to(I64)
    slot = block_id * block_size + new_position % block_size
    seq_len = torch.where(over, 1, seq_lens_ptr[:b].to(I64) + 1)

    out_slot_mapping_ptr[:b] = torch.where(over, PAD_ID, slot)
    out_slot_mapping_ptr[b:] = PAD_ID  # cudagraph padding rows: only the slot mapping is written
    out_clamped_positions_ptr[:b] = new_position
    seq_lens_ptr[:b] = torch.clamp(seq_len, max=max_model_len)


def eagle_prepare_inputs_padded_kernel(
    cu_num_draft_tokens_ptr: torch.Tensor,
    valid_sampled_tokens_count_ptr: torch.Tensor,
    query_start_loc_gpu_ptr: torch.Tensor,
    token_indices_to_sample_ptr: torch.Tensor,
    num_rejected_tokens_gpu_ptr: torch.Tensor,
    num_reqs: int,
) -> None:
    n = num_reqs
    num_drafts = counts(cu_num_draft_tokens_ptr[:n])  # cu is inclusive; cu[-1] is never read (C1)
    valid = valid_sampled_tokens_count_ptr[:n].to(I64)
    # No drafts, no rejections; otherwise nd + 1 - valid, unclamped even if negative (C19).
    rejected = torch.where(num_drafts > 0, num_drafts + 1 - valid, 0)
    last_token = query_start_loc_gpu_ptr[1 : n + 1].to(I64) - 1
    token_indices_to_sample_ptr[:n] = last_token - rejected
    num_rejected_tokens_gpu_ptr[:n] = rejected


def eagle_prepare_next_token_padded_kernel(
    sampled_token_ids_ptr: torch.Tensor,
    discard_request_mask_ptr: torch.Tensor,
    backup_next_token_ids_ptr: torch.Tensor,
    next_token_ids_ptr: torch.Tensor,
    valid_sampled_tokens_count_ptr: torch.Tensor,
    vocab_size: int,
    num_sampled_tokens_per_req: int,
    num_reqs: int,
    stride_sampled_token_ids: int,
    BLOCK_SIZE_TOKENS: int,
) -> None:
    # BLOCK_SIZE_TOKENS only tiles the Triton kernel's row; it is >= W, so the whole row counts.
    sampled = flat_view(sampled_token_ids_ptr).tolist()
    discard = discard_request_mask_ptr.tolist()
    backup = backup_next_token_ids_ptr.tolist()
    next_token, count = [], []
    for r in range(num_reqs):
        if discard[r]:
            # The backup token and a count of 0; the sampled row is not read (C20).
            next_token.append(backup[r])
            count.append(0)
            continue
        start = r * stride_sampled_token_ids  # one slice of W: linear in the batch
        row = sampled[start : start + num_sampled_tokens_per_req] if num_sampled_tokens_per_req else []
        # Validity is element-wise, not a prefix: -2 is valid, a -1 in the middle ends nothing (C20).
        valid = [x for x in row if x != -1 and x < vocab_size]
        next_token.append(valid[-1] if valid else backup[r])
        count.append(len(valid))
    next_token_ids_ptr[:num_reqs] = torch.tensor(next_token, dtype=I64)
    valid_sampled_tokens_count_ptr[:num_reqs] = torch.tensor(count, dtype=I64)


def copy_and_expand_eagle_inputs_kernel(
    target_token_ids_ptr: torch.Tensor,
    target_positions_ptr: torch.Tensor,
    next_token_ids_ptr: torch.Tensor,
    out_input_ids_ptr: torch.Tensor,
    out_positions_ptr: torch.Tensor,
    out_is_rejected_token_mask_ptr: torch.Tensor,
    out_is_masked_token_mask_ptr: torch.Tensor,
    out_new_token_indices_ptr: torch.Tensor,
    out_hidden_state_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    query_end_loc_ptr: torch.Tensor,
    padding_token_id: int,
    parallel_drafting_token_id: int,
    total_input_tokens: int,
    num_padding_slots_per_request: int,
    shift_input_ids: bool,
    BLOCK_SIZE_TOKENS: int,
) -> None:
    # total_input_tokens only bounds the Triton kernel's masked reads; BLOCK_SIZE_TOKENS tiles them.
    P = num_padding_slots_per_request
    query_end = query_end_loc_ptr.tolist()
    query_start = query_start_loc_ptr[: len(query_end) + 1].tolist()
    next_token = next_token_ids_ptr.tolist()

    for r, qe in enumerate(query_end):
        qs, qn = query_start[r], query_start[r + 1]
        if shift_input_ids:  # EAGLE: the ids move left by one, the bonus fills the gap
            nv, off, o0 = qe - qs, 1, qs + r * (P - 1)
        else:
            nv, off, o0 = qe - qs + 1, 0, qs + r * P
        nrej = qn - qe - 1
        total = nv + P + nrej  # = qn - qs + net_new: consecutive requests tile the output
        j = torch.arange(total)
        # Regions of output slot j: valid [0, nv), bonus nv, parallel (nv, nv + P), rejected [nv + P, total).
        ids = torch.cat(
            [
                target_token_ids_ptr[qs + off : qs + off + nv].to(I64),
                torch.tensor([next_token[r]], dtype=I64),
                torch.full((P - 1,), parallel_drafting_token_id, dtype=I64),
                torch.full((nrej,), padding_token_id, dtype=I64),
            ]
        )
        rejected = j >= nv + P
        # Positions are never shifted; rejected slots get position 0 (C24).
        positions = torch.where(rejected, 0, int(target_positions_ptr[qs]) + j)
        out = slice(o0, o0 + total)
        out_input_ids_ptr[out] = ids
        out_positions_ptr[out] = positions
        out_is_rejected_token_mask_ptr[out] = rejected
        out_is_masked_token_mask_ptr[out] = (j > nv) & ~rejected
        # The drafter samples at the bonus slot and the parallel slots.
        out_new_token_indices_ptr[r * P : (r + 1) * P] = o0 + nv + torch.arange(P)
        if shift_input_ids:
            # Every input token, rejected ones included, maps to its output slot (C24).
            out_hidden_state_mapping_ptr[qs:qn] = o0 + torch.arange(qn - qs)
