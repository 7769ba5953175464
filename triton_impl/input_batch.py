"""Triton kernels of Model Runner V2's batch state, with vLLM 0.33.0's names, parameters and grids
(docs/input_batch.md, C37).

One program per batch row ``b`` (``_prepare_pos_seq_lens_kernel`` has one more, which zeroes the
padded ``seq_lens`` rows). Row ``b`` works on request state ``idx_mapping[b]``; no two programs
write one element, so nothing here depends on program order.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _prepare_prefill_inputs_kernel(
    input_ids_ptr,  # [>= num_tokens] out: a prefilling row's query tokens
    next_prefill_tokens_ptr,  # [num_lookahead, max_num_reqs] out
    next_prefill_tokens_stride,
    num_lookahead,
    idx_mapping_ptr,  # [num_reqs]
    query_start_loc_ptr,  # [num_reqs + 1]
    all_token_ids_ptr,  # [max_num_reqs, max_model_len]
    all_token_ids_stride,
    prefill_lens_ptr,  # [max_num_reqs]
    num_computed_tokens_ptr,  # [max_num_reqs]
    BLOCK_SIZE: tl.constexpr,
    LOOKAHEAD_BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    s = tl.load(idx_mapping_ptr + b).to(tl.int64)  # flat offsets in int64 (C4)
    prefill = tl.load(prefill_lens_ptr + s)
    computed = tl.load(num_computed_tokens_ptr + s)
    if computed < prefill:
        start = tl.load(query_start_loc_ptr + b)
        query_len = tl.load(query_start_loc_ptr + b + 1) - start
        row = all_token_ids_ptr + s * all_token_ids_stride + computed
        for i in range(0, query_len, BLOCK_SIZE):
            j = i + tl.arange(0, BLOCK_SIZE)
            inside = j < query_len
            tl.store(input_ids_ptr + start + j, tl.load(row + j, mask=inside), mask=inside)
        # The next num_lookahead prompt tokens; 0 where they run past prefill_len.
        k = tl.arange(0, LOOKAHEAD_BLOCK)
        wanted = k < num_lookahead
        tokens = tl.load(row + query_len + k, mask=wanted & (computed + query_len + k < prefill), other=0)
        tl.store(next_prefill_tokens_ptr + k * next_prefill_tokens_stride + s, tokens, mask=wanted)


@triton.jit
def _prepare_pos_seq_lens_kernel(
    pos_ptr,  # [>= num_tokens] out
    seq_lens_ptr,  # [max_num_reqs] out
    idx_mapping_ptr,  # [num_reqs]
    query_start_loc_ptr,  # [num_reqs + 1]
    num_computed_tokens_ptr,  # [max_num_reqs]
    max_num_reqs,
    BLOCK_SIZE: tl.constexpr,
):
    b = tl.program_id(0)
    num_reqs = tl.num_programs(0) - 1
    if b == num_reqs:
        # The extra program: rows past the batch are empty sequences for full CUDA graphs.
        # Its own loop variables: compiled Triton gives a name one type across the branches, and the
        # other branch's steps over query_start_loc's dtype.
        for r0 in tl.range(num_reqs, max_num_reqs, BLOCK_SIZE):
            r = r0 + tl.arange(0, BLOCK_SIZE)
            tl.store(seq_lens_ptr + r, 0, mask=r < max_num_reqs)
    else:
        s = tl.load(idx_mapping_ptr + b)
        computed = tl.load(num_computed_tokens_ptr + s)
        start = tl.load(query_start_loc_ptr + b)
        query_len = tl.load(query_start_loc_ptr + b + 1) - start
        tl.store(seq_lens_ptr + b, computed + query_len)
        for i in tl.range(0, query_len, BLOCK_SIZE):
            j = i + tl.arange(0, BLOCK_SIZE)
            tl.store(pos_ptr + start + j, computed + j, mask=j < query_len)


@triton.jit
def _combine_sampled_and_draft_tokens_kernel(
    input_ids_ptr,  # [>= num_tokens] in/out
    idx_mapping_ptr,  # [num_reqs]
    last_sampled_tokens_ptr,  # [max_num_reqs(, 1)]
    query_start_loc_ptr,  # [num_reqs + 1]
    seq_lens_ptr,  # [>= num_reqs]
    prefill_len_ptr,  # [max_num_reqs]
    draft_tokens_ptr,  # [max_num_reqs, K]
    draft_tokens_stride,
    cu_num_logits_ptr,  # [num_reqs + 1]
    logits_indices_ptr,  # [num_logits] out
    BLOCK_SIZE: tl.constexpr,
    NUM_NEW_SAMPLED_TOKENS: tl.constexpr = 1,
):
    b = tl.program_id(0)
    s = tl.load(idx_mapping_ptr + b).to(tl.int64)
    logits_at = tl.load(cu_num_logits_ptr + b)
    num_logits = tl.load(cu_num_logits_ptr + b + 1) - logits_at
    query_end = tl.load(query_start_loc_ptr + b + 1)
    # The logits rows are the query's last num_logits tokens (one tile: num_logits <= BLOCK_SIZE).
    logits_start = query_end - num_logits
    j = tl.arange(0, BLOCK_SIZE)
    tl.store(logits_indices_ptr + logits_at + j, logits_start + j, mask=j < num_logits)

    seq_len = tl.load(seq_lens_ptr + b)
    prefill = tl.load(prefill_len_ptr + s)
    if seq_len > prefill:
        if NUM_NEW_SAMPLED_TOKENS > 0:
            # Not where the query still holds the prompt's tail.
            if seq_len - num_logits >= prefill:
                tl.store(input_ids_ptr + logits_start, tl.load(last_sampled_tokens_ptr + s))
        num_drafts = num_logits - NUM_NEW_SAMPLED_TOKENS
        if num_drafts > 0:
            drafts = tl.load(draft_tokens_ptr + s * draft_tokens_stride + j, mask=j < num_drafts)
            tl.store(input_ids_ptr + query_end - num_drafts + j, drafts, mask=j < num_drafts)


@triton.jit
def _get_num_sampled_and_rejected_kernel(
    num_sampled_ptr,  # [num_reqs] in/out
    num_rejected_ptr,  # [num_reqs] out
    seq_lens_ptr,  # [>= num_reqs]
    cu_num_logits_ptr,  # [num_reqs + 1]
    idx_mapping_ptr,  # [num_reqs]
    prefill_len_ptr,  # [max_num_reqs]
):
    b = tl.program_id(0)
    s = tl.load(idx_mapping_ptr + b)
    # A chunked prefill before its last chunk emits and rejects nothing.
    chunked = tl.load(seq_lens_ptr + b) < tl.load(prefill_len_ptr + s)
    sampled = tl.where(chunked, 0, tl.load(num_sampled_ptr + b))
    tl.store(num_sampled_ptr + b, sampled)
    num_logits = tl.load(cu_num_logits_ptr + b + 1) - tl.load(cu_num_logits_ptr + b)
    tl.store(num_rejected_ptr + b, tl.where(chunked, 0, num_logits - sampled))


@triton.jit
def _post_update_kernel(
    idx_mapping_ptr,  # [num_reqs]; negative: skip the row
    num_computed_tokens_ptr,  # [max_num_reqs] in/out
    last_sampled_tokens_ptr,  # [max_num_reqs(, 1)] in/out
    output_bin_counts_ptr,  # [max_num_reqs, vocab] in/out, or None
    output_bin_counts_stride,
    sampled_tokens_ptr,  # [num_reqs, K + 1]
    sampled_tokens_stride,
    num_sampled_ptr,  # [num_reqs]
    num_rejected_ptr,  # [num_reqs]
    query_start_loc_ptr,  # [num_reqs + 1], or None
    all_token_ids_ptr,  # [max_num_reqs, max_model_len] in/out
    all_token_ids_stride,
    total_len_ptr,  # [max_num_reqs] in/out
    draft_tokens_ptr,  # [num_reqs, num_draft_tokens], or None
    draft_tokens_out_ptr,  # [max_num_reqs, num_draft_tokens] in/out
    num_draft_tokens,
):
    b = tl.program_id(0).to(tl.int64)
    s = tl.load(idx_mapping_ptr + b).to(tl.int64)
    if s >= 0:
        if draft_tokens_ptr is not None:
            for i in range(num_draft_tokens):
                token = tl.load(draft_tokens_ptr + b * num_draft_tokens + i)
                tl.store(draft_tokens_out_ptr + s * num_draft_tokens + i, token)

        total = tl.load(total_len_ptr + s)
        num_sampled = tl.load(num_sampled_ptr + b)
        sampled_row = sampled_tokens_ptr + b * sampled_tokens_stride
        if num_sampled > 0:
            tl.store(last_sampled_tokens_ptr + s, tl.load(sampled_row + num_sampled - 1))
            tl.store(total_len_ptr + s, total + num_sampled)
        # Appended at the length read above; counted one at a time (a token may repeat).
        for i in range(num_sampled):
            token = tl.load(sampled_row + i)
            tl.store(all_token_ids_ptr + s * all_token_ids_stride + total + i, token)
            if output_bin_counts_ptr is not None:
                count_ptr = output_bin_counts_ptr + s * output_bin_counts_stride + token
                tl.store(count_ptr, tl.load(count_ptr) + 1)

        if query_start_loc_ptr is None:
            delta = 0 - tl.load(num_rejected_ptr + b)
        else:
            query_len = tl.load(query_start_loc_ptr + b + 1) - tl.load(query_start_loc_ptr + b)
            delta = query_len - tl.load(num_rejected_ptr + b)
        if delta != 0:
            tl.store(num_computed_tokens_ptr + s, tl.load(num_computed_tokens_ptr + s) + delta)


@triton.jit
def _post_update_num_computed_tokens_kernel(
    idx_mapping_ptr,  # [num_reqs]
    num_computed_tokens_ptr,  # [max_num_reqs] in/out
    query_start_loc_ptr,  # [num_reqs + 1]
):
    b = tl.program_id(0)
    query_len = tl.load(query_start_loc_ptr + b + 1) - tl.load(query_start_loc_ptr + b)
    s = tl.load(idx_mapping_ptr + b)
    tl.store(num_computed_tokens_ptr + s, tl.load(num_computed_tokens_ptr + s) + query_len)


@triton.jit
def _expand_idx_mapping_kernel(
    idx_mapping_ptr,  # [num_reqs]
    expanded_idx_mapping_ptr,  # [num_logits] out
    expanded_local_pos_ptr,  # [num_logits] out
    cu_num_logits_ptr,  # [num_reqs + 1]
    BLOCK_SIZE: tl.constexpr,
):
    b = tl.program_id(0)
    start = tl.load(cu_num_logits_ptr + b)
    num_logits = tl.load(cu_num_logits_ptr + b + 1) - start
    j = tl.arange(0, BLOCK_SIZE)
    inside = j < num_logits
    tl.store(expanded_idx_mapping_ptr + start + j, tl.load(idx_mapping_ptr + b), mask=inside)
    tl.store(expanded_local_pos_ptr + start + j, j, mask=inside)
