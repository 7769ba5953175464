"""Triton kernels of Model Runner V2's rejection sampler, with vLLM 0.33.0's names, parameters and
grids (``vllm/v1/worker/gpu/spec_decode/rejection_sampler.py``). Offsets are formed in int64 (C4).
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_impl.gumbel import (
    div_by,
    div_by_lanes,
    div_in_range,
    exact_reciprocal,
    exp32,
    exp32_nonpositive,
    exp_units,
    fixed46,
    gumbel32,
    gumbel32_above,
    gumbel64,
    log1p32_negative,
    log32,
    murmur3_hash32,
    murmur3_uniform32,
    murmur3_uniform64,
    out_of_range,
    reciprocal,
    residual_above,
    spec_step_seed,
    times_exact_reciprocal,
    tl_rand32,
    tree_sum,
    units_to_float,
)

# Tiles are read in slices of these many columns where a kernel keeps several values per column
# (registers, not the tile, bound the work in flight).
RESIDUAL_SLICE = tl.constexpr(1024)


@triton.jit
def _flatten_sampled_kernel(
    flat_sampled_ptr,  # [NL] out: the host zero-fills it, the kernel writes the accepted rows
    sampled_ptr,  # [R, K+1] accepted tokens, rows sampled_stride apart
    sampled_stride,
    num_sampled_ptr,  # [R] tokens to copy per request
    cu_num_logits_ptr,  # [R+1] exclusive row offsets
):
    # Launched as kernel[(R,)]: one program per request.
    req_idx = tl.program_id(0).to(tl.int64)
    start_idx = tl.load(cu_num_logits_ptr + req_idx).to(tl.int64)
    num_sampled = tl.load(num_sampled_ptr + req_idx)
    row = sampled_ptr + req_idx * sampled_stride
    for i in range(num_sampled):
        tl.store(flat_sampled_ptr + start_idx + i, tl.load(row + i))


@triton.jit
def _gather_draft_sampled_kernel(
    draft_sampled_ptr,  # [NL] out: the row's input token, -1 for a placeholder draft
    pos_ptr,  # [NL] out: the row's position
    input_ids_ptr,  # [num_tokens]
    positions_ptr,  # [num_tokens]
    logits_indices_ptr,  # [NL] token of each logits row
    expanded_idx_mapping_ptr,  # [NL] request state slot of each row
    expanded_local_pos_ptr,  # [NL] position of the row inside its request
    prefill_len_ptr,  # [max_num_reqs]
    num_logits,
    BLOCK_SIZE: tl.constexpr,
):
    # Launched as kernel[(cdiv(num_logits, BLOCK_SIZE),)].
    block = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = block < num_logits
    token_idx = tl.load(logits_indices_ptr + block, mask=mask, other=0).to(tl.int64)
    token_id = tl.load(input_ids_ptr + token_idx, mask=mask, other=0).to(tl.int64)
    pos = tl.load(positions_ptr + token_idx, mask=mask, other=0).to(tl.int64)
    slot = tl.load(expanded_idx_mapping_ptr + block, mask=mask, other=0).to(tl.int64)
    local_pos = tl.load(expanded_local_pos_ptr + block, mask=mask, other=0).to(tl.int64)
    prefill_len = tl.load(prefill_len_ptr + slot, mask=mask, other=0).to(tl.int64)
    # Drafts are proposed only after sampling past the prefill: the draft rows of a step that
    # starts inside it are placeholders.
    is_placeholder = (local_pos > 0) & (pos - local_pos < prefill_len)
    token_id = tl.where(is_placeholder, -1, token_id)
    tl.store(draft_sampled_ptr + block, token_id, mask=mask)
    tl.store(pos_ptr + block, pos, mask=mask)


@triton.jit
def _is_bonus_logit(expanded_local_pos_ptr, logit_idx, num_logits):
    nxt = tl.load(expanded_local_pos_ptr + logit_idx + 1, mask=logit_idx + 1 < num_logits, other=0)
    return nxt == 0


# Launch options, not parameters. At the call site's 8192 columns: 8 warps held to 56 registers a
# thread, so that four programs share an SM where Triton 3.6 gave them 80 (three), with no spills
# (timings: docs/benchmarks.md). Triton 3.9 allots 64 unasked.
@triton.heuristics({
    "num_warps": lambda a: 8 if a["BLOCK_SIZE"] >= 8192 else 4,
    "maxnreg": lambda a: 56 if a["BLOCK_SIZE"] == 8192 else None,
})
@triton.jit
def _compute_local_logits_stats_kernel(
    target_local_argmax_ptr,  # [NL, NB] out: greedy rows
    target_local_argmax_stride,
    target_local_max_ptr,  # [NL, NB] out
    target_local_max_stride,
    target_local_sumexp_ptr,  # [NL, NB] out: random rows
    target_local_sumexp_stride,
    draft_local_max_ptr,  # [NL, NB] out: random rows with draft logits
    draft_local_max_stride,
    draft_local_sumexp_ptr,
    draft_local_sumexp_stride,
    target_logits_ptr,  # [NL, V_t]
    target_logits_stride,
    draft_logits_ptr,  # [max_num_reqs, K, V_d] pre-temperature, or None
    draft_logits_stride_0,
    draft_logits_stride_1,
    expanded_idx_mapping_ptr,  # [NL]
    expanded_local_pos_ptr,  # [NL]
    temp_ptr,  # [max_num_reqs]
    vocab_size,
    num_logits,
    BLOCK_SIZE: tl.constexpr,
    HAS_DRAFT_LOGITS: tl.constexpr,
):
    # Launched as kernel[(NL, cdiv(V, BLOCK_SIZE))]; bonus rows need no statistics.
    logit_idx = tl.program_id(0).to(tl.int64)
    if _is_bonus_logit(expanded_local_pos_ptr, logit_idx, num_logits):
        return
    step = tl.load(expanded_local_pos_ptr + logit_idx).to(tl.int64)
    slot = tl.load(expanded_idx_mapping_ptr + logit_idx).to(tl.int64)
    temp = tl.load(temp_ptr + slot).to(tl.float32)
    block_idx = tl.program_id(1)
    start = block_idx * BLOCK_SIZE  # columns in int32, as vLLM's (the contract bounds V below 2^31)
    target_row = target_logits_ptr + logit_idx * target_logits_stride
    if temp == 0.0:
        # The first index of the tile's maximum; a -0.0 ties with +0.0 (C30).
        x = _slice(target_row, start, vocab_size, BLOCK_SIZE) + 0.0
        best, idx = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        tl.store(target_local_argmax_ptr + logit_idx * target_local_argmax_stride + block_idx, start + idx)
        tl.store(target_local_max_ptr + logit_idx * target_local_max_stride + block_idx, best)
    else:
        m, se = _tile_max_and_sumexp(target_row, start, vocab_size, temp, False, BLOCK_SIZE)
        tl.store(target_local_max_ptr + logit_idx * target_local_max_stride + block_idx, m)
        tl.store(target_local_sumexp_ptr + logit_idx * target_local_sumexp_stride + block_idx, se)
        if HAS_DRAFT_LOGITS:
            row = draft_logits_ptr + slot * draft_logits_stride_0 + step * draft_logits_stride_1
            m, se = _tile_max_and_sumexp(row, start, vocab_size, temp, True, BLOCK_SIZE)
            tl.store(draft_local_max_ptr + logit_idx * draft_local_max_stride + block_idx, m)
            tl.store(draft_local_sumexp_ptr + logit_idx * draft_local_sumexp_stride + block_idx, se)


@triton.jit
def _slice(row, start, n, SLICE: tl.constexpr, MASKED: tl.constexpr = True):
    # Columns [start, start + SLICE) of a row as float32, -inf past n (unmasked where the caller knows
    # the slice is inside the row). A -0.0 stays -0.0: where it matters (a maximum, C30) the caller
    # adds 0.0 once to the result, not to every element.
    cols = start + tl.arange(0, SLICE)
    if MASKED:
        x = tl.load(row + cols, mask=cols < n, other=float("-inf"))
    else:
        x = tl.load(row + cols)
    return x.to(tl.float32)


@triton.jit
def _tile_max_and_sumexp(row, start, n, temp, DIVIDE: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    # The maximum of the tile at `start` and the C29 sum of exp32(x - max), divided by temp (rounded
    # once) when DIVIDE. One read: the tile stays in registers between the maximum and the sum. Two
    # passes over 2048-column slices waited on L2 for the second read: 0.134 ms at 64 requests on an
    # H200 against 0.122 ms (0.160 ms unrolled). The maximum is of the undivided logits, divided
    # once after: x -> RN(x / t) is monotone for t > 0. Each way of dividing ends in its own sum, so
    # no tile of quotients outlives its branch: with the ways joined in one tile (div_by), K13 held
    # 167 registers a thread at 8192 columns and 4 warps.
    x = _slice(row, start, n, BLOCK_SIZE)
    m = tl.max(x, axis=0) + 0.0  # -0.0 reads as +0.0 (C30)
    if DIVIDE:
        m = tl.math.div_rn(m, temp) + 0.0  # a quotient's -0.0 reads as +0.0 too
        shift = tl.where(m > float("-inf"), m, 0.0)
        t_inv = reciprocal(temp)
        if exact_reciprocal(temp, t_inv):
            units = tl.sum(exp_units(times_exact_reciprocal(x, t_inv) - shift), axis=0)
        elif (tl.max(out_of_range(x).to(tl.int32), axis=0) > 0) | (t_inv != t_inv):
            units = _sumexp_div_rn(row, start, n, temp, shift, BLOCK_SIZE)
        else:
            units = tl.sum(exp_units(div_in_range(x, temp, t_inv) - shift), axis=0)
    else:
        units = tl.sum(exp_units(x - tl.where(m > float("-inf"), m, 0.0)), axis=0)
    return m, tl.where(m > float("-inf"), units_to_float(units), 0.0)


@triton.jit
def _sumexp_div_rn(row, start, n, temp, shift, BLOCK_SIZE: tl.constexpr):
    # The C29 units of a tile that div_by_lanes cannot divide (a logit outside its range, or the
    # temperature): read again in slices (from L2), each divided with div_rn, so that this rare
    # way costs the common ones no registers.
    SLICE: tl.constexpr = BLOCK_SIZE if BLOCK_SIZE < RESIDUAL_SLICE else RESIDUAL_SLICE
    units = tl.zeros((SLICE,), tl.int64)
    for c in range(0, BLOCK_SIZE, SLICE):
        units += exp_units(tl.math.div_rn(_slice(row, start + c, n, SLICE), temp) - shift)
    return tl.sum(units, axis=0)


@triton.jit
def _insert_resampled_kernel(
    sampled_ptr,  # [R, K+1] in/out
    sampled_stride,
    num_sampled_ptr,  # [R] in: accepted drafts; out: + 1
    resampled_local_argmax_ptr,  # [R, NBr]
    resampled_local_argmax_stride,
    resampled_local_max_ptr,  # [R, NBr] float32 or float64
    resampled_local_max_stride,
    resample_num_blocks,
    cu_num_logits_ptr,  # [R+1]
    expanded_idx_mapping_ptr,  # [NL]
    temp_ptr,  # [max_num_reqs]
    PADDED_RESAMPLE_NUM_BLOCKS: tl.constexpr,
):
    # Launched as kernel[(R,)].
    req_idx = tl.program_id(0).to(tl.int64)
    num_sampled = tl.load(num_sampled_ptr + req_idx)
    start_idx = tl.load(cu_num_logits_ptr + req_idx).to(tl.int64)
    end_idx = tl.load(cu_num_logits_ptr + req_idx + 1).to(tl.int64)
    row = start_idx + num_sampled
    slot = tl.load(expanded_idx_mapping_ptr + row).to(tl.int64)
    tl.store(num_sampled_ptr + req_idx, num_sampled + 1)
    temp = tl.load(temp_ptr + slot).to(tl.float32)
    if temp == 0.0 and row != end_idx - 1:
        return  # greedy, rejected at a draft: the target argmax is already in place
    blocks = tl.arange(0, PADDED_RESAMPLE_NUM_BLOCKS)
    maxes = tl.load(resampled_local_max_ptr + req_idx * resampled_local_max_stride + blocks,
                    mask=blocks < resample_num_blocks, other=float("-inf"))
    maxes = tl.where(maxes != maxes, float("-inf"), maxes)  # NaN never wins
    _, best = tl.max(maxes, axis=0, return_indices=True, return_indices_tie_break_left=True)
    token = tl.load(resampled_local_argmax_ptr + req_idx * resampled_local_argmax_stride + best)
    tl.store(sampled_ptr + req_idx * sampled_stride + num_sampled, token)




@triton.jit
def _logsumexp(max_ptr, max_stride, sumexp_ptr, sumexp_stride, row, num_blocks, PADDED_VOCAB_NUM_BLOCKS: tl.constexpr):
    # C29: G = max of the tile maxima; T = tree_sum of sumexp_b * exp32(m_b - G) (exact products:
    # fusing changes nothing); G + log(T) rounded to float32. One vector of tiles, read once.
    blocks = tl.arange(0, PADDED_VOCAB_NUM_BLOCKS)
    live = blocks < num_blocks
    m = tl.load(max_ptr + row * max_stride + blocks, mask=live, other=float("-inf"))
    se = tl.load(sumexp_ptr + row * sumexp_stride + blocks, mask=live, other=0.0)
    g = tl.max(m, axis=0)
    total = tree_sum(tl.where(live, se.to(tl.float64) * exp32(m - g).to(tl.float64), 0.0))
    return (g.to(tl.float64) + tl.log(total)).to(tl.float32)


@triton.jit
def _log_probs(token, valid, row, slot, step, temp, target_logits_ptr, target_logits_stride, target_local_max_ptr,
               target_local_max_stride, target_local_sumexp_ptr, target_local_sumexp_stride, draft_logits_ptr,
               draft_logits_stride_0, draft_logits_stride_1, draft_local_max_ptr, draft_local_max_stride,
               draft_local_sumexp_ptr, draft_local_sumexp_stride, num_blocks, PADDED_VOCAB_NUM_BLOCKS: tl.constexpr,
               HAS_DRAFT_LOGITS: tl.constexpr):
    # (log p, log q, target LSE, draft LSE) of a token at a logits row (an invalid token reads
    # nothing: log p = log q = -inf); one-hot drafts have log q = 0 and a draft LSE of 0.
    x = tl.load(target_logits_ptr + row * target_logits_stride + token, mask=valid, other=float("-inf"))
    lse_t = _logsumexp(target_local_max_ptr, target_local_max_stride, target_local_sumexp_ptr,
                       target_local_sumexp_stride, row, num_blocks, PADDED_VOCAB_NUM_BLOCKS)
    lp = x.to(tl.float32) - lse_t
    lq = tl.zeros((), tl.float32)
    lse_d = tl.zeros((), tl.float32)
    if HAS_DRAFT_LOGITS:
        y = tl.load(draft_logits_ptr + slot * draft_logits_stride_0 + step * draft_logits_stride_1 + token, mask=valid,
                    other=float("-inf"))
        lse_d = _logsumexp(draft_local_max_ptr, draft_local_max_stride, draft_local_sumexp_ptr,
                           draft_local_sumexp_stride, row, num_blocks, PADDED_VOCAB_NUM_BLOCKS)
        lq = tl.math.div_rn(y.to(tl.float32), temp) - lse_d
    return lp, lq, lse_t, lse_d


@triton.jit
def _compute_cumulative_log_p_kernel(
    cumulative_log_p_ptr,  # [NL] out
    target_logits_ptr,
    target_logits_stride,
    target_local_max_ptr,
    target_local_max_stride,
    target_local_sumexp_ptr,
    target_local_sumexp_stride,
    draft_sampled_ptr,  # [NL]: row i + 1 holds draft i
    draft_logits_ptr,
    draft_logits_stride_0,
    draft_logits_stride_1,
    draft_local_max_ptr,
    draft_local_max_stride,
    draft_local_sumexp_ptr,
    draft_local_sumexp_stride,
    cu_num_logits_ptr,  # [R+1]
    idx_mapping_ptr,  # [R]
    temp_ptr,
    vocab_num_blocks,
    PADDED_VOCAB_NUM_BLOCKS: tl.constexpr,
    HAS_DRAFT_LOGITS: tl.constexpr,
):
    # Launched as kernel[(R,)]: one request's drafts in order.
    req_idx = tl.program_id(0).to(tl.int64)
    slot = tl.load(idx_mapping_ptr + req_idx).to(tl.int64)
    start = tl.load(cu_num_logits_ptr + req_idx).to(tl.int64)
    end = tl.load(cu_num_logits_ptr + req_idx + 1).to(tl.int64)
    temp = tl.load(temp_ptr + slot).to(tl.float32)
    if temp == 0.0:
        return
    log_p = tl.zeros((), tl.float32)
    for step in range(end - start - 1):
        row = start + step
        token = tl.load(draft_sampled_ptr + row + 1).to(tl.int64)
        if token >= 0:  # a placeholder carries the previous value
            lp, lq, _, _ = _log_probs(token, True, row, slot, step, temp, target_logits_ptr, target_logits_stride,
                                target_local_max_ptr, target_local_max_stride, target_local_sumexp_ptr,
                                target_local_sumexp_stride, draft_logits_ptr, draft_logits_stride_0,
                                draft_logits_stride_1, draft_local_max_ptr, draft_local_max_stride,
                                draft_local_sumexp_ptr, draft_local_sumexp_stride, vocab_num_blocks,
                                PADDED_VOCAB_NUM_BLOCKS, HAS_DRAFT_LOGITS)
            log_p = tl.minimum(log_p + (lp - lq), 0.0)  # a NaN gives 0, as tl.minimum does
        tl.store(cumulative_log_p_ptr + row, log_p)


@triton.jit
def _compute_local_residual_mass_kernel(
    local_residual_mass_ptr,  # [NL, NB] out
    local_residual_mass_stride,
    cumulative_log_p_ptr,  # [NL] K14's output
    target_logits_ptr,
    target_logits_stride,
    target_local_max_ptr,
    target_local_max_stride,
    target_local_sumexp_ptr,
    target_local_sumexp_stride,
    draft_logits_ptr,  # [max_num_reqs, K, V_d] pre-temperature
    draft_logits_stride_0,
    draft_logits_stride_1,
    draft_local_max_ptr,
    draft_local_max_stride,
    draft_local_sumexp_ptr,
    draft_local_sumexp_stride,
    draft_sampled_ptr,  # [NL]: row i + 1 holds draft i
    expanded_idx_mapping_ptr,
    expanded_local_pos_ptr,
    temp_ptr,
    vocab_size,
    num_logits,
    vocab_num_blocks,
    BLOCK_SIZE: tl.constexpr,
    PADDED_VOCAB_NUM_BLOCKS: tl.constexpr,
):
    # Launched as kernel[(NL, NB)]. Block verification looks one step ahead: the first and the
    # bonus row of a request need no residual mass, nor a row whose draft is a placeholder. The
    # loads that need only the row go out together (the next row's masked past the last row), so
    # a program waits on three loads in a row (these, its temperature, its statistics), not six.
    logit_idx = tl.program_id(0).to(tl.int64)
    step = tl.load(expanded_local_pos_ptr + logit_idx).to(tl.int64)
    has_next = logit_idx + 1 < num_logits
    next_step = tl.load(expanded_local_pos_ptr + logit_idx + 1, mask=has_next, other=0)
    next_draft = tl.load(draft_sampled_ptr + logit_idx + 1, mask=has_next, other=-1)
    slot = tl.load(expanded_idx_mapping_ptr + logit_idx).to(tl.int64)
    if (step == 0) | (next_step == 0) | (next_draft < 0):
        return
    temp = tl.load(temp_ptr + slot).to(tl.float32)
    if temp == 0.0:
        return
    block_idx = tl.program_id(1)  # columns in int32, as vLLM's (the contract bounds V below 2^31)
    lse_t = _logsumexp(target_local_max_ptr, target_local_max_stride, target_local_sumexp_ptr,
                       target_local_sumexp_stride, logit_idx, vocab_num_blocks, PADDED_VOCAB_NUM_BLOCKS)
    lse_d = _logsumexp(draft_local_max_ptr, draft_local_max_stride, draft_local_sumexp_ptr, draft_local_sumexp_stride,
                       logit_idx, vocab_num_blocks, PADDED_VOCAB_NUM_BLOCKS)
    p_prev = exp32(tl.load(cumulative_log_p_ptr + logit_idx - 1))
    target_row = target_logits_ptr + logit_idx * target_logits_stride
    draft_row = draft_logits_ptr + slot * draft_logits_stride_0 + step * draft_logits_stride_1
    start = block_idx * BLOCK_SIZE
    temp_inv = reciprocal(temp)
    # The division is chosen once per program, not in every slice: each loop holds one way.
    if exact_reciprocal(temp, temp_inv):
        units, odd = _residual_tile(target_row, draft_row, start, vocab_size, p_prev, lse_t, lse_d, temp, temp_inv,
                                    BLOCK_SIZE, RECIPROCAL)
    else:
        units, odd = _residual_tile(target_row, draft_row, start, vocab_size, p_prev, lse_t, lse_d, temp, temp_inv,
                                    BLOCK_SIZE, LANES)
        if (odd > 0) | (temp_inv != temp_inv):  # div_by_lanes left some quotient to the general division
            units, odd = _residual_units(target_row, draft_row, start, vocab_size, p_prev, lse_t, lse_d, temp, temp_inv,
                                         BLOCK_SIZE, True, DIV_RN)
    tl.store(local_residual_mass_ptr + logit_idx * local_residual_mass_stride + block_idx, units_to_float(units))


# How _residual_units divides the draft's logits by the temperature.
RECIPROCAL = tl.constexpr(0)  # a power of two: times its exact reciprocal
LANES = tl.constexpr(1)  # div_by_lanes, reporting the lanes it cannot divide
DIV_RN = tl.constexpr(2)  # div_rn on every lane


@triton.jit
def _residual_tile(target_row, draft_row, start, n, p_prev, lse_t, lse_d, temp, temp_inv, BLOCK_SIZE: tl.constexpr,
                   DIVIDE: tl.constexpr):
    # _residual_units of a tile, whose reads need masks only when it is the row's last and partial.
    if start + BLOCK_SIZE <= n:
        units, odd = _residual_units(target_row, draft_row, start, n, p_prev, lse_t, lse_d, temp, temp_inv, BLOCK_SIZE,
                                     False, DIVIDE)
    else:
        units, odd = _residual_units(target_row, draft_row, start, n, p_prev, lse_t, lse_d, temp, temp_inv, BLOCK_SIZE,
                                     True, DIVIDE)
    return units, odd


@triton.jit
def _residual_units(target_row, draft_row, start, n, p_prev, lse_t, lse_d, temp, temp_inv, BLOCK_SIZE: tl.constexpr,
                    MASKED: tl.constexpr, DIVIDE: tl.constexpr):
    # A tile's residual mass in C29 units, and how many draft quotients div_by_lanes could not give
    # (then the caller runs it again with DIV_RN). In slices of at most RESIDUAL_SLICE columns: the
    # sum is exact, so slicing changes no bit, and a slice's two exps, fma and int64 units stay in
    # registers (a whole 8192-column tile spilled them); a loop, not unrolled (unrolled, it was 2.8x
    # slower on an H200). Both exps take arguments <= 0 (the statistics' precondition: a row's
    # log-sum-exp is at least its largest logit), so neither needs exp32's NaN select and upper
    # clamp (exp32_nonpositive).
    SLICE: tl.constexpr = BLOCK_SIZE if BLOCK_SIZE < RESIDUAL_SLICE else RESIDUAL_SLICE
    col_units = tl.zeros((SLICE,), tl.int64)
    col_odd = tl.zeros((SLICE,), tl.int32)
    for c in range(0, BLOCK_SIZE, SLICE):
        y = _slice(draft_row, start + c, n, SLICE, MASKED)
        if DIVIDE == DIV_RN:
            y = tl.math.div_rn(y, temp)
        elif DIVIDE == RECIPROCAL:
            y = times_exact_reciprocal(y, temp_inv)
        else:
            y, odd = div_by_lanes(y, temp, temp_inv)
            col_odd |= odd.to(tl.int32)
        m_b = exp32_nonpositive(_slice(target_row, start + c, n, SLICE, MASKED) - lse_t)
        m_s = exp32_nonpositive(y - lse_d)
        terms = tl.maximum(tl.fma(p_prev, m_b, -m_s), 0.0)  # one rounding (C29)
        col_units += fixed46(terms)
    return tl.sum(col_units, axis=0), tl.max(col_odd, axis=0)


@triton.jit
def _global_target_argmax(target_local_max_ptr, target_local_max_stride, target_local_argmax_ptr,
                          target_local_argmax_stride, row, num_blocks, PADDED_VOCAB_NUM_BLOCKS: tl.constexpr):
    # The first tile holding the highest maximum (NaN never wins), then that tile's argmax.
    blocks = tl.arange(0, PADDED_VOCAB_NUM_BLOCKS)
    m = tl.load(target_local_max_ptr + row * target_local_max_stride + blocks, mask=blocks < num_blocks,
                other=float("-inf"))
    _, best_block = tl.max(tl.where(m != m, float("-inf"), m), axis=0, return_indices=True,
                           return_indices_tie_break_left=True)
    return tl.load(target_local_argmax_ptr + row * target_local_argmax_stride + best_block).to(tl.int64)


@triton.jit
def _residual_mass(local_residual_mass_ptr, local_residual_mass_stride, ratio, target_logits_ptr, target_logits_stride,
                   target_local_max_ptr, target_local_max_stride, target_local_sumexp_ptr, target_local_sumexp_stride,
                   token, row, num_blocks, PADDED_VOCAB_NUM_BLOCKS: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr):
    # Block verification's residual mass at the next step's row: the tree_sum of K15's tiles (C29),
    # or for a one-hot draft ratio * (1 - p(token)).
    if HAS_DRAFT_LOGITS:
        b = tl.arange(0, PADDED_VOCAB_NUM_BLOCKS)
        partial = tl.load(local_residual_mass_ptr + row * local_residual_mass_stride + b, mask=b < num_blocks, other=0.0)
        mass = tree_sum(partial.to(tl.float64)).to(tl.float32)
    else:
        x = tl.load(target_logits_ptr + row * target_logits_stride + token).to(tl.float32)
        p = exp32(x - _logsumexp(target_local_max_ptr, target_local_max_stride, target_local_sumexp_ptr,
                                 target_local_sumexp_stride, row, num_blocks, PADDED_VOCAB_NUM_BLOCKS))
        mass = ratio * (1.0 - p)
    return mass


@triton.jit
def _rejection_kernel(
    sampled_ptr,  # [R, K+1] out
    sampled_stride,
    rejected_steps_ptr,  # [R] out
    target_rejected_logsumexp_ptr,  # [R] out
    draft_rejected_logsumexp_ptr,  # [R] out
    target_logits_ptr,
    target_logits_stride,
    target_local_argmax_ptr,
    target_local_argmax_stride,
    target_local_max_ptr,
    target_local_max_stride,
    target_local_sumexp_ptr,
    target_local_sumexp_stride,
    draft_sampled_ptr,  # [NL]: row i + 1 holds draft i
    draft_logits_ptr,
    draft_logits_stride_0,
    draft_logits_stride_1,
    draft_local_max_ptr,
    draft_local_max_stride,
    draft_local_sumexp_ptr,
    draft_local_sumexp_stride,
    cu_num_logits_ptr,  # [R+1]
    idx_mapping_ptr,  # [R]
    temp_ptr,
    seed_ptr,
    pos_ptr,  # [NL]
    synthetic_conditional_rates_ptr,  # [K] or None
    cumulative_log_p_ptr,  # [NL] or None
    local_residual_mass_ptr,  # [NL, NB] or None
    local_residual_mass_stride,
    fly_entropy_ptr,  # [NL] or None
    fly_entropy_threshold,
    vocab_num_blocks,
    PADDED_VOCAB_NUM_BLOCKS: tl.constexpr,
    HAS_DRAFT_LOGITS: tl.constexpr,
    SYNTHETIC_MODE: tl.constexpr,
    USE_BLOCK_VERIFICATION: tl.constexpr,
    FLY_WINDOW_SIZE: tl.constexpr,
):
    # Launched as kernel[(R,)]: one request's drafts in order.
    req_idx = tl.program_id(0).to(tl.int64)
    slot = tl.load(idx_mapping_ptr + req_idx).to(tl.int64)
    start = tl.load(cu_num_logits_ptr + req_idx).to(tl.int64)
    end = tl.load(cu_num_logits_ptr + req_idx + 1).to(tl.int64)
    num_drafts = end - start - 1
    seed = tl.load(seed_ptr + slot)
    temp = tl.load(temp_ptr + slot).to(tl.float32)
    is_greedy = temp == 0.0
    accepted_length = tl.zeros((), tl.int64)
    pending = tl.full((), -1, tl.int64)  # FLy: the deferred rejection's step
    rejected_argmax = tl.zeros((), tl.int64)
    target_lse = tl.zeros((), tl.float32)
    draft_lse = tl.zeros((), tl.float32)
    verifying = start == start
    for i in range(num_drafts):
        row = start + i
        token = tl.load(draft_sampled_ptr + row + 1).to(tl.int64)
        valid = token >= 0
        token = tl.maximum(token, 0)
        if not is_greedy and FLY_WINDOW_SIZE == 0:
            verifying &= valid  # a placeholder ends a random request's verification
        if verifying:
            target_argmax = tl.zeros((), tl.int64)
            can_defer = valid & False
            accepted = valid & False
            pos = tl.load(pos_ptr + row)
            if USE_BLOCK_VERIFICATION:
                u = tl_rand32(spec_step_seed(seed, i), pos, includes_zero=False)
            else:
                u = tl_rand32(seed, pos, includes_zero=False)
            if is_greedy:
                target_argmax = _global_target_argmax(target_local_max_ptr, target_local_max_stride,
                                                      target_local_argmax_ptr, target_local_argmax_stride, row,
                                                      vocab_num_blocks, PADDED_VOCAB_NUM_BLOCKS)
                if SYNTHETIC_MODE:
                    accepted = u < tl.load(synthetic_conditional_rates_ptr + i)
                else:
                    accepted = target_argmax == token
                accepted &= valid
                if FLY_WINDOW_SIZE > 0:
                    x = tl.load(target_logits_ptr + row * target_logits_stride + token, mask=valid,
                                other=float("-inf")).to(tl.float32)
                    can_defer = valid & (x > float("-inf"))
            elif USE_BLOCK_VERIFICATION:
                ratio = exp32(tl.load(cumulative_log_p_ptr + row))  # the joint ratio after this step
                nxt = tl.load(draft_sampled_ptr + row + 2, mask=i < num_drafts - 1, other=-1).to(tl.int64)
                h = ratio
                if nxt >= 0:
                    mass = _residual_mass(local_residual_mass_ptr, local_residual_mass_stride, ratio, target_logits_ptr,
                                          target_logits_stride, target_local_max_ptr, target_local_max_stride,
                                          target_local_sumexp_ptr, target_local_sumexp_stride, nxt, row + 1,
                                          vocab_num_blocks, PADDED_VOCAB_NUM_BLOCKS, HAS_DRAFT_LOGITS)
                    denom = mass + 1.0 - ratio
                    h = tl.where(denom > 0.0, tl.math.div_rn(mass, denom), 1.0)
                # No early exit: a later step's accept takes the whole block up to it.
                accepted_length = tl.where(u <= h, i + 1, accepted_length)
                tl.store(sampled_ptr + req_idx * sampled_stride + i, token)
            else:
                lp, lq, step_target_lse, step_draft_lse = _log_probs(
                    token, valid, row, slot, i, temp, target_logits_ptr, target_logits_stride, target_local_max_ptr,
                    target_local_max_stride, target_local_sumexp_ptr, target_local_sumexp_stride, draft_logits_ptr,
                    draft_logits_stride_0, draft_logits_stride_1, draft_local_max_ptr, draft_local_max_stride,
                    draft_local_sumexp_ptr, draft_local_sumexp_stride, vocab_num_blocks, PADDED_VOCAB_NUM_BLOCKS, HAS_DRAFT_LOGITS)
                if FLY_WINDOW_SIZE == 0 or pending < 0:
                    target_lse = step_target_lse
                    draft_lse = step_draft_lse
                if SYNTHETIC_MODE:
                    accepted = u < tl.load(synthetic_conditional_rates_ptr + i)
                else:
                    # p(d) > u * q(d), strictly, in the log domain.
                    accepted = lp > log32(u) + lq
                if FLY_WINDOW_SIZE > 0:
                    accepted &= valid
                    can_defer = valid & (lp > float("-inf")) & (lq > float("-inf"))
            if not USE_BLOCK_VERIFICATION or is_greedy:
                if FLY_WINDOW_SIZE > 0:
                    if pending >= 0:
                        # Only an accepted draft confirms a deferred rejection; FLY_WINDOW_SIZE of them do.
                        verifying = accepted
                        if accepted and i - pending == FLY_WINDOW_SIZE:
                            accepted_length = i + 1
                            pending = tl.full((), -1, tl.int64)
                    elif accepted:
                        accepted_length = i + 1
                    else:
                        rejected_argmax = target_argmax
                        entropy = tl.load(fly_entropy_ptr + row)
                        verifying = can_defer & (i + FLY_WINDOW_SIZE < num_drafts) & (entropy >= fly_entropy_threshold)
                        if verifying:
                            pending = i
                    tl.store(sampled_ptr + req_idx * sampled_stride + i, token)
                else:
                    verifying = accepted
                    accepted_length += accepted
                    tl.store(sampled_ptr + req_idx * sampled_stride + i,
                             tl.where(is_greedy and not accepted, target_argmax, token))
    if FLY_WINDOW_SIZE > 0:
        if is_greedy and accepted_length < num_drafts:
            tl.store(sampled_ptr + req_idx * sampled_stride + accepted_length, rejected_argmax)
    tl.store(rejected_steps_ptr + req_idx, accepted_length)
    if USE_BLOCK_VERIFICATION:
        if not is_greedy and accepted_length < num_drafts:
            rejected = start + accepted_length
            target_lse = _logsumexp(target_local_max_ptr, target_local_max_stride, target_local_sumexp_ptr,
                                    target_local_sumexp_stride, rejected, vocab_num_blocks, PADDED_VOCAB_NUM_BLOCKS)
            if HAS_DRAFT_LOGITS:
                draft_lse = _logsumexp(draft_local_max_ptr, draft_local_max_stride, draft_local_sumexp_ptr,
                                       draft_local_sumexp_stride, rejected, vocab_num_blocks, PADDED_VOCAB_NUM_BLOCKS)
    tl.store(target_rejected_logsumexp_ptr + req_idx, target_lse)
    tl.store(draft_rejected_logsumexp_ptr + req_idx, draft_lse)


# K17 scores rows of this many columns where it skips (one column per thread at four warps).
RESAMPLE_ROW = tl.constexpr(128)


@triton.jit
def _resample_inputs(target, draft, cols, lse_t, lse_d, shift, temp, rejected, takes_draft, vocab_size,
                     HAS_DRAFT_LOGITS: tl.constexpr):
    # K17's columns `cols` of a row: the target's logits (a one-hot residual without its rejected
    # draft), or for a residual with draft logits log p and log(q/p); else log(q/p) is 0.
    mask = cols < vocab_size
    x = tl.load(target + cols, mask=mask, other=float("-inf")).to(tl.float32) + 0.0  # -0.0 reads as +0.0 (C30)
    d = tl.zeros(cols.shape, tl.float32)
    if takes_draft:
        if HAS_DRAFT_LOGITS:
            y = tl.load(draft + cols, mask=mask, other=float("-inf")).to(tl.float32) + 0.0
            x = x - lse_t + shift
            d = div_by(y, temp, reciprocal(temp)) - lse_d - x
        else:
            x = tl.where(cols != rejected, x, float("-inf"))  # a one-hot draft: the target without it
    return x, d


@triton.jit
def _resample_residual(lp, d, takes_draft, HAS_DRAFT_LOGITS: tl.constexpr):
    # log max(p - q, 0) = log p + log(1 - q/p), -inf where q >= p (NaN ratios included).
    residual = lp
    if HAS_DRAFT_LOGITS:
        if takes_draft:
            ratio = exp32(d)
            residual = tl.where(ratio < 1.0, lp + log1p32_negative(-ratio), float("-inf"))
    return residual


@triton.jit
def _resample_tile(base, target, draft, lse_t, lse_d, shift, temp, rejected, takes_draft, vocab_size, seed, pos,
                   BLOCK_SIZE: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr, USE_FP64: tl.constexpr):
    # The tile's best score and its first column, every lane scored.
    cols = base + tl.arange(0, BLOCK_SIZE)
    lp, d = _resample_inputs(target, draft, cols, lse_t, lse_d, shift, temp, rejected, takes_draft, vocab_size,
                             HAS_DRAFT_LOGITS)
    scores = _resample_residual(lp, d, takes_draft, HAS_DRAFT_LOGITS)
    if USE_FP64:
        scores = scores.to(tl.float64)
        if temp != 0.0:
            scores = tl.where(cols < vocab_size, scores + gumbel64(murmur3_uniform64(seed, pos, cols)), float("-inf"))
    elif temp != 0.0:
        scores = tl.where(cols < vocab_size, scores + gumbel32(murmur3_uniform32(seed, pos, cols)), float("-inf"))
    return tl.max(scores, axis=0, return_indices=True, return_indices_tie_break_left=True)


@triton.jit
def _resample_row(s, base, target, draft, lse_t, lse_d, shift, temp, rejected, takes_draft, vocab_size, seed, pos,
                  HAS_DRAFT_LOGITS: tl.constexpr):
    # Row s's best float32 score and its first column in the tile: the row scored as a tile of its own.
    value, i = _resample_tile(base + s * RESAMPLE_ROW, target, draft, lse_t, lse_d, shift, temp, rejected, takes_draft,
                              vocab_size, seed, pos, RESAMPLE_ROW, HAS_DRAFT_LOGITS, False)
    return value, s * RESAMPLE_ROW + i


def _resample_at_call_site(a: dict) -> bool:
    # K17 launched as vLLM launches it: 1024 columns, float32 noise.
    return a["BLOCK_SIZE"] == 1024 and not a["USE_FP64"]


# Launch options, not parameters. At the call site: 2 warps held to 80 registers a thread (Triton 3.6
# gave 4 warps 80, six programs an SM; these are twelve, spilling 136 bytes a thread; timings:
# docs/benchmarks.md).
@triton.heuristics({
    "num_warps": lambda a: 2 if _resample_at_call_site(a) else 4,
    "maxnreg": lambda a: 80 if _resample_at_call_site(a) else None,
})
@triton.jit
def _resample_kernel(
    resampled_local_argmax_ptr,  # [R, NBr] out
    resampled_local_argmax_stride,
    resampled_local_max_ptr,  # [R, NBr] out: float32, or float64 with USE_FP64
    resampled_local_max_stride,
    target_logits_ptr,
    target_logits_stride,
    target_rejected_logsumexp_ptr,  # [R] K16's
    draft_logits_ptr,
    draft_logits_stride_0,
    draft_logits_stride_1,
    draft_rejected_logsumexp_ptr,  # [R] K16's
    rejected_step_ptr,  # [R] K16's accepted drafts
    cu_num_logits_ptr,
    expanded_idx_mapping_ptr,
    draft_sampled_ptr,
    temp_ptr,
    seed_ptr,
    pos_ptr,
    cumulative_log_p_ptr,  # [NL] or None
    contexts_ptr,  # the watermark branch is deferred: None
    contexts_stride,
    watermarking_ptr,
    watermarking_skip_mask_ptr,
    watermark_key_0,
    watermark_key_1,
    vocab_size,
    BLOCK_SIZE: tl.constexpr,
    HAS_DRAFT_LOGITS: tl.constexpr,
    USE_FP64: tl.constexpr,
    USE_BLOCK_VERIFICATION: tl.constexpr,
    CONTEXT_WIDTH: tl.constexpr,
    WATERMARK: tl.constexpr,
    DEDUPLICATE_CONTEXTS: tl.constexpr,
):
    # Launched as kernel[(R, cdiv(V, BLOCK_SIZE))].
    req_idx = tl.program_id(0).to(tl.int64)
    step = tl.load(rejected_step_ptr + req_idx).to(tl.int64)
    start = tl.load(cu_num_logits_ptr + req_idx).to(tl.int64)
    end = tl.load(cu_num_logits_ptr + req_idx + 1).to(tl.int64)
    row = start + step
    slot = tl.load(expanded_idx_mapping_ptr + row).to(tl.int64)
    temp = tl.load(temp_ptr + slot).to(tl.float32)
    is_bonus = row == end - 1
    if temp == 0.0 and not is_bonus:
        return  # greedy, rejected at a draft: K16 stored the target argmax
    rejected = tl.load(draft_sampled_ptr + row + 1, mask=not is_bonus, other=0).to(tl.int64)
    takes_draft = (not is_bonus) & (rejected >= 0)
    block_idx = tl.program_id(1)
    target = target_logits_ptr + row * target_logits_stride
    draft = draft_logits_ptr
    lse_t = 0.0
    lse_d = 0.0
    shift = 0.0
    if HAS_DRAFT_LOGITS:
        draft = draft_logits_ptr + slot * draft_logits_stride_0 + step * draft_logits_stride_1
        lse_t = tl.load(target_rejected_logsumexp_ptr + req_idx)
        lse_d = tl.load(draft_rejected_logsumexp_ptr + req_idx)
        if USE_BLOCK_VERIFICATION:  # the block residual scales p by the joint ratio (+ 0.0 changes no log p)
            shift = tl.load(cumulative_log_p_ptr + row - 1, mask=step > 0, other=0.0)
    seed = tl.load(seed_ptr + slot)
    pos = tl.load(pos_ptr + row)
    base = block_idx * BLOCK_SIZE
    if USE_FP64 or BLOCK_SIZE <= RESAMPLE_ROW or BLOCK_SIZE > 64 * RESAMPLE_ROW:  # the skip's rows: 2 to 64
        value, idx = _resample_tile(base, target, draft, lse_t, lse_d, shift, temp, rejected, takes_draft, vocab_size, seed,
                                    pos, BLOCK_SIZE, HAS_DRAFT_LOGITS, USE_FP64)
    elif temp == 0.0:  # a greedy bonus row: the target's argmax, no noise
        value, idx = _resample_tile(base, target, draft, lse_t, lse_d, shift, temp, rejected, takes_draft, vocab_size, seed,
                                    pos, BLOCK_SIZE, HAS_DRAFT_LOGITS, False)
    else:
        # float32 noise: every lane's score is bounded in a dozen operations (residual_above,
        # gumbel32_above), and the exact score (an exp32, a log1p and the noise's two logs) is
        # computed only for the rows of RESAMPLE_ROW columns whose bound reaches the best score
        # found: the row of the highest bound first, then the rows that can still match it. A row
        # not scored holds no lane that could be the tile's first maximum.
        rows = tl.arange(0, BLOCK_SIZE // RESAMPLE_ROW)
        cols = base + rows[:, None] * RESAMPLE_ROW + tl.arange(0, RESAMPLE_ROW)[None, :]
        lp, d = _resample_inputs(target, draft, cols, lse_t, lse_d, shift, temp, rejected, takes_draft, vocab_size, HAS_DRAFT_LOGITS)
        if HAS_DRAFT_LOGITS:
            if takes_draft:
                lp = lp + residual_above(d)
        above = tl.where(cols < vocab_size, lp + gumbel32_above(murmur3_hash32(seed, pos, cols)), float("-inf"))
        row_above = tl.max(above, axis=1)
        first = tl.argmax(row_above, axis=0, tie_break_left=True)
        value, idx = _resample_row(first, base, target, draft, lse_t, lse_d, shift, temp, rejected, takes_draft, vocab_size, seed, pos,
                                   HAS_DRAFT_LOGITS)
        # The other rows whose bound reaches that score, as the bits of one int64: one reduction
        # (a reduction per row in the loop cost what the skip saved on an H200).
        rest = tl.sum(tl.where((rows != first) & (row_above > float("-inf")) & (row_above >= value),
                               tl.full(rows.shape, 1, tl.int64) << rows, 0))
        for s in range(BLOCK_SIZE // RESAMPLE_ROW):
            if ((rest >> s) & 1) != 0:
                v, i = _resample_row(s, base, target, draft, lse_t, lse_d, shift, temp, rejected, takes_draft, vocab_size, seed,
                                     pos, HAS_DRAFT_LOGITS)
                better = (v > value) | ((v == value) & (i < idx))
                value = tl.where(better, v, value)
                idx = tl.where(better, i, idx)
        idx = tl.where(value == float("-inf"), 0, idx)  # every score -inf: the tile's first index
    tl.store(resampled_local_argmax_ptr + req_idx * resampled_local_argmax_stride + block_idx, base + idx)
    tl.store(resampled_local_max_ptr + req_idx * resampled_local_max_stride + block_idx, value)
