"""Triton kernel of the KV slot mapping, with vLLM 0.33.0's parameters and grid.

vLLM's kernel is the static method ``ComputeSlotMappingKernel.kernel``; here it is
``compute_slot_mapping_kernel``, also reachable as ``ComputeSlotMappingKernel.kernel``.
Launched as ``kernel[(num_reqs + 1,)](...)``: program ``r < num_reqs`` maps request ``r``'s
tokens in tiles of ``BLOCK_SIZE``; the last program pads the tail. Offsets, block indices and
the slot product are formed in int64 (C4).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens"])
def compute_slot_mapping_kernel(
    num_tokens,  # positions.shape[0]: the tail starts here
    max_num_tokens,  # length of the slot buffer: the tail ends here
    query_start_loc_ptr,  # [num_reqs + 1] int32/int64, exclusive token offsets
    positions_ptr,  # [num_tokens] int64/int32
    block_table_ptr,  # [max_num_reqs, max_blocks] int32/int64, rows of stride block_table_stride
    block_table_stride,  # row stride of the block table
    slot_mapping_ptr,  # [max_num_tokens] int64/int32, out
    KV_CACHE_BLOCK_SIZE: tl.constexpr,  # KBS
    TOTAL_CP_WORLD_SIZE: tl.constexpr,  # W: decode-context-parallel ranks
    TOTAL_CP_RANK: tl.constexpr,  # RK: this rank
    CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr,  # I: consecutive tokens per rank
    PAD_ID: tl.constexpr,  # slot of the tail and of other ranks' tokens
    BLOCK_SIZE: tl.constexpr,  # tokens per tile
):
    req_idx = tl.program_id(0)
    lanes = tl.arange(0, BLOCK_SIZE).to(tl.int64)
    if req_idx == tl.num_programs(0) - 1:
        # The tail is padded on every launch: stale slots of a larger batch are overwritten (C22).
        for start in range(num_tokens, max_num_tokens, BLOCK_SIZE):
            offsets = start + lanes
            tl.store(slot_mapping_ptr + offsets, PAD_ID, mask=offsets < max_num_tokens)
        return

    start_idx = tl.load(query_start_loc_ptr + req_idx).to(tl.int64)
    end_idx = tl.load(query_start_loc_ptr + req_idx + 1).to(tl.int64)
    row = req_idx.to(tl.int64) * block_table_stride
    VIRTUAL_BLOCK: tl.constexpr = KV_CACHE_BLOCK_SIZE * TOTAL_CP_WORLD_SIZE
    for start in range(start_idx, end_idx, BLOCK_SIZE):
        offsets = start + lanes
        in_request = offsets < end_idx
        position = tl.load(positions_ptr + offsets, mask=in_request, other=0).to(tl.int64)
        virtual_block = position // VIRTUAL_BLOCK
        virtual_offset = position - virtual_block * VIRTUAL_BLOCK
        is_local = (virtual_offset // CP_KV_CACHE_INTERLEAVE_SIZE) % TOTAL_CP_WORLD_SIZE == TOTAL_CP_RANK
        local_offset = (
            virtual_offset // (TOTAL_CP_WORLD_SIZE * CP_KV_CACHE_INTERLEAVE_SIZE)
        ) * CP_KV_CACHE_INTERLEAVE_SIZE + virtual_offset % CP_KV_CACHE_INTERLEAVE_SIZE
        # Not clamped: past the row it reads the next row (C22). Read only for this rank's tokens.
        block_id = tl.load(block_table_ptr + row + virtual_block, mask=in_request & is_local, other=0).to(tl.int64)
        slot = tl.where(is_local, block_id * KV_CACHE_BLOCK_SIZE + local_offset, PAD_ID)
        tl.store(slot_mapping_ptr + offsets, slot, mask=in_request)


class ComputeSlotMappingKernel:
    """vLLM's owner class: ``ComputeSlotMappingKernel.kernel`` is the kernel above."""

    kernel = staticmethod(compute_slot_mapping_kernel)
