"""The PyTorch oracle of Model Runner V2's block-table kernels (docs/block_table.md, C39): the
readable specification.

Every slot fits int32 and every position read is non-negative (the contract refuses the rest), so
slots are computed exactly, whatever the dtypes. Tensors with a stride argument are addressed
``row * stride + column`` from their first element.
"""

from __future__ import annotations

import torch

from contracts._checks import flat_view
from contracts.block_table import gathered_rows, local_positions


def _gather_block_tables_kernel(
    batch_idx_to_req_idx: torch.Tensor,
    src_block_table_ptrs: tuple[torch.Tensor, ...],
    dst_block_table_ptrs: tuple[torch.Tensor, ...],
    block_table_strides: torch.Tensor,
    num_blocks_ptr: torch.Tensor,
    num_blocks_stride: int,
    num_reqs: int,
    num_computed_tokens_ptr: torch.Tensor | None,
    sliding_window_reach_ptr: torch.Tensor | None,
    block_sizes_ptr: torch.Tensor | None,
    MASK_SLIDING_WINDOW: bool,
    BLOCK_SIZE: int,
    *,
    grid: tuple[int, ...],
) -> None:
    a = locals()  # the launch's arguments by name, as the contract's helpers read them
    counts = flat_view(num_blocks_ptr)
    rows = grid[1]
    gathered = gathered_rows(a, grid)
    for g, (src, dst) in enumerate(zip(src_block_table_ptrs, dst_block_table_ptrs)):
        # Rows of the grid past the batch are padding for CUDA graphs: zeroed whole. Rows past the
        # grid (and a gathered row's columns past its blocks) keep what they held.
        dst[gathered:rows] = 0
        for b in range(gathered):
            s = int(batch_idx_to_req_idx[b])
            held = int(counts[g * num_blocks_stride + s])
            dst[b, :held] = src[s, :held]
            if MASK_SLIDING_WINDOW:
                reach = int(sliding_window_reach_ptr[g])
                if reach > 0:
                    # Blocks wholly below the window of the request's first scheduled token: the
                    # null block (they may already be freed and reused).
                    first = int(num_computed_tokens_ptr[s])
                    dead = max(first - reach, 0) // int(block_sizes_ptr[g])
                    dst[b, : min(dead, held)] = 0


def _compute_slot_mappings_kernel(
    max_num_tokens: int,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    pos: torch.Tensor,
    block_table_ptrs: tuple[torch.Tensor, ...],
    block_table_strides: torch.Tensor,
    block_sizes: torch.Tensor,
    slot_mapping_enabled: torch.Tensor,
    dcp_sharded: torch.Tensor,
    slot_mappings_ptr: torch.Tensor,
    slot_mappings_stride: int,
    cp_rank: int,
    CP_SIZE: int,
    CP_INTERLEAVE: int,
    PAD_ID: int,
    TRITON_BLOCK_SIZE: int,
) -> None:
    a = locals()  # the launch's arguments by name, as the contract's helpers read them
    out = flat_view(slot_mappings_ptr)
    qsl = query_start_loc.tolist()
    idx = idx_mapping.tolist()
    n = len(idx)
    for g, table in enumerate(block_table_ptrs):
        row = g * slot_mappings_stride
        size = int(block_sizes[g])
        enabled = bool(slot_mapping_enabled[g])
        for b, s in enumerate(idx):
            start, end = qsl[b], qsl[b + 1]
            if start >= end:
                continue
            if s < 0 or not enabled:  # a dummy row, or a group without slots: every token pads
                out[row + start : row + end] = PAD_ID
                continue
            local, mine = local_positions(a, g, pos[start:end].to(torch.int64))
            # Under context parallelism a token another rank holds writes no KV here: PAD_ID.
            slots = torch.full_like(local, PAD_ID)
            blocks = table[s, local[mine].div(size, rounding_mode="floor")].to(torch.int64)
            slots[mine] = blocks * size + local[mine].remainder(size)
            out[row + start : row + end] = slots.to(out.dtype)
        # The tokens past the batch, up to max_num_tokens: padding for CUDA graphs (stale slots of an
        # earlier chunk must not survive there).
        if qsl[n] < max_num_tokens:
            out[row + qsl[n] : row + max_num_tokens] = PAD_ID
