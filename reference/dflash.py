"""The PyTorch oracle of the DFlash input-preparation kernel (docs/spec.md §2.9, contract C23).

Written to be read as the specification: context tokens keep their positions and get slots;
each request's Q query tokens continue from its last accepted context position. Values are
computed in int64 and narrowed only by the store into the caller's buffer.
"""

from __future__ import annotations

import torch

from contracts._checks import flat_view

I64 = torch.int64


def copy_and_expand_dflash_inputs_kernel(
    next_token_ids_ptr: torch.Tensor,
    target_positions_ptr: torch.Tensor,
    out_input_ids_ptr: torch.Tensor,
    out_context_positions_ptr: torch.Tensor,
    out_query_positions_ptr: torch.Tensor,
    out_context_slot_mapping_ptr: torch.Tensor,
    out_query_slot_mapping_ptr: torch.Tensor,
    out_token_indices_ptr: torch.Tensor,
    block_table_ptr: torch.Tensor,
    block_table_stride: int,
    query_start_loc_ptr: torch.Tensor,
    num_rejected_tokens_ptr: torch.Tensor | int | None,
    parallel_drafting_token_id: int,
    block_size: int,
    num_query_per_req: int,
    num_speculative_tokens: int,
    total_input_tokens: int,
    BLOCK_SIZE: int,
    HAS_NUM_REJECTED: bool = False,
) -> None:
    # BLOCK_SIZE only tiles the Triton kernel's tokens; results never depend on it.
    Q, K = num_query_per_req, num_speculative_tokens
    query_start = query_start_loc_ptr.tolist()
    b = len(query_start) - 1
    # Without HAS_NUM_REJECTED the argument (the integer 0 at the call site) is ignored (C23).
    rejected = num_rejected_tokens_ptr[:b].tolist() if HAS_NUM_REJECTED else [0] * b
    next_token = next_token_ids_ptr.tolist()
    table = flat_view(block_table_ptr)

    def slot(r: int, position: torch.Tensor) -> torch.Tensor:
        # The column is clamped to the stride, not to the allocated width (C23).
        column = torch.clamp(position // block_size, max=block_table_stride - 1)
        return table[r * block_table_stride + column].to(I64) * block_size + position % block_size

    for r in range(b):
        cs, ce = query_start[r], query_start[r + 1]
        # No clamp to the request's own range: it may read an earlier request's position (C23).
        last = int(target_positions_ptr[ce - rejected[r] - 1])

        # Context tokens, rejected ones included; reads are clamped to the last input token.
        source = torch.clamp(torch.arange(cs, ce), max=total_input_tokens - 1)
        position = target_positions_ptr[source].to(I64)
        out_context_positions_ptr[cs:ce] = position
        out_context_slot_mapping_ptr[cs:ce] = slot(r, position)

        # Query tokens: the next token, then K parallel-drafting (mask) tokens the drafter samples at.
        o = r * Q
        position = last + 1 + torch.arange(Q)
        out_query_positions_ptr[o : o + Q] = position
        out_query_slot_mapping_ptr[o : o + Q] = slot(r, position)
        out_input_ids_ptr[o : o + Q] = torch.tensor([next_token[r]] + [parallel_drafting_token_id] * (Q - 1), dtype=I64)
        out_token_indices_ptr[r * K : (r + 1) * K] = o + torch.arange(1, Q)
