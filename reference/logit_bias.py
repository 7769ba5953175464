"""The oracle of Model Runner V2's logit bias (docs/logit_bias.md, C44): the readable specification.

``_bias_kernel``: row ``r`` of request state ``s`` changes only its first ``vocab_size`` columns, in
three steps.

1. Allowed token ids (``num_allowed_token_ids[s] > 0``): the listed columns keep their values (a
   column listed twice too), every other becomes -inf.
2. Logit bias (``num_logit_bias[s] > 0``): each listed column adds its bias, one float32 addition
   (the ids are distinct; a column step 1 masked stays -inf).
3. Min tokens (``num_stop_token_ids[s] > 0`` and ``pos[r] + 1 < min_lens[s]``): the stop tokens
   become -inf. With ``CHECK_ALL_MASKED_ROWS`` and ``restore_when_all_masked[s]`` nonzero, a row left
   all -inf then takes back each stop token's value from before this step where it was finite (a
   saved -inf, +inf or NaN stays -inf).
"""

from __future__ import annotations

import torch

from contracts import logit_bias as contract


def _bias_kernel(
    logits_ptr: torch.Tensor,
    logits_stride: int,
    vocab_size: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    num_allowed_token_ids_ptr: torch.Tensor,
    allowed_token_ids_ptr: torch.Tensor,
    allowed_token_ids_stride: int,
    num_logit_bias_ptr: torch.Tensor,
    bias_token_ids_ptr: torch.Tensor,
    bias_token_ids_stride: int,
    bias_ptr: torch.Tensor,
    bias_stride: int,
    pos_ptr: torch.Tensor,
    min_lens_ptr: torch.Tensor,
    num_stop_token_ids_ptr: torch.Tensor,
    restore_when_all_masked_ptr: torch.Tensor,
    stop_token_ids_ptr: torch.Tensor,
    stop_token_ids_stride: int,
    BLOCK_SIZE: int,
    LOGITS_BLOCK_SIZE: int,
    CHECK_ALL_MASKED_ROWS: bool,
) -> None:
    a = locals()
    ninf = float("-inf")
    for r in range(contract.rows(a)):
        s = contract.state(a, r)
        row = logits_ptr[r, :vocab_size]
        allowed = contract.listed(a, contract.ALLOWED, s)
        if allowed.numel():
            kept = row[allowed].clone()
            row.fill_(ninf)
            row[allowed] = kept
        ids = contract.listed(a, contract.BIAS, s)
        if ids.numel():
            row[ids] = row[ids] + bias_ptr[s, : ids.numel()]
        if contract.min_tokens_active(a, r):
            stop = contract.listed(a, contract.STOP, s)
            saved = row[stop].clone()
            row[stop] = ninf
            if contract.restores(a, r) and bool((row == ninf).all()):
                finite = torch.isfinite(saved)
                row[stop[finite]] = saved[finite]
