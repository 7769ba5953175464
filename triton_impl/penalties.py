"""Triton kernels of Model Runner V2's penalties, with vLLM 0.33.0's names, parameters and grids
(docs/penalties.md, C42).

``_penalties_kernel``: one program per row and vocabulary tile, in place; a row without penalty is
neither read nor written. ``_bincount_kernel``: one program per new request and tile of its prefill,
OR-ing prompt bits and adding output counts with atomics (two programs may touch one word or count:
a row's tiles share its state's tables, and two rows may name one state). Every product that feeds a
subtraction is rounded first (C42), whether or not the compiler would fuse them.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rounded(product, x):
    # The product as computed (rounded once): the select between it and the subtraction that follows
    # keeps compiled code from fusing the two into an fma (x, a logit, is never NaN where it is read).
    return tl.where(x == x, product, x)


@triton.jit
def _penalties_kernel(
    logits_ptr,  # [T, >= V] float32, in place
    logits_stride,
    expanded_idx_mapping_ptr,  # [T] request state per row
    token_ids_ptr,  # [T] the step's input tokens; a request's drafts at its local positions 1..K
    expanded_local_pos_ptr,  # [T] each row's local position
    repetition_penalty_ptr,  # [max_num_reqs] float32
    frequency_penalty_ptr,  # [max_num_reqs] float32
    presence_penalty_ptr,  # [max_num_reqs] float32
    prompt_bin_mask_ptr,  # [max_num_reqs, >= cdiv(V, 32)] int32 words
    prompt_bin_mask_stride,
    output_bin_counts_ptr,  # [max_num_reqs, >= V] int32
    output_bin_counts_stride,
    vocab_size,
    BLOCK_SIZE: tl.constexpr,  # a power of two >= 32: whole bitmask words per tile
):
    token_idx = tl.program_id(0).to(tl.int64)
    req = tl.load(expanded_idx_mapping_ptr + token_idx).to(tl.int64)
    rep = tl.load(repetition_penalty_ptr + req)
    freq = tl.load(frequency_penalty_ptr + req)
    pres = tl.load(presence_penalty_ptr + req)
    use_rep = rep != 1.0
    if use_rep | (freq != 0.0) | (pres != 0.0):
        block_idx = tl.program_id(1)
        block = block_idx * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = block < vocab_size
        at = logits_ptr + token_idx * logits_stride + block
        x = tl.load(at, mask=mask, other=0.0)
        count = tl.load(output_bin_counts_ptr + req * output_bin_counts_stride + block, mask=mask, other=0)
        # The earlier drafts token_ids[token_idx - pos + 1 .. token_idx] count as output tokens.
        pos = tl.load(expanded_local_pos_ptr + token_idx).to(tl.int64)
        first = token_idx - pos + 1
        for i in range(0, pos):
            draft = tl.load(token_ids_ptr + first + i)
            count += (block == draft).to(tl.int32)
        seen = count > 0
        if use_rep:
            words = block_idx * (BLOCK_SIZE // 32) + tl.arange(0, BLOCK_SIZE // 32)
            packed = tl.load(prompt_bin_mask_ptr + req * prompt_bin_mask_stride + words,
                             mask=words < tl.cdiv(vocab_size, 32), other=0)
            # Bit b of word w is column 32 w + b: an arithmetic shift keeps bit b in place for bit 31 too.
            in_prompt = tl.reshape((packed[:, None] >> tl.arange(0, 32)[None, :]) & 1, (BLOCK_SIZE,)) != 0
            hit = in_prompt | seen
            # vLLM's 1.0 / scale, rounded to nearest (div_rn: compiled `/` is approximate), then a product.
            factor = tl.where(x > 0, tl.where(hit, tl.math.div_rn(1.0, rep), 1.0), tl.where(hit, rep, 1.0))
            x = _rounded(x * factor, x)
        x = x - _rounded(freq * count.to(tl.float32), x)
        # presence x {0, 1}: the penalty or a signed zero, exact, so fused or not the difference rounds once.
        x = x - pres * seen.to(tl.float32)
        tl.store(at, x, mask=mask)


@triton.jit
def _bincount_kernel(
    expanded_idx_mapping_ptr,  # [N] the new requests' states
    all_token_ids_ptr,  # [max_num_reqs, max_model_len]
    all_token_ids_stride,
    prompt_len_ptr,  # [max_num_reqs]
    prefill_len_ptr,  # [max_num_reqs]
    prompt_bin_mask_ptr,  # [max_num_reqs, cdiv(V, 32)] int32, OR-ed in
    prompt_bin_mask_stride,
    output_bin_counts_ptr,  # [max_num_reqs, V] int32, added to
    output_bin_counts_stride,
    BLOCK_SIZE: tl.constexpr,
):
    token_idx = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * BLOCK_SIZE
    req = tl.load(expanded_idx_mapping_ptr + token_idx).to(tl.int64)
    prefill_len = tl.load(prefill_len_ptr + req)
    if start < prefill_len:  # a tile past this row's prefill (the grid covers the longest) does nothing
        prompt_len = tl.load(prompt_len_ptr + req)
        block = start + tl.arange(0, BLOCK_SIZE)
        in_prefill = block < prefill_len
        in_prompt = block < prompt_len
        tokens = tl.load(all_token_ids_ptr + req * all_token_ids_stride + block, mask=in_prefill, other=0)
        bit = tl.full((BLOCK_SIZE,), 1, tl.int32) << (tokens % 32).to(tl.int32)  # bit 31: a negative word
        tl.atomic_or(prompt_bin_mask_ptr + req * prompt_bin_mask_stride + tokens // 32, bit, mask=in_prompt)
        tl.atomic_add(output_bin_counts_ptr + req * output_bin_counts_stride + tokens, 1, mask=in_prefill & ~in_prompt)
