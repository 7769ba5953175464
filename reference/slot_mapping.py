"""The PyTorch oracle of the KV slot-mapping kernel (docs/spec.md §2.10, contract C22).

vLLM's kernel is ``ComputeSlotMappingKernel.kernel``; :class:`ComputeSlotMappingKernel` gives
this module the same attribute path.
"""

from __future__ import annotations

import torch

from contracts._checks import flat_view

I64 = torch.int64


def compute_slot_mapping_kernel(
    num_tokens: int,
    max_num_tokens: int,
    query_start_loc_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    block_table_ptr: torch.Tensor,
    block_table_stride: int,
    slot_mapping_ptr: torch.Tensor,
    KV_CACHE_BLOCK_SIZE: int,
    TOTAL_CP_WORLD_SIZE: int,
    TOTAL_CP_RANK: int,
    CP_KV_CACHE_INTERLEAVE_SIZE: int,
    PAD_ID: int,
    BLOCK_SIZE: int,
) -> None:
    # BLOCK_SIZE only tiles the Triton kernel's tokens; results never depend on it.
    KBS, W, RK = KV_CACHE_BLOCK_SIZE, TOTAL_CP_WORLD_SIZE, TOTAL_CP_RANK
    interleave = CP_KV_CACHE_INTERLEAVE_SIZE  # the spec's I
    query_start = query_start_loc_ptr.tolist()
    table = flat_view(block_table_ptr)

    # The tail is padded on every launch, so a smaller batch overwrites stale slots (C22).
    if max_num_tokens > num_tokens:
        slot_mapping_ptr[num_tokens:max_num_tokens] = PAD_ID

    for r in range(len(query_start) - 1):
        tokens = slice(query_start[r], query_start[r + 1])
        position = positions_ptr[tokens].to(I64)
        # A virtual block spans KBS * W positions; within it, runs of I tokens go to ranks in turn.
        virtual_block = position // (KBS * W)
        virtual_offset = position - virtual_block * (KBS * W)
        local = (virtual_offset // interleave) % W == RK
        local_offset = (virtual_offset // (W * interleave)) * interleave + virtual_offset % interleave
        # The virtual block index is not clamped: past the row it reads the next row (C22).
        # The table is read only for this rank's tokens; the others get PAD_ID.
        slot = torch.full_like(position, PAD_ID)
        if bool(local.any()):  # else no row is addressed, whatever its (possibly huge) offset
            block_id = table[r * block_table_stride + virtual_block[local]].to(I64)
            slot[local] = block_id * KBS + local_offset[local]  # wraps in int64, as every backend (C4)
        slot_mapping_ptr[tokens] = slot


class ComputeSlotMappingKernel:
    """vLLM's owner class: ``ComputeSlotMappingKernel.kernel`` is the kernel above."""

    kernel = staticmethod(compute_slot_mapping_kernel)
