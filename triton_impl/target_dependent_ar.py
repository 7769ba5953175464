"""Triton kernels of Model Runner V2's EAGLE/MTP drafter, with vLLM 0.33.0's names, parameters and
grids (docs/target_dependent_ar.md, C38).

One program per request. ``_prepare_prefill_inputs_kernel``'s last program also pads the rows past
the batch; ``_prepare_decode_inputs_kernel`` has one more program for that. No two programs write
one element.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _prepare_prefill_inputs_kernel(
    last_token_indices_ptr,  # [max_num_reqs] out
    draft_current_step_ptr,  # [] out
    draft_input_ids_ptr,  # [>= num_tokens] out
    draft_positions_ptr,  # [>= num_tokens] out
    draft_query_start_loc_ptr,  # [max_num_reqs + 1] out
    draft_seq_lens_ptr,  # [max_num_reqs] out
    target_input_ids_ptr,  # [num_tokens]
    target_positions_ptr,  # [num_tokens]
    idx_mapping_ptr,  # [num_reqs]
    last_sampled_ptr,  # [max_num_reqs(, 1)]
    next_prefill_tokens_ptr,  # [num_lookahead, max_num_reqs]: row 0
    num_sampled_ptr,  # [num_reqs]
    num_rejected_ptr,  # [num_reqs]
    query_start_loc_ptr,  # [num_reqs + 1]
    seq_lens_ptr,  # [num_reqs]
    max_num_reqs,
    BLOCK_SIZE: tl.constexpr,
):
    b = tl.program_id(0)
    n = tl.num_programs(0)
    s = tl.load(idx_mapping_ptr + b).to(tl.int64)
    start = tl.load(query_start_loc_ptr + b)
    end = tl.load(query_start_loc_ptr + b + 1)
    kept = end - start - tl.load(num_rejected_ptr + b)  # the query without its rejected tokens
    # Both branches widen to int64 (compiled Triton gives a variable one type): the last sampled
    # token is narrowed to int32 first, as vLLM's kernel casts it.
    if tl.load(num_sampled_ptr + b) > 0:
        following = tl.load(last_sampled_ptr + s).to(tl.int32).to(tl.int64)
    else:
        following = tl.load(next_prefill_tokens_ptr + s).to(tl.int64)  # still prefilling: the next prompt token

    # The drafter's token i is the target's token i + 1; its positions are the target's.
    for i in range(0, kept, BLOCK_SIZE):
        j = i + tl.arange(0, BLOCK_SIZE)
        shifted = (j >= 1) & (j < kept)
        tl.store(draft_input_ids_ptr + start + j - 1, tl.load(target_input_ids_ptr + start + j, mask=shifted), mask=shifted)
        inside = j < kept
        tl.store(draft_positions_ptr + start + j, tl.load(target_positions_ptr + start + j, mask=inside), mask=inside)
    last = start + kept - 1
    tl.store(last_token_indices_ptr + b, last)
    tl.store(draft_input_ids_ptr + last, following)
    tl.store(draft_query_start_loc_ptr + b, start)
    tl.store(draft_seq_lens_ptr + b, tl.load(seq_lens_ptr + b))

    if b == n - 1:
        # Reset the draft step; pad the rows past the batch for CUDA graphs. (Loop variables of their
        # own: compiled Triton keeps the one above at query_start_loc's dtype.)
        tl.store(draft_current_step_ptr, 0)
        for r0 in range(n, max_num_reqs + 1, BLOCK_SIZE):
            r = r0 + tl.arange(0, BLOCK_SIZE)
            tl.store(draft_query_start_loc_ptr + r, end, mask=r < max_num_reqs + 1)
        for r0 in range(n, max_num_reqs, BLOCK_SIZE):
            r = r0 + tl.arange(0, BLOCK_SIZE)
            tl.store(draft_seq_lens_ptr + r, 0, mask=r < max_num_reqs)
            tl.store(last_token_indices_ptr + r, 0, mask=r < max_num_reqs)


@triton.jit
def _prepare_decode_inputs_kernel(
    draft_tokens_ptr,  # [num_reqs], draft_tokens_stride apart
    draft_tokens_stride,
    target_seq_lens_ptr,  # [num_reqs]
    num_rejected_ptr,  # [num_reqs]
    input_ids_ptr,  # [>= num_reqs] out
    positions_ptr,  # [>= num_reqs] in/out
    sample_src_positions_ptr,  # [>= num_reqs] in/out
    query_start_loc_ptr,  # [max_num_reqs + 1] out
    seq_lens_ptr,  # [max_num_reqs] out
    max_model_len,
    max_num_reqs,
    BLOCK_SIZE: tl.constexpr,
    ADVANCE_DRAFT_POSITIONS: tl.constexpr,
):
    b = tl.program_id(0)
    n = tl.num_programs(0) - 1
    if b == n:
        # One token per request; rows past the batch are empty, for CUDA graphs.
        for i in range(0, max_num_reqs + 1, BLOCK_SIZE):
            r = i + tl.arange(0, BLOCK_SIZE)
            tl.store(query_start_loc_ptr + r, tl.minimum(r, n), mask=r < max_num_reqs + 1)
        for i in range(n, max_num_reqs, BLOCK_SIZE):
            r = i + tl.arange(0, BLOCK_SIZE)
            tl.store(seq_lens_ptr + r, 0, mask=r < max_num_reqs)
    else:
        tl.store(input_ids_ptr + b, tl.load(draft_tokens_ptr + b.to(tl.int64) * draft_tokens_stride))
        tl.store(sample_src_positions_ptr + b, tl.load(sample_src_positions_ptr + b) + 1)
        seq_len = tl.load(target_seq_lens_ptr + b) - tl.load(num_rejected_ptr + b)
        if ADVANCE_DRAFT_POSITIONS:
            # Clamped at the model's length so that nothing is read or written past it.
            tl.store(positions_ptr + b, tl.minimum(tl.load(positions_ptr + b) + 1, max_model_len - 1))
            seq_len = tl.minimum(seq_len + 1, max_model_len)
        tl.store(seq_lens_ptr + b, seq_len)


@triton.jit
def _update_draft_inputs_kernel(
    output_draft_tokens_ptr,  # [max_num_reqs, K] in/out
    output_draft_tokens_stride,
    next_input_hidden_states_ptr,  # [>= num_reqs, hidden] out
    next_input_hidden_states_stride,
    input_ids_ptr,  # [>= num_reqs] out
    positions_ptr,  # [>= num_reqs] in/out
    sample_src_positions_ptr,  # [>= num_reqs] in/out
    seq_lens_ptr,  # [>= num_reqs] in/out
    draft_tokens_ptr,  # [num_reqs]
    current_draft_step_ptr,  # []
    hidden_states_ptr,  # [>= num_reqs, hidden]
    hidden_states_stride,
    hidden_size,
    max_model_len,
    num_speculative_steps,
    BLOCK_SIZE: tl.constexpr,
    ADVANCE_DRAFT_POSITIONS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    token = tl.load(draft_tokens_ptr + b)
    step = tl.load(current_draft_step_ptr)
    tl.store(output_draft_tokens_ptr + b * output_draft_tokens_stride + step, token)
    if step < num_speculative_steps - 1:  # after the last step nothing more is drafted
        tl.store(sample_src_positions_ptr + b, tl.load(sample_src_positions_ptr + b) + 1)
        tl.store(input_ids_ptr + b, token)
        # The draft model's hidden state becomes the next step's input, bit for bit.
        for i in range(0, hidden_size, BLOCK_SIZE):
            j = i + tl.arange(0, BLOCK_SIZE)
            inside = j < hidden_size
            h = tl.load(hidden_states_ptr + b * hidden_states_stride + j, mask=inside)
            tl.store(next_input_hidden_states_ptr + b * next_input_hidden_states_stride + j, h, mask=inside)
        if ADVANCE_DRAFT_POSITIONS:
            tl.store(positions_ptr + b, tl.minimum(tl.load(positions_ptr + b) + 1, max_model_len - 1))
            tl.store(seq_lens_ptr + b, tl.minimum(tl.load(seq_lens_ptr + b) + 1, max_model_len))
