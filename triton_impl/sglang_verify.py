"""Triton kernels of SGLang's speculative verification, with SGLang 0.5.23's names, parameters and
grids (docs/sglang_verify.md, C46-C47).

``speculative_sampling_classic_kernel`` (K46): one program per request; the chain's decisions are
scalar, the final draw two passes over the row in BLOCK_V tiles of C29's fixed-point units (int64:
a tile's sum and prefix sums are exact, so no result depends on the tile or the reduction order).
``verify_tree_greedy_kernel_triton`` (K47): one program per request, walking its tree.
K48 (``tree_speculative_sampling_target_only``) is a CUDA kernel behind a host binding in SGLang, with
no Triton form to mirror: the oracle and the C++ port specify it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_impl.gumbel import fixed46, units_to_float


@triton.jit
def _rounded_product(scale, p):
    # RN(scale * p): the select keeps compiled code from fusing the product into the subtraction
    # after it (an fma would skip its rounding); p is never NaN (a precondition).
    return tl.where(p == p, scale * p, p)


@triton.jit
def _draw_units(tp_row, dp_row, stride_tp_v, stride_dp_v, start, scale, bonus, VOCAB_SIZE: tl.constexpr,
                BLOCK: tl.constexpr):
    # C46c/C46d: the final draw's weights over columns [start, start + BLOCK) in fixed-point units:
    # p itself for the bonus, else max(RN(scale * p) - q', 0) with q outside [0, 1] counted as 0.
    cols = start + tl.arange(0, BLOCK)
    inside = cols < VOCAB_SIZE
    p = tl.load(tp_row + cols * stride_tp_v, mask=inside, other=0.0)
    if bonus:
        w = p
    else:
        q = tl.load(dp_row + cols * stride_dp_v, mask=inside, other=0.0)
        q = tl.where((q >= 0.0) & (q <= 1.0), q, 0.0)
        diff = _rounded_product(scale, p) - q
        w = tl.where(diff > 0.0, diff, 0.0)  # NaN gives 0 (C16)
    return fixed46(w)


@triton.jit
def speculative_sampling_classic_kernel(
    Predicts,  # [bs * n] out: tokens by tree slot
    AcceptIndex,  # [bs, NUM_SLOTS] out: the accepted path's slots (RetriveIndex's strides)
    AcceptTokenNum,  # [bs] out: accepted drafts
    Candidates,  # [bs, NUM_SLOTS] the root and the drafts
    RetriveIndex,  # [bs, NUM_SLOTS] each node's slot
    UniformSamples,  # [bs, >= NUM_SLOTS - 1] float32 coins
    UniformSamplesFinal,  # [bs] float32: the final draw's coin
    TargetProbs,  # [bs, >= NUM_SLOTS, V] float32 p
    DraftProbs,  # [bs, >= NUM_SLOTS - 1, V] float32 q
    stride_cand_b,
    stride_cand_s,
    stride_idx_b,
    stride_idx_s,
    stride_uni_b,
    stride_uni_s,
    stride_tp_b,
    stride_tp_s,
    stride_tp_v,
    stride_dp_b,
    stride_dp_s,
    stride_dp_v,
    NUM_SLOTS: tl.constexpr,  # the root plus the drafts
    VOCAB_SIZE: tl.constexpr,
    BLOCK_V: tl.constexpr,  # the final draw's tile
    BLOCK_VERIFICATION: tl.constexpr = False,
    BLOCK_REDUCE: tl.constexpr = 4096,  # block verification's mass tile
):
    pid = tl.program_id(0).to(tl.int64)
    cand = Candidates + pid * stride_cand_b
    idx = RetriveIndex + pid * stride_idx_b
    acc = AcceptIndex + pid * stride_idx_b
    uni = UniformSamples + pid * stride_uni_b
    tp = TargetProbs + pid * stride_tp_b
    dp = DraftProbs + pid * stride_dp_b
    last = tl.load(idx).to(tl.int64)
    tl.store(acc, last)
    num = 0
    scale = tl.full((), 1.0, tl.float32)
    total = tl.full((), -1, tl.int64)  # the residual mass's units, where block verification summed them
    if BLOCK_VERIFICATION:
        # C46e: the longest prefix whose ratio h and residual test pass, tried from the longest down.
        for step in tl.static_range(NUM_SLOTS - 1, 0, -1):
            if num == 0:
                h = tl.full((), 1.0, tl.float32)
                for s in tl.static_range(1, step + 1):
                    d = tl.load(cand + s * stride_cand_s).to(tl.int64)
                    p = tl.load(tp + (s - 1) * stride_tp_s + d * stride_tp_v)
                    q = tl.load(dp + (s - 1) * stride_dp_s + d * stride_dp_v)
                    ok = (q > 0.0) & (q <= 1.0)
                    ratio = tl.minimum(tl.math.div_rn(h * p, tl.where(ok, q, 1.0)), 1.0)
                    h = tl.where(ok, ratio, 0.0)
                coin = tl.load(uni + (step - 1) * stride_uni_s)
                if coin < h:
                    accept_prob = h
                    units = tl.full((), -1, tl.int64)
                    if step < NUM_SLOTS - 1:
                        if (h > 0.0) & (h < 1.0):
                            units = tl.full((), 0, tl.int64)
                            for start in range(0, VOCAB_SIZE, BLOCK_REDUCE):
                                cols = start + tl.arange(0, BLOCK_REDUCE)
                                inside = cols < VOCAB_SIZE
                                p_next = tl.load(tp + step * stride_tp_s + cols * stride_tp_v, mask=inside, other=0.0)
                                q_next = tl.load(dp + step * stride_dp_s + cols * stride_dp_v, mask=inside, other=0.0)
                                diff = _rounded_product(h, p_next) - q_next  # the raw q (C46e)
                                units += tl.sum(fixed46(tl.where(diff > 0.0, diff, 0.0)))
                            m = units_to_float(units)
                            accept_prob = tl.math.div_rn(m, (m + 1.0) - h)
                    if coin < accept_prob:
                        num = step
                        scale = h
                        total = units
        for s in range(1, num + 1):
            tl.store(Predicts + last, tl.load(cand + s * stride_cand_s))
            last = tl.load(idx + s * stride_idx_s).to(tl.int64)
            tl.store(acc + s * stride_idx_s, last)
    else:
        # C46a: token by token, until the first rejection.
        going = 1
        for step in range(1, NUM_SLOTS):
            if going == 1:
                d = tl.load(cand + step * stride_cand_s).to(tl.int64)
                p = tl.load(tp + (step - 1) * stride_tp_s + d * stride_tp_v)
                q = tl.load(dp + (step - 1) * stride_dp_s + d * stride_dp_v)
                coin = tl.load(uni + (step - 1) * stride_uni_s)
                if (q > 0.0) & (q <= 1.0) & (coin * q < p):
                    tl.store(Predicts + last, d)
                    last = tl.load(idx + step * stride_idx_s).to(tl.int64)
                    tl.store(acc + step * stride_idx_s, last)
                    num = step
                else:
                    going = 0
    tl.store(AcceptTokenNum + pid, num)

    # C46d: the final draw. Row num of p (and of q, which the bonus never reads).
    bonus = num == NUM_SLOTS - 1
    tp_row = tp + num * stride_tp_s
    dp_row = dp + num * stride_dp_s
    if total < 0:
        total = tl.full((), 0, tl.int64)
        for start in range(0, VOCAB_SIZE, BLOCK_V):
            total += tl.sum(_draw_units(tp_row, dp_row, stride_tp_v, stride_dp_v, start, scale, bonus, VOCAB_SIZE, BLOCK_V))
    coin = tl.load(UniformSamplesFinal + pid)
    cut = (coin.to(tl.float64) * total.to(tl.float64)).to(tl.int64)
    token = VOCAB_SIZE - 1  # no prefix sum above the cut
    carry = tl.full((), 0, tl.int64)
    found = 0
    for start in range(0, VOCAB_SIZE, BLOCK_V):
        if found == 0:
            w = _draw_units(tp_row, dp_row, stride_tp_v, stride_dp_v, start, scale, bonus, VOCAB_SIZE, BLOCK_V)
            above = (tl.cumsum(w, 0) + carry) > cut
            if tl.max(above.to(tl.int32)) > 0:
                token = start + tl.min(tl.where(above, tl.arange(0, BLOCK_V), BLOCK_V))
                found = 1
            carry += tl.sum(w)
    tl.store(Predicts + last, token)


@triton.jit
def verify_tree_greedy_kernel_triton(
    predicts_ptr,  # [>= bs * n] out: tokens by tree slot
    accept_index_ptr,  # [bs, spec] out: the accepted path's slots
    accept_token_num_ptr,  # [bs] out: accepted drafts
    candidates_ptr,  # [bs, n] each node's token
    retrieve_index_ptr,  # [bs, n] each node's slot
    retrieve_next_token_ptr,  # [bs, n] first child, or -1
    retrieve_next_sibling_ptr,  # [bs, n] next sibling, or -1
    target_predict_ptr,  # [bs, n] the target's argmax by slot
    batch_size: tl.constexpr,
    num_speculative_tokens: tl.constexpr,
    num_draft_tokens: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    row = b * num_draft_tokens
    last = tl.load(retrieve_index_ptr + row).to(tl.int64)
    tl.store(accept_index_ptr + b * num_speculative_tokens, last)
    num = 0
    cur = tl.full((), 0, tl.int64)
    going = 1
    for _ in range(1, num_speculative_tokens):
        if going == 1:
            # C47a: the first child's sibling list searched for the target at the last accepted slot.
            cur = tl.load(retrieve_next_token_ptr + row + cur).to(tl.int64)
            want = tl.load(target_predict_ptr + last).to(tl.int64)
            going = 0
            searching = 1
            # A sibling list ends at -1 within n steps (C47b): the bound never cuts a walk short.
            for _step in range(num_draft_tokens):
                if searching == 1:
                    if cur == -1:
                        searching = 0
                    elif tl.load(candidates_ptr + row + cur).to(tl.int64) == want:
                        slot = tl.load(retrieve_index_ptr + row + cur).to(tl.int64)
                        tl.store(predicts_ptr + last, want)
                        num += 1
                        tl.store(accept_index_ptr + b * num_speculative_tokens + num, slot)
                        last = slot
                        going = 1
                        searching = 0
                    else:
                        cur = tl.load(retrieve_next_sibling_ptr + row + cur).to(tl.int64)
    tl.store(accept_token_num_ptr + b, num)
    tl.store(predicts_ptr + last, tl.load(target_predict_ptr + last))
