"""The PyTorch oracle of Model Runner V2's batch-state kernels (docs/input_batch.md, C37): the
readable specification.

Batch row ``b`` is the request state ``s = idx_mapping[b]``; its query tokens are
``[query_start_loc[b], query_start_loc[b + 1])`` and its logits rows ``[cu_num_logits[b],
cu_num_logits[b + 1])``. Every sum the kernels form fits int32 (the contract refuses the rest,
C37), so values are computed exactly; a store narrows a value to its buffer's dtype (a token id
into int32 ``input_ids``). Every buffer is addressed as its kernel addresses it, ``row * stride +
column`` from its first element.
"""

from __future__ import annotations

import torch

from contracts._checks import flat_view


def narrow(value: int, dtype: torch.dtype) -> int:
    """``value`` in two's complement at ``dtype``'s width, as a store or a cast narrows it."""
    bits = torch.iinfo(dtype).bits
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def store(t: torch.Tensor, flat: int, value: int) -> None:
    """Stores ``value`` at flat index ``flat``, narrowed to ``t``'s dtype."""
    flat_view(t)[flat] = narrow(value, t.dtype)


def _get(t: torch.Tensor, flat: int) -> int:
    return int(flat_view(t)[flat])


def _prepare_prefill_inputs_kernel(
    input_ids_ptr: torch.Tensor,
    next_prefill_tokens_ptr: torch.Tensor,
    next_prefill_tokens_stride: int,
    num_lookahead: int,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    prefill_lens_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    BLOCK_SIZE: int,
    LOOKAHEAD_BLOCK: int,
) -> None:
    # The tiles only split the copies; results never depend on them.
    qsl = query_start_loc_ptr.tolist()
    for b, s in enumerate(idx_mapping_ptr.tolist()):
        prefill, computed = int(prefill_lens_ptr[s]), int(num_computed_tokens_ptr[s])
        if computed >= prefill:
            continue  # not prefilling: the drafts and the last sampled token fill its query (K24)
        row = s * all_token_ids_stride
        query_len = qsl[b + 1] - qsl[b]
        for i in range(query_len):
            store(input_ids_ptr, qsl[b] + i, _get(all_token_ids_ptr, row + computed + i))
        # The next num_lookahead prompt tokens after the query; 0 past prefill_len.
        for j in range(num_lookahead):
            at = computed + query_len + j
            token = _get(all_token_ids_ptr, row + at) if at < prefill else 0
            store(next_prefill_tokens_ptr, j * next_prefill_tokens_stride + s, token)


def _prepare_pos_seq_lens_kernel(
    pos_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    max_num_reqs: int,
    BLOCK_SIZE: int,
) -> None:
    qsl = query_start_loc_ptr.tolist()
    idx = idx_mapping_ptr.tolist()
    for b, s in enumerate(idx):
        computed = int(num_computed_tokens_ptr[s])
        query_len = qsl[b + 1] - qsl[b]
        store(seq_lens_ptr, b, computed + query_len)
        for i in range(query_len):
            store(pos_ptr, qsl[b] + i, computed + i)
    # Rows past the batch read as empty sequences for full CUDA graphs.
    for r in range(len(idx), max_num_reqs):
        store(seq_lens_ptr, r, 0)


def _combine_sampled_and_draft_tokens_kernel(
    input_ids_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    last_sampled_tokens_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
    draft_tokens_ptr: torch.Tensor,
    draft_tokens_stride: int,
    cu_num_logits_ptr: torch.Tensor,
    logits_indices_ptr: torch.Tensor,
    BLOCK_SIZE: int,
    NUM_NEW_SAMPLED_TOKENS: int = 1,
) -> None:
    qsl, cu = query_start_loc_ptr.tolist(), cu_num_logits_ptr.tolist()
    for b, s in enumerate(idx_mapping_ptr.tolist()):
        num_logits = cu[b + 1] - cu[b]
        num_drafts = num_logits - NUM_NEW_SAMPLED_TOKENS
        # The logits rows are the query's last num_logits tokens.
        logits_start = qsl[b + 1] - num_logits
        for i in range(num_logits):
            store(logits_indices_ptr, cu[b] + i, logits_start + i)
        seq_len, prefill = int(seq_lens_ptr[b]), int(prefill_len_ptr[s])
        if seq_len <= prefill:
            continue  # a prefill chunk: its tokens are the prompt's (K22)
        # The last sampled token goes first, unless that place still holds a prompt token.
        if NUM_NEW_SAMPLED_TOKENS and seq_len - num_logits >= prefill:
            store(input_ids_ptr, logits_start, _get(last_sampled_tokens_ptr, s))
        for i in range(num_drafts):
            store(input_ids_ptr, qsl[b + 1] - num_drafts + i, _get(draft_tokens_ptr, s * draft_tokens_stride + i))


def _get_num_sampled_and_rejected_kernel(
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
) -> None:
    cu = cu_num_logits_ptr.tolist()
    for b, s in enumerate(idx_mapping_ptr.tolist()):
        # A chunked prefill (before its last chunk) emits nothing and rejects nothing.
        chunked = int(seq_lens_ptr[b]) < int(prefill_len_ptr[s])
        sampled = 0 if chunked else int(num_sampled_ptr[b])
        num_sampled_ptr[b] = sampled
        num_rejected_ptr[b] = 0 if chunked else cu[b + 1] - cu[b] - sampled


def _post_update_kernel(
    idx_mapping_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    last_sampled_tokens_ptr: torch.Tensor,
    output_bin_counts_ptr: torch.Tensor | None,
    output_bin_counts_stride: int,
    sampled_tokens_ptr: torch.Tensor,
    sampled_tokens_stride: int,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor | None,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    total_len_ptr: torch.Tensor,
    draft_tokens_ptr: torch.Tensor | None,
    draft_tokens_out_ptr: torch.Tensor | None,
    num_draft_tokens: int,
) -> None:
    nd = num_draft_tokens
    for b, s in enumerate(idx_mapping_ptr.tolist()):
        if s < 0:
            continue  # a row whose request finished or needs no update
        if draft_tokens_ptr is not None:
            for i in range(nd):
                store(draft_tokens_out_ptr, s * nd + i, _get(draft_tokens_ptr, b * nd + i))
        total = int(total_len_ptr[s])
        num_sampled = int(num_sampled_ptr[b])
        tokens = [_get(sampled_tokens_ptr, b * sampled_tokens_stride + i) for i in range(num_sampled)]
        if num_sampled > 0:
            store(last_sampled_tokens_ptr, s, tokens[-1])
            store(total_len_ptr, s, total + num_sampled)
        # Appended at the length read before the update; counted one by one (a token may repeat).
        for i, token in enumerate(tokens):
            store(all_token_ids_ptr, s * all_token_ids_stride + total + i, token)
            if output_bin_counts_ptr is not None:
                at = s * output_bin_counts_stride + token
                flat_view(output_bin_counts_ptr)[at] += 1
        # Without query offsets the query counts as empty: only the rejected tokens roll back.
        query_len = 0 if query_start_loc_ptr is None else int(query_start_loc_ptr[b + 1]) - int(query_start_loc_ptr[b])
        num_computed_tokens_ptr[s] += query_len - int(num_rejected_ptr[b])


def _post_update_num_computed_tokens_kernel(
    idx_mapping_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
) -> None:
    qsl = query_start_loc_ptr.tolist()
    for b, s in enumerate(idx_mapping_ptr.tolist()):
        num_computed_tokens_ptr[s] += qsl[b + 1] - qsl[b]


def _expand_idx_mapping_kernel(
    idx_mapping_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    BLOCK_SIZE: int,
) -> None:
    cu = cu_num_logits_ptr.tolist()
    for b, s in enumerate(idx_mapping_ptr.tolist()):
        for i in range(cu[b + 1] - cu[b]):
            store(expanded_idx_mapping_ptr, cu[b] + i, s)
            store(expanded_local_pos_ptr, cu[b] + i, i)
