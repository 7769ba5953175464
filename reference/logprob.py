"""The oracle of Model Runner V2's logprob kernels (docs/logprob.md, C45): the readable
specification. Every kernel processes rows ``0 .. B-1`` (the grid) and addresses each tensor from its
data pointer, ``row * stride + column``.

``_topk_log_softmax_kernel``: row ``r``'s scores at its ``topk`` ids, written at ``r * topk``: C29's
log-softmax ``(x[id] - G) - L`` (``contracts.logprob.log_normalizer``: G the row's maximum, L the C29
log-sum-exp of its tiles of ``BLOCK_SIZE`` columns, each the exact sum of ``exp32(x - G)``). Logits
are read as float32; ``TOPK_BLOCK_SIZE`` only chunks the gather.

``_ranks_kernel``: row ``r``'s count of columns in ``[0, V)`` whose logit is >= its token's.

``_fill_logprob_token_ids_kernel``: row ``r`` writes its sampled token at column 0 (valid), then, from
column 1, its request's own ids when the request has any (``num_per_req_token_ids > 0``), else its
``NUM_TOPK`` top-k ids, each marked valid; the columns after them stay as they were.
"""

from __future__ import annotations

import torch

from contracts import logprob as contract

I64 = torch.int64


def _topk_log_softmax_kernel(
    output_ptr: torch.Tensor,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    topk_ids_ptr: torch.Tensor,
    topk_ids_stride: int,
    topk: int,
    vocab_size: int,
    BLOCK_SIZE: int,
    TOPK_BLOCK_SIZE: int,
) -> None:
    n = contract.rows(locals())
    if not topk:
        return
    ids = contract.gather_rows(topk_ids_ptr, n, topk_ids_stride, topk)
    out = output_ptr.view(-1)
    for r in range(n):
        x = logits_ptr[r, :vocab_size].to(torch.float32)
        out[r * topk : (r + 1) * topk] = contract.log_softmax_at(x, ids[r], BLOCK_SIZE)


def _ranks_kernel(
    output_ptr: torch.Tensor,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    token_ids_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    for r in range(contract.rows(locals())):
        output_ptr[r] = contract.rank(logits_ptr[r, :vocab_size].to(torch.float32), int(token_ids_ptr[r]))


def _fill_logprob_token_ids_kernel(
    out_token_ids_ptr: torch.Tensor,
    out_token_ids_stride: int,
    out_valid_mask_ptr: torch.Tensor,
    out_valid_mask_stride: int,
    sampled_token_ids_ptr: torch.Tensor,
    topk_indices_ptr: torch.Tensor,
    topk_indices_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    num_per_req_token_ids_ptr: torch.Tensor,
    per_req_token_ids_ptr: torch.Tensor,
    per_req_token_ids_stride: int,
    NUM_TOPK: int,
    PADDED_COLS: int,
) -> None:
    a = locals()
    for r, count in enumerate(contract.custom_counts(a)):
        if count > 0:
            s = int(expanded_idx_mapping_ptr[r])
            ids = per_req_token_ids_ptr[s, :count]
        else:
            ids = contract.gather_rows(topk_indices_ptr, r + 1, topk_indices_stride, NUM_TOPK)[r]
        tokens = torch.cat([sampled_token_ids_ptr[r : r + 1].to(I64), ids.to(I64)])
        out_token_ids_ptr[r, : tokens.numel()] = tokens
        out_valid_mask_ptr[r, : tokens.numel()] = True
