"""The PyTorch oracle of Model Runner V2's rejection-sampler kernels (conformance/kernels/mrv2.py)."""

from __future__ import annotations

import torch

from conformance.kernels import mrv2 as contracts
from conformance.kernels._checks import flat_view

I64 = torch.int64


def _gather_draft_sampled_kernel(
    draft_sampled_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    input_ids_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    logits_indices_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
    num_logits: int,
    BLOCK_SIZE: int,
) -> None:
    # BLOCK_SIZE only tiles the Triton kernel's rows; results never depend on it.
    contracts.GATHER_DRAFT_SAMPLED.check(locals())
    n = num_logits
    token = logits_indices_ptr[:n].to(I64)
    pos = positions_ptr.to(I64)[token]
    local = expanded_local_pos_ptr[:n].to(I64)
    prefill = prefill_len_ptr.to(I64)[expanded_idx_mapping_ptr[:n].to(I64)]
    # A draft row (local > 0) of a step that started inside the prefill is a placeholder.
    placeholder = (local > 0) & (pos - local < prefill)
    ids = torch.where(placeholder, torch.full_like(token, -1), input_ids_ptr.to(I64)[token])
    draft_sampled_ptr[:n] = ids.to(draft_sampled_ptr.dtype)
    pos_ptr[:n] = pos.to(pos_ptr.dtype)


def _flatten_sampled_kernel(
    flat_sampled_ptr: torch.Tensor,
    sampled_ptr: torch.Tensor,
    sampled_stride: int,
    num_sampled_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
) -> None:
    contracts.FLATTEN_SAMPLED.check(locals())
    cu = cu_num_logits_ptr.tolist()
    sampled = flat_view(sampled_ptr)
    for r in range(len(cu) - 1):
        k = int(num_sampled_ptr[r])
        row = sampled[r * sampled_stride : r * sampled_stride + k]
        flat_sampled_ptr[cu[r] : cu[r] + k] = row.to(flat_sampled_ptr.dtype)
