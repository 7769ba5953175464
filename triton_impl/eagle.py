"""Triton kernels of the EAGLE input preparation, with vLLM 0.33.0's names, parameters and grids.

Launched as ``kernel[grid](...)``: K5 with ``(input_batch_size,)``, K6 and K7 with
``(num_reqs,)``, K8 with ``(batch_size, num_blocks)`` where ``num_blocks`` token tiles of
``BLOCK_SIZE_TOKENS`` cover the longest request plus its new slots. Every flat offset and slot
product is formed in int64 (C4): loaded values and program ids are widened before they are
multiplied; stores narrow to the caller's dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def eagle_step_slot_mapping_metadata_kernel(
    positions_ptr,  # [batch_size] int64/int32, current positions; may alias out_clamped_positions_ptr
    block_table_ptr,  # [batch_size, n_blocks] int32/int64, rows of stride block_table_stride
    block_table_stride,  # row stride of the block table
    seq_lens_ptr,  # [batch_size] int32/int64, in/out: sequence lengths
    out_clamped_positions_ptr,  # [batch_size] int64/int32, new positions
    out_slot_mapping_ptr,  # [input_batch_size] int64/int32, KV slot per (padded) row
    block_size: tl.constexpr,  # drafter KV-cache block size
    max_model_len: tl.constexpr,  # a new position >= this neutralises the request
    n_blocks_per_req: tl.constexpr,  # block_table.shape[1]: the column clamp bound
    PAD_ID: tl.constexpr,  # slot of padding rows and neutralised requests (-1)
    batch_size,  # real rows; programs past it are cudagraph padding
):
    req_idx = tl.program_id(0)
    if req_idx >= batch_size:
        tl.store(out_slot_mapping_ptr + req_idx, PAD_ID)
        return

    # Read before any write: positions may alias out_clamped_positions (C21).
    position = tl.load(positions_ptr + req_idx).to(tl.int64)
    # position + 1 >= max_model_len, without forming position + 1 for a huge position.
    over = position >= max_model_len - 1
    new_position = tl.where(over, 0, position + 1)
    column = tl.minimum(new_position // block_size, n_blocks_per_req - 1)
    block_id = tl.load(block_table_ptr + req_idx.to(tl.int64) * block_table_stride + column).to(tl.int64)
    slot = block_id * block_size + new_position % block_size
    seq_len = tl.load(seq_lens_ptr + req_idx).to(tl.int64)
    seq_len = tl.minimum(tl.where(over, 1, seq_len + 1), max_model_len)

    tl.store(out_slot_mapping_ptr + req_idx, tl.where(over, PAD_ID, slot))
    tl.store(out_clamped_positions_ptr + req_idx, new_position)
    tl.store(seq_lens_ptr + req_idx, seq_len)


@triton.jit
def eagle_prepare_inputs_padded_kernel(
    cu_num_draft_tokens_ptr,  # [>= num_reqs] int32/int64, inclusive cumulative draft counts
    valid_sampled_tokens_count_ptr,  # [>= num_reqs] int32/int64, accepted + 1 (0 if discarded)
    query_start_loc_gpu_ptr,  # [>= num_reqs + 1] int32/int64, exclusive token offsets
    token_indices_to_sample_ptr,  # [num_reqs] int32/int64, out
    num_rejected_tokens_gpu_ptr,  # [num_reqs] int32/int64, out
    num_reqs,
):
    req_idx = tl.program_id(0)
    if req_idx >= num_reqs:
        return
    end = tl.load(cu_num_draft_tokens_ptr + req_idx).to(tl.int64)
    if req_idx == 0:
        num_drafts = end  # start(0) is 0: cu[-1] is never read (C1)
    else:
        num_drafts = end - tl.load(cu_num_draft_tokens_ptr + req_idx - 1).to(tl.int64)
    valid = tl.load(valid_sampled_tokens_count_ptr + req_idx).to(tl.int64)
    # No drafts, no rejections; otherwise unclamped, even if negative (C19).
    rejected = tl.where(num_drafts > 0, num_drafts + 1 - valid, 0)
    last_token = tl.load(query_start_loc_gpu_ptr + req_idx + 1).to(tl.int64) - 1
    tl.store(token_indices_to_sample_ptr + req_idx, last_token - rejected)
    tl.store(num_rejected_tokens_gpu_ptr + req_idx, rejected)


@triton.jit
def eagle_prepare_next_token_padded_kernel(
    sampled_token_ids_ptr,  # [num_reqs, W] int32/int64, -1 = rejected; rows of stride stride_sampled_token_ids
    discard_request_mask_ptr,  # [>= num_reqs] bool
    backup_next_token_ids_ptr,  # [>= num_reqs] int32/int64, fallback next token
    next_token_ids_ptr,  # [num_reqs] int32/int64, out
    valid_sampled_tokens_count_ptr,  # [num_reqs] int32/int64, out
    vocab_size,
    num_sampled_tokens_per_req,  # W
    num_reqs,
    stride_sampled_token_ids,  # row stride of sampled_token_ids
    BLOCK_SIZE_TOKENS: tl.constexpr,  # a power of two >= W: one tile holds the whole row
):
    req_idx = tl.program_id(0)
    if req_idx >= num_reqs:
        return
    backup = tl.load(backup_next_token_ids_ptr + req_idx)
    if tl.load(discard_request_mask_ptr + req_idx):
        # The backup and a count of 0; the sampled row is not read (C20).
        tl.store(next_token_ids_ptr + req_idx, backup)
        tl.store(valid_sampled_tokens_count_ptr + req_idx, 0)
    else:
        cols = tl.arange(0, BLOCK_SIZE_TOKENS)
        in_row = cols < num_sampled_tokens_per_req
        row = req_idx.to(tl.int64) * stride_sampled_token_ids
        tokens = tl.load(sampled_token_ids_ptr + row + cols, mask=in_row, other=-1)
        # Element-wise validity: -2 is valid, a -1 in the middle ends nothing (C20).
        valid = in_row & (tokens != -1) & (tokens < vocab_size)
        count = tl.sum(valid.to(tl.int32))
        last_col = tl.max(tl.where(valid, cols, -1))
        last_token = tl.sum(tl.where(cols == last_col, tokens, 0))  # the one lane at last_col
        tl.store(next_token_ids_ptr + req_idx, tl.where(count > 0, last_token, backup))
        tl.store(valid_sampled_tokens_count_ptr + req_idx, count)


@triton.jit
def copy_and_expand_eagle_inputs_kernel(
    target_token_ids_ptr,  # [N_in] int32/int64, target input ids (rejected ones included)
    target_positions_ptr,  # [N_in] int64/int32, 1-D target positions
    next_token_ids_ptr,  # [B] int32/int64, bonus token per request
    out_input_ids_ptr,  # [>= N_out] int32/int64, out
    out_positions_ptr,  # [>= N_out] int64/int32, out
    out_is_rejected_token_mask_ptr,  # [>= N_out] bool, out
    out_is_masked_token_mask_ptr,  # [>= N_out] bool, out: parallel-drafting slots
    out_new_token_indices_ptr,  # [B * P] int32/int64, out: where the drafter samples
    out_hidden_state_mapping_ptr,  # [N_in] int32/int64, out: written only when shifting
    query_start_loc_ptr,  # [B + 1] int32/int64, exclusive token offsets
    query_end_loc_ptr,  # [B] int32/int64, last accepted input token per request
    padding_token_id,  # id of rejected slots
    parallel_drafting_token_id,  # id of parallel-drafting slots
    total_input_tokens,  # N_in; masked loads keep every read below it
    num_padding_slots_per_request,  # P
    shift_input_ids,  # EAGLE-style: ids shift left by one
    BLOCK_SIZE_TOKENS: tl.constexpr,  # output slots per program; programs (r, t) tile request r
):
    req_idx = tl.program_id(0)
    tile = tl.program_id(1)
    r = req_idx.to(tl.int64)
    P = num_padding_slots_per_request
    # Loaded first, under no mask: selected per region, ptxas loaded it into the token's register
    # after the token load returned, one memory round trip more (1.49 -> 1.34 us at B=1, H100).
    next_token = tl.load(next_token_ids_ptr + req_idx)
    qs = tl.load(query_start_loc_ptr + req_idx).to(tl.int64)
    qn = tl.load(query_start_loc_ptr + req_idx + 1).to(tl.int64)
    qe = tl.load(query_end_loc_ptr + req_idx).to(tl.int64)
    if shift_input_ids:
        num_valid = qe - qs
        src = qs + 1
        out_start = qs + r * (P - 1)
    else:
        num_valid = qe - qs + 1
        src = qs
        out_start = qs + r * P
    num_rejected = qn - qe - 1
    total = num_valid + P + num_rejected

    # Output slot j of the request: valid [0, nv), bonus nv, parallel (nv, nv + P), rejected after.
    # j stays int64 (C4): int32 lanes against clamped bounds measured no faster on an H100.
    j = tile.to(tl.int64) * BLOCK_SIZE_TOKENS + tl.arange(0, BLOCK_SIZE_TOKENS)
    in_request = j < total
    is_valid = j < num_valid
    is_new = (j >= num_valid) & (j < num_valid + P)
    is_parallel = is_new & (j > num_valid)
    is_rejected = j >= num_valid + P

    # is_valid implies in_request (total >= num_valid + P). Ids keep their loaded widths: the
    # wheres only sign-extend, so the stored bits are those of int64 ids.
    token = tl.load(target_token_ids_ptr + src + j, mask=is_valid, other=0)
    token = tl.where(j == num_valid, next_token, token)
    token = tl.where(is_parallel, parallel_drafting_token_id, token)
    token = tl.where(is_rejected, padding_token_id, token)
    # Positions are never shifted; rejected slots get position 0 (C24).
    first_position = tl.load(target_positions_ptr + qs).to(tl.int64)
    position = tl.where(is_rejected, 0, first_position + j)

    out = out_start + j
    tl.store(out_input_ids_ptr + out, token, mask=in_request)
    tl.store(out_positions_ptr + out, position, mask=in_request)
    tl.store(out_is_rejected_token_mask_ptr + out, is_rejected, mask=in_request)
    tl.store(out_is_masked_token_mask_ptr + out, is_parallel, mask=in_request)
    tl.store(out_new_token_indices_ptr + r * P + (j - num_valid), out, mask=in_request & is_new)
    if shift_input_ids:
        # Every input token, rejected ones included, maps to its output slot (C24).
        tl.store(out_hidden_state_mapping_ptr + qs + j, out, mask=j < qn - qs)
