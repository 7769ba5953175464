"""Triton kernel of the DFlash input preparation, with vLLM 0.33.0's name, parameters and grid.

Launched as ``kernel[(B, num_tiles)](...)`` with ``B = len(query_start_loc) - 1`` and tiles of
``BLOCK_SIZE`` covering the longest request's context plus its ``Q`` query tokens: lane ``j`` of
request ``r`` is context token ``j`` while ``j < nctx(r)``, then query ``j - nctx(r)``. Every
flat offset and slot product is formed in int64 (C4).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _slot(block_table_ptr, row, position, mask, block_table_stride, block_size):
    """KV slot of ``position`` in table row ``row``; the column clamp bound is the stride (C23)."""
    column = tl.minimum(position // block_size, block_table_stride - 1)
    block_id = tl.load(block_table_ptr + row + column, mask=mask, other=0).to(tl.int64)
    return block_id * block_size + position % block_size


@triton.jit
def copy_and_expand_dflash_inputs_kernel(
    next_token_ids_ptr,  # [B] int32/int64
    target_positions_ptr,  # [N_ctx] int64/int32, context positions (rejected ones included)
    out_input_ids_ptr,  # [>= B*Q] int32/int64, out: query-token ids
    out_context_positions_ptr,  # [>= N_ctx] int64/int32, out
    out_query_positions_ptr,  # [>= B*Q] int64/int32, out
    out_context_slot_mapping_ptr,  # [>= N_ctx] int64/int32, out
    out_query_slot_mapping_ptr,  # [>= B*Q] int64/int32, out
    out_token_indices_ptr,  # [B*K] int32/int64, out: sample indices of the mask tokens
    block_table_ptr,  # [>= B, nb] int32/int64, rows of stride block_table_stride
    block_table_stride,  # row stride and column clamp bound
    query_start_loc_ptr,  # [B+1] int32/int64, context ranges
    num_rejected_tokens_ptr,  # [B] int32/int64, or the integer 0 without HAS_NUM_REJECTED
    parallel_drafting_token_id,  # id of query tokens 1..K
    block_size,  # drafter KV-cache block size
    num_query_per_req,  # Q = 1 + K
    num_speculative_tokens,  # K
    total_input_tokens,  # N_ctx: context reads are clamped to N_ctx - 1
    BLOCK_SIZE: tl.constexpr,  # lanes per program
    HAS_NUM_REJECTED: tl.constexpr = False,  # read num_rejected_tokens_ptr
):
    req_idx = tl.program_id(0)
    tile = tl.program_id(1)
    r = req_idx.to(tl.int64)
    # Loaded first: after the context stores (which may alias it) it could not be issued sooner.
    # At its own width: the where below only sign-extends, so the stored bits are the same.
    next_token = tl.load(next_token_ids_ptr + req_idx)
    context_start = tl.load(query_start_loc_ptr + req_idx).to(tl.int64)
    context_end = tl.load(query_start_loc_ptr + req_idx + 1).to(tl.int64)
    num_context = context_end - context_start
    if HAS_NUM_REJECTED:
        valid_end = context_end - tl.load(num_rejected_tokens_ptr + req_idx).to(tl.int64)
    else:
        valid_end = context_end
    # No clamp to the request's own range: it may read an earlier request's position (C23).
    last_position = tl.load(target_positions_ptr + valid_end - 1).to(tl.int64)
    row = r * block_table_stride
    j = tile.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)

    # Context tokens keep their positions; query k continues from the last accepted context position.
    is_context = j < num_context
    source = tl.minimum(context_start + j, total_input_tokens - 1)
    context_position = tl.load(target_positions_ptr + source, mask=is_context, other=0).to(tl.int64)
    k = j - num_context
    is_query = (k >= 0) & (k < num_query_per_req)
    query_position = last_position + 1 + k
    # One table lookup for context and query lanes: the query lanes' own lookup came after the
    # context stores, one memory round trip more (with the load above, 1.76 -> 1.52 us at B=1, H100).
    position = tl.where(is_context, context_position, query_position)
    slot = _slot(block_table_ptr, row, position, is_context | is_query, block_table_stride, block_size)
    tl.store(out_context_positions_ptr + context_start + j, context_position, mask=is_context)
    tl.store(out_context_slot_mapping_ptr + context_start + j, slot, mask=is_context)

    out = r * num_query_per_req + k
    token = tl.where(k == 0, next_token, parallel_drafting_token_id)
    tl.store(out_query_positions_ptr + out, query_position, mask=is_query)
    tl.store(out_query_slot_mapping_ptr + out, slot, mask=is_query)
    tl.store(out_input_ids_ptr + out, token, mask=is_query)
    tl.store(out_token_indices_ptr + r * num_speculative_tokens + k - 1, out, mask=is_query & (k >= 1))
