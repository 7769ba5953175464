"""Triton kernels of Model Runner V2's logprob kernels, with vLLM 0.33.0's names, parameters and grids
(docs/logprob.md, C45). One program per row for all three; no two programs write one element.
Offsets are formed in int64 (C4).
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_impl.gumbel import exp_units, units_to_float

# Levels of the stack that sums a row's tiles in C29's tree: a row has fewer than 2^31 tiles.
TREE_LEVELS = tl.constexpr(32)


@triton.jit
def _tile_sum(row, tile, g, vocab_size, BLOCK_SIZE: tl.constexpr):
    # C29's exact sum of exp32(x - g) over tile `tile` (columns past V add nothing), as float32.
    cols = tile * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    x = tl.load(row + cols, mask=cols < vocab_size, other=float("-inf")).to(tl.float32)
    return units_to_float(tl.sum(exp_units(x - g), axis=0))


@triton.jit
def _bit_reversed(p, depth):
    # p's low `depth` bits in reverse order (p < 2^depth <= 2^31): the 32 bits reversed by swapping
    # halves, then quarters, ... then shifted down to `depth` bits.
    x = tl.cast(p, tl.uint32)
    x = ((x >> 1) & 0x55555555) | ((x & 0x55555555) << 1)
    x = ((x >> 2) & 0x33333333) | ((x & 0x33333333) << 2)
    x = ((x >> 4) & 0x0F0F0F0F) | ((x & 0x0F0F0F0F) << 4)
    x = ((x >> 8) & 0x00FF00FF) | ((x & 0x00FF00FF) << 8)
    x = (x >> 16) | (x << 16)
    return tl.where(depth > 0, x >> (32 - tl.maximum(depth, 1)).to(tl.uint32), 0).to(tl.int32)


@triton.jit
def _log_sum_exp(row, g, vocab_size, BLOCK_SIZE: tl.constexpr):
    # C29's log-sum-exp of the row's tiles, every tile at the row's maximum g: RN(log(tree_sum(tile
    # sums))). tree_sum folds a power-of-two width w in halves (x[i] + x[i + w/2]); read in bit-reversed
    # order of tile index, that tree pairs neighbours, so the tiles are summed as they are computed,
    # a binary counter keeping one partial sum per level (level l: 2^l tiles). The number of tiles is
    # a runtime value here (vLLM's kernel takes no padded width), so no vector of tiles is formed.
    nb = (vocab_size + BLOCK_SIZE - 1) // BLOCK_SIZE
    depth = 0  # log2 of the tree's width: the least w = 2^depth >= nb
    for b in tl.static_range(31):
        depth += ((1 << b) < nb).to(tl.int32)
    levels = tl.arange(0, TREE_LEVELS)
    stack = tl.zeros((TREE_LEVELS,), tl.float64)
    total = tl.full((), 0.0, tl.float64)
    for p in range(0, tl.full((), 1, tl.int64) << depth):  # int64: 2^31 tiles of one column fit
        tile = _bit_reversed(p, depth)
        total = tl.full((), 0.0, tl.float64)
        if tile < nb:  # the padding's tiles add 0.0: x + 0.0 is x for the sums here (>= 0)
            total = _tile_sum(row, tile, g, vocab_size, BLOCK_SIZE).to(tl.float64)
        # Each trailing one of p closes a subtree: add the partial sum waiting at that level.
        level = 0
        q = p
        while (q & 1) == 1:
            total = tl.sum(tl.where(levels == level, stack, 0.0), axis=0) + total  # one value and zeros: exact
            level += 1
            q = q >> 1
        stack = tl.where(levels == level, total, stack)
    return tl.log(total).to(tl.float32)  # the last p closed the root


@triton.jit
def _topk_log_softmax_kernel(
    output_ptr,  # [B, topk] float32 out, row r at r * topk
    logits_ptr,  # [B, >= V] float32, bfloat16 or float16
    logits_stride,
    topk_ids_ptr,  # [B, >= topk] int64 (int32 accepted)
    topk_ids_stride,
    topk,
    vocab_size,
    BLOCK_SIZE: tl.constexpr,
    TOPK_BLOCK_SIZE: tl.constexpr,
):
    req_idx = tl.program_id(0).to(tl.int64)
    if topk > 0:  # nothing to write: the row is not read (its values are outside C45's domain then)
        row = logits_ptr + req_idx * logits_stride
        top = tl.full((BLOCK_SIZE,), float("-inf"), tl.float32)
        for i in range(0, vocab_size, BLOCK_SIZE):
            cols = i + tl.arange(0, BLOCK_SIZE)
            top = tl.maximum(top, tl.load(row + cols, mask=cols < vocab_size, other=float("-inf")).to(tl.float32))
        g = tl.max(top, axis=0) + 0.0  # -0.0 reads as +0.0 (C30)
        lse = _log_sum_exp(row, g, vocab_size, BLOCK_SIZE)
        for j in range(0, topk, TOPK_BLOCK_SIZE):
            k = j + tl.arange(0, TOPK_BLOCK_SIZE)
            mask = k < topk
            ids = tl.load(topk_ids_ptr + req_idx * topk_ids_stride + k, mask=mask, other=0)
            x = tl.load(row + ids, mask=mask, other=0.0).to(tl.float32)
            tl.store(output_ptr + req_idx * topk + k, (x - g) - lse, mask=mask)


@triton.jit
def _ranks_kernel(
    output_ptr,  # [B] int64 out
    logits_ptr,  # [B, >= V] float32, bfloat16 or float16
    logits_stride,
    token_ids_ptr,  # [B] int64 (int32 accepted)
    vocab_size,
    BLOCK_SIZE: tl.constexpr,
):
    req_idx = tl.program_id(0).to(tl.int64)
    row = logits_ptr + req_idx * logits_stride
    x = tl.load(row + tl.load(token_ids_ptr + req_idx)).to(tl.float32)
    n = tl.zeros((BLOCK_SIZE,), tl.int32)
    for i in range(0, vocab_size, BLOCK_SIZE):
        cols = i + tl.arange(0, BLOCK_SIZE)
        inside = cols < vocab_size
        logits = tl.load(row + cols, mask=inside, other=0.0).to(tl.float32)
        # Only columns [0, V) count: a padding lane at -inf would tie with a token at -inf.
        n += ((logits >= x) & inside).to(tl.int32)
    tl.store(output_ptr + req_idx, tl.sum(n, axis=0).to(tl.int64))


@triton.jit
def _fill_logprob_token_ids_kernel(
    out_token_ids_ptr,  # [B, 1 + num_cols] int64 in/out
    out_token_ids_stride,
    out_valid_mask_ptr,  # [B, 1 + num_cols] bool in/out
    out_valid_mask_stride,
    sampled_token_ids_ptr,  # [B]
    topk_indices_ptr,  # [B, NUM_TOPK]; never read when NUM_TOPK == 0
    topk_indices_stride,
    expanded_idx_mapping_ptr,  # [B]
    num_per_req_token_ids_ptr,  # [max_num_reqs]
    per_req_token_ids_ptr,  # [max_num_reqs, 128]
    per_req_token_ids_stride,
    NUM_TOPK: tl.constexpr,
    PADDED_COLS: tl.constexpr,
):
    batch_idx = tl.program_id(0).to(tl.int64)
    ids_row = out_token_ids_ptr + batch_idx * out_token_ids_stride
    valid_row = out_valid_mask_ptr + batch_idx * out_valid_mask_stride
    tl.store(ids_row, tl.load(sampled_token_ids_ptr + batch_idx).to(tl.int64))
    tl.store(valid_row, 1)
    req_state_idx = tl.load(expanded_idx_mapping_ptr + batch_idx).to(tl.int64)
    num_custom = tl.load(num_per_req_token_ids_ptr + req_state_idx)
    col = tl.arange(0, PADDED_COLS)
    if num_custom > 0:  # the request's own ids replace the top-k
        valid = col < num_custom
        tokens = tl.load(per_req_token_ids_ptr + req_state_idx * per_req_token_ids_stride + col, mask=valid, other=0).to(tl.int64)
    else:
        valid = col < NUM_TOPK  # NUM_TOPK == 0: nothing read, nothing written
        tokens = tl.load(topk_indices_ptr + batch_idx * topk_indices_stride + col, mask=valid, other=0).to(tl.int64)
    tl.store(ids_row + 1 + col, tokens, mask=valid)
    tl.store(valid_row + 1 + col, tl.full((PADDED_COLS,), 1, tl.int1), mask=valid)
