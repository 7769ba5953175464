"""The oracle of Model Runner V2's sampling parameters (docs/sample.md, C41): the readable
specification.

Row ``r`` (a token) takes the parameters of request state ``expanded_idx_mapping[r]`` and changes
only its first ``vocab_size`` columns, in place.

``_temperature_kernel``: a temperature of 0 (greedy; -0.0 too) or 1 leaves the row alone; any other
divides every logit by it, rounded once (IEEE float32 division: NaN, infinite and negative
temperatures divide like any other).

``_min_p_kernel``: a min-p of 0 leaves the row alone; any other masks to -inf every logit below the
threshold ``max(row) + log(min_p)``, one float32 addition of C29's ``log32`` (so min-p 1 keeps the
maximum's ties, above 1 masks the whole row, and a negative or NaN min-p, whose log is NaN, masks
nothing). A row of -inf only stays as it is.
"""

from __future__ import annotations

import torch

from contracts import sample as contract


def _temperature_kernel(
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    temperature_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    for r in range(contract.rows(locals())):
        t = temperature_ptr[int(expanded_idx_mapping_ptr[r])]
        if t == 0.0 or t == 1.0:
            continue
        row = logits_ptr[r, :vocab_size]
        row.copy_(row / t)


def _min_p_kernel(
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    min_p_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    for r in range(contract.rows(locals())):
        p = min_p_ptr[int(expanded_idx_mapping_ptr[r])]
        if p == 0.0 or vocab_size == 0:
            continue
        row = logits_ptr[r, :vocab_size]
        threshold = contract.min_p_threshold(row.max(), p)
        row.masked_fill_(row < threshold, float("-inf"))
