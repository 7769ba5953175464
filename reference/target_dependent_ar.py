"""The PyTorch oracle of Model Runner V2's EAGLE/MTP drafter kernels (docs/target_dependent_ar.md,
C38): the readable specification.

Every sum fits int32 (the contract refuses the rest), so values are computed exactly; a store
narrows a value to its buffer's dtype. Tensors with a stride argument are addressed ``row *
stride + column`` from their first element.
"""

from __future__ import annotations

import torch

from contracts._checks import flat_view
from reference.input_batch import narrow, store


def _prepare_prefill_inputs_kernel(
    last_token_indices_ptr: torch.Tensor,
    draft_current_step_ptr: torch.Tensor,
    draft_input_ids_ptr: torch.Tensor,
    draft_positions_ptr: torch.Tensor,
    draft_query_start_loc_ptr: torch.Tensor,
    draft_seq_lens_ptr: torch.Tensor,
    target_input_ids_ptr: torch.Tensor,
    target_positions_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    last_sampled_ptr: torch.Tensor,
    next_prefill_tokens_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    max_num_reqs: int,
    BLOCK_SIZE: int,
) -> None:
    qsl = query_start_loc_ptr.tolist()
    idx = idx_mapping_ptr.tolist()
    n = len(idx)
    for b, s in enumerate(idx):
        start = qsl[b]
        kept = qsl[b + 1] - start - int(num_rejected_ptr[b])  # the query without its rejected tokens
        # The token the draft continues from: the last one sampled, narrowed to int32 as the kernel
        # casts it, or for a chunked prefill the next prompt token.
        if int(num_sampled_ptr[b]) > 0:
            following = narrow(int(flat_view(last_sampled_ptr)[s]), torch.int32)
        else:
            following = int(flat_view(next_prefill_tokens_ptr)[s])
        # The drafter's input at token i is the target's token i + 1: shifted by one.
        for i in range(1, kept):
            store(draft_input_ids_ptr, start + i - 1, int(target_input_ids_ptr[start + i]))
        last = start + kept - 1
        store(last_token_indices_ptr, b, last)
        store(draft_input_ids_ptr, last, following)
        for i in range(kept):
            store(draft_positions_ptr, start + i, int(target_positions_ptr[start + i]))
        store(draft_query_start_loc_ptr, b, start)
        store(draft_seq_lens_ptr, b, int(seq_lens_ptr[b]))
    if n:
        # The last row's program resets the step and pads the rows past the batch for CUDA graphs:
        # query offsets with the last query's end (rejected tokens included), lengths and indices 0.
        store(draft_current_step_ptr, 0, 0)
        for r in range(n, max_num_reqs + 1):
            store(draft_query_start_loc_ptr, r, qsl[n])
        for r in range(n, max_num_reqs):
            store(draft_seq_lens_ptr, r, 0)
            store(last_token_indices_ptr, r, 0)


def _prepare_decode_inputs_kernel(
    draft_tokens_ptr: torch.Tensor,
    draft_tokens_stride: int,
    target_seq_lens_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    input_ids_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    sample_src_positions_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    max_model_len: int,
    max_num_reqs: int,
    BLOCK_SIZE: int,
    ADVANCE_DRAFT_POSITIONS: bool,
) -> None:
    n = draft_tokens_ptr.shape[0]
    drafts = flat_view(draft_tokens_ptr)
    for b in range(n):
        store(input_ids_ptr, b, int(drafts[b * draft_tokens_stride]))
        store(sample_src_positions_ptr, b, int(sample_src_positions_ptr[b]) + 1)
        seq_len = int(target_seq_lens_ptr[b]) - int(num_rejected_ptr[b])
        if ADVANCE_DRAFT_POSITIONS:
            # Clamped at the model's length so that nothing is read or written past it.
            store(positions_ptr, b, min(int(positions_ptr[b]) + 1, max_model_len - 1))
            seq_len = min(seq_len + 1, max_model_len)
        store(seq_lens_ptr, b, seq_len)
    # One token per request; rows past the batch are empty, for CUDA graphs.
    for r in range(max_num_reqs + 1):
        store(query_start_loc_ptr, r, min(r, n))
    for r in range(n, max_num_reqs):
        store(seq_lens_ptr, r, 0)


def _update_draft_inputs_kernel(
    output_draft_tokens_ptr: torch.Tensor,
    output_draft_tokens_stride: int,
    next_input_hidden_states_ptr: torch.Tensor,
    next_input_hidden_states_stride: int,
    input_ids_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    sample_src_positions_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    draft_tokens_ptr: torch.Tensor,
    current_draft_step_ptr: torch.Tensor,
    hidden_states_ptr: torch.Tensor,
    hidden_states_stride: int,
    hidden_size: int,
    max_model_len: int,
    num_speculative_steps: int,
    BLOCK_SIZE: int,
    ADVANCE_DRAFT_POSITIONS: bool,
) -> None:
    step = int(current_draft_step_ptr.flatten()[0])
    hidden, following = flat_view(hidden_states_ptr), flat_view(next_input_hidden_states_ptr)
    for b, token in enumerate(draft_tokens_ptr.tolist()):
        store(output_draft_tokens_ptr, b * output_draft_tokens_stride + step, token)
        if step >= num_speculative_steps - 1:
            continue  # the last step: nothing more is drafted
        store(sample_src_positions_ptr, b, int(sample_src_positions_ptr[b]) + 1)
        store(input_ids_ptr, b, token)
        # The draft model's hidden state becomes the next step's input, bit for bit.
        src, dst = b * hidden_states_stride, b * next_input_hidden_states_stride
        following[dst : dst + hidden_size] = hidden[src : src + hidden_size]
        if ADVANCE_DRAFT_POSITIONS:
            store(positions_ptr, b, min(int(positions_ptr[b]) + 1, max_model_len - 1))
            store(seq_lens_ptr, b, min(int(seq_lens_ptr[b]) + 1, max_model_len))
