"""Triton kernels of the FLy pre-pass, with vLLM 0.33.0's names, parameters and grid ``(B,)``.

Departures from 0.33.0's bodies, each a contract requirement (docs/fly.md): the random pre-pass
divides with IEEE rounding (C6); the threshold is cast to float32 in the kernel, so that the
interpreter (which keeps a Python float outside float32's normal range as float64) compares as
compiled code does (C33); and a position's window is examined only when the position could
defer, so that the work is linear in the drafts whatever FLY_WINDOW_SIZE is.
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_impl.rejection import request_span


@triton.jit
def apply_fly_greedy_acceptance_kernel(
    cu_num_draft_tokens_ptr,  # [B] int32/int64, inclusive cumulative draft counts
    draft_token_ids_ptr,  # [T] int32/int64
    target_argmax_ptr,  # [T] int64 (int32 accepted), read and rewritten
    target_logits_ptr,  # [T, V] float32, rows of stride vocab_size
    fly_entropy_ptr,  # [T] float32
    is_greedy_ptr,  # [B] bool, or None when every row is greedy
    vocab_size,  # V
    fly_entropy_threshold,  # float, compared in float32
    FLY_WINDOW_SIZE: tl.constexpr,  # W
):
    req_idx = tl.program_id(0)
    if is_greedy_ptr is None:
        is_greedy = True
    else:
        is_greedy = tl.load(is_greedy_ptr + req_idx)
    if not is_greedy:
        return

    start_idx, num_draft_tokens = request_span(cu_num_draft_tokens_ptr, req_idx)
    threshold = tl.cast(fly_entropy_threshold, tl.float32)
    for pos in range(num_draft_tokens):
        token_idx = start_idx + pos
        draft_token_id = tl.load(draft_token_ids_ptr + token_idx).to(tl.int64)
        target_token_id = tl.load(target_argmax_ptr + token_idx).to(tl.int64)
        entropy = tl.load(fly_entropy_ptr + token_idx)
        valid = (draft_token_id >= 0) & (draft_token_id < vocab_size)
        can_defer = (draft_token_id != target_token_id) & valid & (pos + FLY_WINDOW_SIZE < num_draft_tokens)
        can_defer = can_defer & (entropy >= threshold)  # NaN never defers
        if can_defer:
            draft_logit = tl.load(target_logits_ptr + token_idx * vocab_size + draft_token_id)
            can_defer = draft_logit > float("-inf")
            # Later positions still hold the launch's values: a program writes only the one it decides.
            for offset in range(1, FLY_WINDOW_SIZE + 1):
                future_draft_id = tl.load(draft_token_ids_ptr + token_idx + offset).to(tl.int64)
                future_target_id = tl.load(target_argmax_ptr + token_idx + offset).to(tl.int64)
                can_defer = can_defer & (future_draft_id == future_target_id)
            if can_defer:
                tl.store(target_argmax_ptr + token_idx, draft_token_id)


@triton.jit
def _native_acceptance(
    draft_token_ids_ptr, draft_probs_ptr, target_probs_ptr, uniform_probs_ptr, vocab_size, token_idx,
    NO_DRAFT_PROBS: tl.constexpr,
):
    """(K2 accepts the draft at ``token_idx``, the draft is valid with q > 0 and p > 0)."""
    draft_token_id = tl.load(draft_token_ids_ptr + token_idx).to(tl.int64)
    valid = (draft_token_id >= 0) & (draft_token_id < vocab_size)
    cell = token_idx * vocab_size + draft_token_id
    target_prob = tl.load(target_probs_ptr + cell, mask=valid, other=0.0)
    if NO_DRAFT_PROBS:
        readable = valid  # q = 1
        ratio = target_prob  # p / 1 is exact
    else:
        draft_prob = tl.load(draft_probs_ptr + cell, mask=valid, other=0.0)
        readable = valid & (draft_prob > 0)
        ratio = tl.math.div_rn(target_prob, draft_prob)  # IEEE-rounded float32 (C6)
    uniform_prob = tl.load(uniform_probs_ptr + token_idx)
    accepted = readable & (ratio >= uniform_prob)  # float32 widened exactly against float64 (C7)
    return accepted, readable & (target_prob > 0)


@triton.jit
def apply_fly_random_acceptance_kernel(
    cu_num_draft_tokens_ptr,  # [B] int32/int64, inclusive
    draft_token_ids_ptr,  # [T] int32/int64
    draft_probs_ptr,  # [T, V] float32 q, or None
    target_probs_ptr,  # [T, V] float32 p
    uniform_probs_ptr,  # [T] float64, read and rewritten
    fly_entropy_ptr,  # [T] float32
    is_greedy_ptr,  # [B] bool: rows this kernel skips
    vocab_size,  # V
    fly_entropy_threshold,  # float, compared in float32
    NO_DRAFT_PROBS: tl.constexpr,  # q = 1
    FLY_WINDOW_SIZE: tl.constexpr,  # W
):
    req_idx = tl.program_id(0)
    if tl.load(is_greedy_ptr + req_idx):
        return

    start_idx, num_draft_tokens = request_span(cu_num_draft_tokens_ptr, req_idx)
    threshold = tl.cast(fly_entropy_threshold, tl.float32)
    for pos in range(num_draft_tokens):
        token_idx = start_idx + pos
        accepted, plausible = _native_acceptance(draft_token_ids_ptr, draft_probs_ptr, target_probs_ptr,
                                                 uniform_probs_ptr, vocab_size, token_idx, NO_DRAFT_PROBS)
        entropy = tl.load(fly_entropy_ptr + token_idx)
        can_defer = ~accepted & plausible & (pos + FLY_WINDOW_SIZE < num_draft_tokens) & (entropy >= threshold)
        if can_defer:
            for offset in range(1, FLY_WINDOW_SIZE + 1):
                future_accepted, _unused = _native_acceptance(draft_token_ids_ptr, draft_probs_ptr, target_probs_ptr,
                                                              uniform_probs_ptr, vocab_size, token_idx + offset,
                                                              NO_DRAFT_PROBS)
                can_defer = can_defer & future_accepted
            if can_defer:
                tl.store(uniform_probs_ptr + token_idx, 0.0)
