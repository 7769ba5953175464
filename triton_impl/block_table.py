"""Triton kernels of Model Runner V2's block tables, with vLLM 0.33.0's names, parameters and grids
(docs/block_table.md, C39).

Both take the KV-cache groups' block tables as vLLM does, a uint64 tensor of their addresses: a
program loads its group's address and casts it to an int32 pointer. One program per group and
batch row; the gather's rows past ``num_reqs`` and the slot mapping's last row are padding.
No two programs write one element.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _table(addresses, g):
    """Group ``g``'s block table, from the tensor of addresses."""
    return tl.cast(tl.load(addresses + g), tl.pointer_type(tl.int32))


@triton.jit(do_not_specialize=["num_reqs"])
def _gather_block_tables_kernel(
    batch_idx_to_req_idx,  # [num_reqs]
    src_block_table_ptrs,  # [groups] addresses of [max_num_reqs, width] tables
    dst_block_table_ptrs,  # [groups] addresses of [>= rows, width] tables: out
    block_table_strides,  # [groups] each table's width
    num_blocks_ptr,  # [groups, max_num_reqs]
    num_blocks_stride,
    num_reqs,
    num_computed_tokens_ptr,  # [max_num_reqs]
    sliding_window_reach_ptr,  # [groups]
    block_sizes_ptr,  # [groups]
    MASK_SLIDING_WINDOW: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    g = tl.program_id(0)
    b = tl.program_id(1)
    width = tl.load(block_table_strides + g)
    dst = _table(dst_block_table_ptrs, g) + b.to(tl.int64) * width
    if b >= num_reqs:
        # A row padded for CUDA graphs: zeroed whole (the null block). Its own loop variables:
        # compiled Triton gives a name one type across the branches.
        for p0 in tl.range(0, width, BLOCK_SIZE):
            p = p0 + tl.arange(0, BLOCK_SIZE)
            tl.store(dst + p, 0, mask=p < width)
    else:
        s = tl.load(batch_idx_to_req_idx + b).to(tl.int64)
        held = tl.load(num_blocks_ptr + g * num_blocks_stride + s)
        src = _table(src_block_table_ptrs, g) + s * width
        dead = 0
        if MASK_SLIDING_WINDOW:
            # Leading blocks below the sliding window of the request's first scheduled token read
            # as the null block: they may have been freed and reused.
            reach = tl.load(sliding_window_reach_ptr + g)
            first = tl.load(num_computed_tokens_ptr + s, mask=reach > 0, other=0)
            dead = tl.where(reach > 0, tl.maximum(first - reach, 0) // tl.load(block_sizes_ptr + g), 0)
        for c0 in tl.range(0, held, BLOCK_SIZE):
            c = c0 + tl.arange(0, BLOCK_SIZE)
            blocks = tl.load(src + c, mask=(c >= dead) & (c < held), other=0)
            tl.store(dst + c, blocks, mask=c < held)


@triton.jit
def _compute_slot_mappings_kernel(
    max_num_tokens,
    idx_mapping,  # [num_reqs]: negative marks a dummy row
    query_start_loc,  # [num_reqs + 1]
    pos,  # [num_tokens]
    block_table_ptrs,  # [groups] addresses of [max_num_reqs, width] tables
    block_table_strides,  # [groups]
    block_sizes,  # [groups]
    slot_mapping_enabled,  # [groups]
    dcp_sharded,  # [groups]
    slot_mappings_ptr,  # [groups, max_num_tokens] out
    slot_mappings_stride,
    cp_rank,
    CP_SIZE: tl.constexpr,
    CP_INTERLEAVE: tl.constexpr,
    PAD_ID: tl.constexpr,
    TRITON_BLOCK_SIZE: tl.constexpr,
):
    g = tl.program_id(0)
    b = tl.program_id(1)
    num_reqs = tl.num_programs(1) - 1
    out = slot_mappings_ptr + g.to(tl.int64) * slot_mappings_stride
    if b == num_reqs:
        # The tokens past the batch pad up to max_num_tokens, for CUDA graphs.
        tokens = tl.load(query_start_loc + num_reqs)
        for t0 in tl.range(tokens, max_num_tokens, TRITON_BLOCK_SIZE):
            t = t0 + tl.arange(0, TRITON_BLOCK_SIZE)
            tl.store(out + t, PAD_ID, mask=t < max_num_tokens)
    else:
        s = tl.load(idx_mapping + b).to(tl.int64)
        start = tl.load(query_start_loc + b)
        end = tl.load(query_start_loc + b + 1)
        size = tl.load(block_sizes + g)
        enabled = tl.load(slot_mapping_enabled + g) != 0
        row = _table(block_table_ptrs, g) + s * tl.load(block_table_strides + g)
        for i0 in tl.range(start, end, TRITON_BLOCK_SIZE):
            i = i0 + tl.arange(0, TRITON_BLOCK_SIZE)
            inside = i < end
            p = tl.load(pos + i, mask=inside, other=0).to(tl.int64)
            if CP_SIZE == 1:
                local = p
                mine = inside
            else:
                # A sharded group's virtual block of size * CP_SIZE tokens deals runs of
                # CP_INTERLEAVE tokens to the ranks in turn; this rank keeps its own, packed.
                sharded = tl.load(dcp_sharded + g) != 0
                offset = p % (size * CP_SIZE)
                packed = (offset // (CP_INTERLEAVE * CP_SIZE)) * CP_INTERLEAVE + offset % CP_INTERLEAVE
                local = tl.where(sharded, (p // (size * CP_SIZE)) * size + packed, p)
                mine = inside & (~sharded | ((offset // CP_INTERLEAVE) % CP_SIZE == cp_rank))
            # tl.where, not &: the interpreter's & of a block and a scalar bool is no mask dtype.
            written = tl.where(mine, enabled & (s >= 0), False)
            blocks = tl.load(row + local // size, mask=written, other=0)
            slots = blocks.to(tl.int64) * size + local % size
            tl.store(out + i, tl.where(written, slots, PAD_ID), mask=inside)
