"""Triton kernels of Model Runner V2's sampling parameters, with vLLM 0.33.0's names, parameters and
grids (docs/sample.md, C41).

``_temperature_kernel``: one program per row and vocabulary tile; ``_min_p_kernel``: one program per
row, two passes over it (the maximum, then the mask); ``_gumbel_sample_kernel``: one program per row
and tile, writing the tile's winner and score (and its share of the row's cache copy). No two
programs write one element.
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_impl.gumbel import (
    div_by,
    gumbel32,
    gumbel32_above,
    gumbel64,
    log32,
    murmur3_hash32,
    murmur3_uniform32,
    murmur3_uniform64,
    reciprocal,
    spec_step_seed,
)


@triton.jit
def _temperature_kernel(
    logits_ptr,  # [T, >= V] in place
    logits_stride,
    expanded_idx_mapping_ptr,  # [T]
    temperature_ptr,  # [max_num_reqs]
    vocab_size,
    BLOCK_SIZE: tl.constexpr,
):
    token_idx = tl.program_id(0).to(tl.int64)
    req_state_idx = tl.load(expanded_idx_mapping_ptr + token_idx)
    temperature = tl.load(temperature_ptr + req_state_idx).to(tl.float32)
    if (temperature != 0.0) & (temperature != 1.0):
        block = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = block < vocab_size
        at = logits_ptr + token_idx * logits_stride + block
        x = tl.load(at, mask=mask, other=1.0)
        # IEEE division (C41): vLLM's `/` is approximate when compiled (<= 2 ulp).
        tl.store(at, div_by(x, temperature, reciprocal(temperature)), mask=mask)


@triton.jit
def _min_p_kernel(
    logits_ptr,  # [T, >= V] in place
    logits_stride,
    expanded_idx_mapping_ptr,  # [T]
    min_p_ptr,  # [max_num_reqs]
    vocab_size,
    BLOCK_SIZE: tl.constexpr,
):
    token_idx = tl.program_id(0).to(tl.int64)
    req_state_idx = tl.load(expanded_idx_mapping_ptr + token_idx)
    min_p = tl.load(min_p_ptr + req_state_idx).to(tl.float32)
    if min_p != 0.0:
        row = logits_ptr + token_idx * logits_stride
        top = tl.full((BLOCK_SIZE,), float("-inf"), tl.float32)
        for i in range(0, vocab_size, BLOCK_SIZE):
            block = i + tl.arange(0, BLOCK_SIZE)
            top = tl.maximum(top, tl.load(row + block, mask=block < vocab_size, other=float("-inf")))
        # C29's log, one float32 addition (C41); vLLM's tl.log is approximate when compiled.
        threshold = tl.max(top) + log32(min_p)
        for i in range(0, vocab_size, BLOCK_SIZE):
            block = i + tl.arange(0, BLOCK_SIZE)
            mask = block < vocab_size
            x = tl.load(row + block, mask=mask, other=float("-inf"))
            tl.store(row + block, tl.where(x < threshold, float("-inf"), x), mask=mask)


# Columns scored together where the kernel skips (below): 8 rows of a 1024-wide tile.
SAMPLE_ROW = tl.constexpr(128)


@triton.jit
def _sample_tile(row_ptr, base, vocab_size, temp, seed, pos, WIDTH: tl.constexpr, APPLY_TEMPERATURE: tl.constexpr,
                 USE_FP64: tl.constexpr):
    # K38's scores of columns [base, base + WIDTH): their best and its first index among them.
    cols = base + tl.arange(0, WIDTH)
    mask = cols < vocab_size
    # -0.0 reads as +0.0 (C30): a tile's maximum is never ambiguous.
    x = tl.load(row_ptr + cols, mask=mask, other=float("-inf")).to(tl.float32) + 0.0
    if (temp != 0.0) & APPLY_TEMPERATURE:
        x = div_by(x, temp, reciprocal(temp))  # IEEE division (C41)
    if USE_FP64:
        x = x.to(tl.float64)
    if temp != 0.0:
        if USE_FP64:
            noise = gumbel64(murmur3_uniform64(seed, pos, cols))
        else:
            noise = gumbel32(murmur3_uniform32(seed, pos, cols))
        x = tl.where(mask, x + noise, float("-inf"))
    return tl.max(x, axis=0, return_indices=True)


@triton.jit
def _gumbel_sample_kernel(
    local_argmax_ptr,  # [T, NB] out
    local_argmax_stride,
    local_max_ptr,  # [T, NB] out
    local_max_stride,
    logits_cache_ptr,  # [max_num_reqs, num_cols, >= V] or None
    logits_cache_stride_0,
    logits_cache_stride_1,
    logits_cache_col_ptr,  # [1] or [T]
    logits_cache_source_ptr,  # [T, >= V]
    logits_cache_source_stride,
    logits_ptr,  # [T, >= V]
    logits_stride,
    expanded_idx_mapping_ptr,  # [T]; negative: a padding row
    seeds_ptr,  # [max_num_reqs]
    pos_ptr,  # [T]
    temp_ptr,  # [max_num_reqs]
    vocab_size,
    BLOCK_SIZE: tl.constexpr,
    IS_DRAFTING: tl.constexpr,
    APPLY_TEMPERATURE: tl.constexpr,
    USE_FP64: tl.constexpr,
    PER_TOKEN_COL: tl.constexpr,
):
    token_idx = tl.program_id(0).to(tl.int64)
    block_idx = tl.program_id(1)
    base = block_idx * BLOCK_SIZE
    row_ptr = logits_ptr + token_idx * logits_stride
    req = tl.load(expanded_idx_mapping_ptr + token_idx).to(tl.int64)
    valid = req >= 0
    temp = tl.load(temp_ptr + req, mask=valid, other=0.0).to(tl.float32)
    seed = tl.load(seeds_ptr + req, mask=valid, other=0)
    if logits_cache_ptr is not None:
        if PER_TOKEN_COL:
            col = tl.load(logits_cache_col_ptr + token_idx)
        else:
            col = tl.load(logits_cache_col_ptr)
        copied = base + tl.arange(0, BLOCK_SIZE)
        in_row = copied < vocab_size
        raw = tl.load(logits_cache_source_ptr + token_idx * logits_cache_source_stride + copied, mask=in_row)
        at = logits_cache_ptr + req * logits_cache_stride_0 + col * logits_cache_stride_1 + copied
        # The row's validity as a block: the interpreter refuses a block mask & a scalar bool.
        tl.store(at, raw, mask=in_row & ((copied * 0).to(tl.int64) + req >= 0))
        seed = spec_step_seed(seed, col)
    pos = tl.load(pos_ptr + token_idx).to(tl.int64)
    if IS_DRAFTING:
        pos = pos + 1073741824  # 2**30: the draft's stream apart from the target's
    if USE_FP64 or BLOCK_SIZE <= SAMPLE_ROW or BLOCK_SIZE > 64 * SAMPLE_ROW:  # the skip's rows: 2 to 64
        value, idx = _sample_tile(row_ptr, base, vocab_size, temp, seed, pos, BLOCK_SIZE, APPLY_TEMPERATURE, USE_FP64)
    elif temp == 0.0:  # greedy or padding: the plain argmax, no noise
        value, idx = _sample_tile(row_ptr, base, vocab_size, temp, seed, pos, BLOCK_SIZE, APPLY_TEMPERATURE, False)
    else:
        # float32 noise: every lane's score is bounded in a few operations (gumbel32_above of its
        # hash, tests/test_gumbel.py), and the exact score (the noise's two logs) is computed only
        # for the rows of SAMPLE_ROW columns whose bound reaches the best score found: the row of the
        # highest bound first, then the rows that can still match it. A row not scored holds no lane
        # that could be the tile's first maximum (as K17's skip, triton_impl/mrv2.py).
        rows = tl.arange(0, BLOCK_SIZE // SAMPLE_ROW)
        cols = base + rows[:, None] * SAMPLE_ROW + tl.arange(0, SAMPLE_ROW)[None, :]
        lanes = cols < vocab_size
        x = tl.load(row_ptr + cols, mask=lanes, other=float("-inf")).to(tl.float32) + 0.0
        if APPLY_TEMPERATURE:
            x = div_by(x, temp, reciprocal(temp))
        above = tl.where(lanes, x + gumbel32_above(murmur3_hash32(seed, pos, cols)), float("-inf"))
        row_above = tl.max(above, axis=1)
        first = tl.argmax(row_above, axis=0, tie_break_left=True)
        value, i = _sample_tile(row_ptr, base + first * SAMPLE_ROW, vocab_size, temp, seed, pos, SAMPLE_ROW, APPLY_TEMPERATURE, False)
        idx = first * SAMPLE_ROW + i
        rest = tl.sum(tl.where((rows != first) & (row_above > float("-inf")) & (row_above >= value),
                               tl.full(rows.shape, 1, tl.int64) << rows, 0))
        for s in range(BLOCK_SIZE // SAMPLE_ROW):
            if ((rest >> s) & 1) != 0:
                v, i = _sample_tile(row_ptr, base + s * SAMPLE_ROW, vocab_size, temp, seed, pos, SAMPLE_ROW, APPLY_TEMPERATURE, False)
                i = s * SAMPLE_ROW + i
                better = (v > value) | ((v == value) & (i < idx))
                value = tl.where(better, v, value)
                idx = tl.where(better, i, idx)
        idx = tl.where(value == float("-inf"), 0, idx)  # every score -inf: the tile's first index
    tl.store(local_argmax_ptr + token_idx * local_argmax_stride + block_idx, base + idx)
    tl.store(local_max_ptr + token_idx * local_max_stride + block_idx, value)
