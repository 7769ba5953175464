"""Triton kernel of Model Runner V2's logit bias, with vLLM 0.33.0's name, parameters and grid
(docs/logit_bias.md, C44).

``_bias_kernel``: one program per row, three steps (allowed ids, bias, min tokens). A list's lanes
are spread over the program's warps, so one column may be stored by one lane and read by another: a
barrier separates every store from the reads that must see it, inside a step and between steps.
(Interpreted, and on vLLM's CPU platform where tl.debug_barrier is a no-op, a program runs its
operations in order and needs none.)
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _bias_kernel(
    logits_ptr,  # [T, >= V] float32, in place
    logits_stride,
    vocab_size,
    expanded_idx_mapping_ptr,  # [T] request state of each row
    # Allowed token ids.
    num_allowed_token_ids_ptr,  # [max_num_reqs]
    allowed_token_ids_ptr,  # [max_num_reqs, 1024]
    allowed_token_ids_stride,
    # Logit bias.
    num_logit_bias_ptr,  # [max_num_reqs]
    bias_token_ids_ptr,  # [max_num_reqs, 1024] distinct ids
    bias_token_ids_stride,
    bias_ptr,  # [max_num_reqs, 1024] float32
    bias_stride,
    # Min tokens.
    pos_ptr,  # [T] each row's position
    min_lens_ptr,  # [max_num_reqs] prompt length + min_tokens
    num_stop_token_ids_ptr,  # [max_num_reqs]
    restore_when_all_masked_ptr,  # [max_num_reqs] nonzero: restore a row masked whole
    stop_token_ids_ptr,  # [max_num_reqs, 128]
    stop_token_ids_stride,
    BLOCK_SIZE: tl.constexpr,  # a list's lanes (>= every count)
    LOGITS_BLOCK_SIZE: tl.constexpr,  # a row's tile
    CHECK_ALL_MASKED_ROWS: tl.constexpr,  # any request of the batch may restore
):
    token_idx = tl.program_id(0).to(tl.int64)
    state = tl.load(expanded_idx_mapping_ptr + token_idx).to(tl.int64)
    row = logits_ptr + token_idx * logits_stride
    lane = tl.arange(0, BLOCK_SIZE)

    # 1. Allowed token ids: keep the listed columns, mask the rest.
    num_allowed = tl.load(num_allowed_token_ids_ptr + state)
    if num_allowed > 0:
        listed = lane < num_allowed
        ids = tl.load(allowed_token_ids_ptr + state * allowed_token_ids_stride + lane, mask=listed, other=0)
        kept = tl.load(row + ids, mask=listed, other=0.0)
        tl.debug_barrier()  # every kept value read before the mask
        for start in range(0, vocab_size, LOGITS_BLOCK_SIZE):
            cols = start + tl.arange(0, LOGITS_BLOCK_SIZE)
            tl.store(row + cols, float("-inf"), mask=cols < vocab_size)
        tl.debug_barrier()  # the mask lands before the kept values
        tl.store(row + ids, kept, mask=listed)
    tl.debug_barrier()  # step 1's stores before step 2 reads a column another lane wrote

    # 2. Logit bias: one float32 addition at each listed (distinct) column.
    num_bias = tl.load(num_logit_bias_ptr + state)
    if num_bias > 0:
        listed = lane < num_bias
        ids = tl.load(bias_token_ids_ptr + state * bias_token_ids_stride + lane, mask=listed, other=0)
        b = tl.load(bias_ptr + state * bias_stride + lane, mask=listed, other=0.0)
        x = tl.load(row + ids, mask=listed, other=0.0)
        tl.store(row + ids, x + b, mask=listed)
    tl.debug_barrier()  # step 2's stores before step 3 reads or masks them

    # 3. Min tokens: no stop token while pos + 1 < min_len.
    num_stop = tl.load(num_stop_token_ids_ptr + state)
    pos = tl.load(pos_ptr + token_idx)
    min_len = tl.load(min_lens_ptr + state)
    if (num_stop > 0) & (pos + 1 < min_len):
        listed = lane < num_stop
        ids = tl.load(stop_token_ids_ptr + state * stop_token_ids_stride + lane, mask=listed, other=0)
        if CHECK_ALL_MASKED_ROWS:
            restore = tl.load(restore_when_all_masked_ptr + state)
        else:
            restore = 0
        if restore != 0:
            saved = tl.load(row + ids, mask=listed, other=float("-inf"))
            tl.debug_barrier()  # every stop value saved before the mask
            tl.store(row + ids, float("-inf"), mask=listed)
            tl.debug_barrier()  # the mask lands before the scan reads the row
            top = tl.full((LOGITS_BLOCK_SIZE,), float("-inf"), tl.float32)
            for start in range(0, vocab_size, LOGITS_BLOCK_SIZE):
                cols = start + tl.arange(0, LOGITS_BLOCK_SIZE)
                top = tl.maximum(top, tl.load(row + cols, mask=cols < vocab_size, other=float("-inf")))
            if tl.max(top) == float("-inf"):  # masked whole: the finite saved values come back
                finite = (saved > float("-inf")) & (saved < float("inf"))
                tl.store(row + ids, saved, mask=listed & finite)
        else:
            tl.store(row + ids, float("-inf"), mask=listed)
