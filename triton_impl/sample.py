"""Triton kernels of Model Runner V2's sampling parameters, with vLLM 0.33.0's names, parameters and
grids (docs/sample.md, C41).

``_temperature_kernel``: one program per row and vocabulary tile; ``_min_p_kernel``: one program per
row, two passes over it (the maximum, then the mask). No two programs write one element.
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_impl.gumbel import div_by, log32, reciprocal


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
