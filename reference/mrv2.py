"""The PyTorch oracle of Model Runner V2's rejection-sampler kernels (contracts/mrv2.py)."""

from __future__ import annotations

import math

import torch

from contracts import mrv2 as contract
from contracts import numerics
from contracts._checks import flat_view
from reference import gumbel

I64, F32 = torch.int64, torch.float32


def _gather_draft_sampled_kernel(
    draft_sampled_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    input_ids_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    logits_indices_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
    num_logits: int,
    BLOCK_SIZE: int,
) -> None:
    # BLOCK_SIZE only tiles the Triton kernel's rows; results never depend on it.
    n = num_logits
    token = logits_indices_ptr[:n].to(I64)
    pos = positions_ptr.to(I64)[token]
    local = expanded_local_pos_ptr[:n].to(I64)
    prefill = prefill_len_ptr.to(I64)[expanded_idx_mapping_ptr[:n].to(I64)]
    # A draft row (local > 0) of a step that started inside the prefill is a placeholder.
    placeholder = (local > 0) & (pos - local < prefill)
    ids = torch.where(placeholder, torch.full_like(token, -1), input_ids_ptr.to(I64)[token])
    draft_sampled_ptr[:n] = ids.to(draft_sampled_ptr.dtype)
    pos_ptr[:n] = pos.to(pos_ptr.dtype)


def _flatten_sampled_kernel(
    flat_sampled_ptr: torch.Tensor,
    sampled_ptr: torch.Tensor,
    sampled_stride: int,
    num_sampled_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
) -> None:
    cu = cu_num_logits_ptr.tolist()
    sampled = flat_view(sampled_ptr)
    for r in range(len(cu) - 1):
        k = int(num_sampled_ptr[r])
        if k:  # a request with nothing accepted addresses no row, whatever its stride
            row = sampled[r * sampled_stride : r * sampled_stride + k]
            flat_sampled_ptr[cu[r] : cu[r] + k] = row.to(flat_sampled_ptr.dtype)


def _tiles(row: torch.Tensor, width: int, block: int) -> torch.Tensor:
    """A row's first ``width`` values as float32 tiles of ``block`` columns, padded with -inf."""
    nb = -(-width // block)
    x = torch.full((nb * block,), float("-inf"), dtype=F32)
    x[:width] = row[:width].to(F32) + 0.0  # -0.0 reads as +0.0 (C30): maxima are unambiguous
    return x.view(nb, block)


def _compute_local_logits_stats_kernel(
    target_local_argmax_ptr: torch.Tensor,
    target_local_argmax_stride: int,
    target_local_max_ptr: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp_ptr: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_local_max_ptr: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp_ptr: torch.Tensor,
    draft_local_sumexp_stride: int,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    vocab_size: int,
    num_logits: int,
    BLOCK_SIZE: int,
    HAS_DRAFT_LOGITS: bool,
) -> None:
    a = locals()
    if vocab_size == 0:
        return
    v, block = vocab_size, BLOCK_SIZE
    nb = -(-v // block)
    target = target_logits_ptr.reshape(-1)
    out = {name: a[f"{name}_ptr"].view(-1) for name in
           ("target_local_argmax", "target_local_max", "target_local_sumexp", "draft_local_max", "draft_local_sumexp")}

    def store(name: str, i: int, values: torch.Tensor) -> None:
        at = i * a[f"{name}_stride"]
        out[name][at : at + nb] = values.to(out[name].dtype)

    for i in contract.stats_rows(a).tolist():
        s = int(expanded_idx_mapping_ptr[i])
        t = temp_ptr[s].to(F32)
        x = _tiles(target[i * target_logits_stride :], v, block)
        if t == 0:
            # Greedy: each tile's maximum and the first index holding it.
            j = x.argmax(-1)
            store("target_local_argmax", i, torch.arange(nb) * block + j)
            store("target_local_max", i, x.gather(1, j[:, None])[:, 0])
            continue
        m, se = numerics.max_and_sumexp(x)
        store("target_local_max", i, m)
        store("target_local_sumexp", i, se)
        if HAS_DRAFT_LOGITS:
            at = s * draft_logits_stride_0 + int(expanded_local_pos_ptr[i]) * draft_logits_stride_1
            d = _tiles(draft_logits_ptr.reshape(-1)[at:], v, block) / t + 0.0  # rounded once; -0.0 as +0.0 (C30)
            m, se = numerics.max_and_sumexp(d)
            store("draft_local_max", i, m)
            store("draft_local_sumexp", i, se)


def _insert_resampled_kernel(
    sampled_ptr: torch.Tensor,
    sampled_stride: int,
    num_sampled_ptr: torch.Tensor,
    resampled_local_argmax_ptr: torch.Tensor,
    resampled_local_argmax_stride: int,
    resampled_local_max_ptr: torch.Tensor,
    resampled_local_max_stride: int,
    resample_num_blocks: int,
    cu_num_logits_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    PADDED_RESAMPLE_NUM_BLOCKS: int,
) -> None:
    a = locals()
    nb = resample_num_blocks
    maxes, argmax = resampled_local_max_ptr.reshape(-1), resampled_local_argmax_ptr.reshape(-1)
    flat = sampled_ptr.view(-1)
    for r, k, writes in contract.insert_rows(a):
        if writes:
            m = maxes[r * resampled_local_max_stride :][:nb]
            m = torch.where(m.isnan(), float("-inf"), m)  # NaN never wins
            b = int(m.argmax())  # the first tile holding the maximum
            flat[r * sampled_stride + k] = argmax[r * resampled_local_argmax_stride + b].to(flat.dtype)
        num_sampled_ptr[r] = k + 1


def log_probs(a: dict, row: int, slot: int, step: int, token: int, t: torch.Tensor,
               nb: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log p, log q, target LSE, draft LSE) of ``token`` at logits row ``row`` (draft step ``step`` of
    ``slot``): each logit minus its row's C29 log-sum-exp. One-hot drafts have log q = 0 and a draft
    LSE of 0; a placeholder (``token < 0``) reads no logit: log p = log q = -inf."""
    lse_t = contract.row_logsumexp(a, "target", row, nb)
    lse_d = contract.row_logsumexp(a, "draft", row, nb) if a["draft_logits_ptr"] is not None else torch.zeros((), dtype=F32)
    if token < 0:
        return torch.tensor(-math.inf), torch.tensor(-math.inf), lse_t, lse_d
    lp = a["target_logits_ptr"].reshape(-1)[row * a["target_logits_stride"] + token].to(F32) - lse_t
    if a["draft_logits_ptr"] is None:
        return lp, torch.zeros((), dtype=F32), lse_t, lse_d
    at = slot * a["draft_logits_stride_0"] + step * a["draft_logits_stride_1"] + token
    return lp, a["draft_logits_ptr"].reshape(-1)[at].to(F32) / t - lse_d, lse_t, lse_d


def _compute_cumulative_log_p_kernel(
    cumulative_log_p_ptr: torch.Tensor,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    target_local_max_ptr: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp_ptr: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_sampled_ptr: torch.Tensor,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_local_max_ptr: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp_ptr: torch.Tensor,
    draft_local_sumexp_stride: int,
    cu_num_logits_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    vocab_num_blocks: int,
    PADDED_VOCAB_NUM_BLOCKS: int,
    HAS_DRAFT_LOGITS: bool,
) -> None:
    a = locals()
    cu = cu_num_logits_ptr.to(I64).tolist()
    log_p, request = torch.zeros((), dtype=F32), -1
    for r, s, i, d in contract.cumulative_steps(a):
        if r != request:
            log_p, request = torch.zeros((), dtype=F32), r  # p_0 = 1
        if d >= 0:  # a placeholder carries the previous value
            lp, lq, _, _ = log_probs(a, i, s, i - cu[r], d, temp_ptr[s].to(F32), vocab_num_blocks)
            # min(0, .) as Triton's tl.minimum: a NaN (log p = log q = -inf) gives 0.
            log_p = torch.fmin(log_p + (lp - lq), torch.zeros((), dtype=F32))
        cumulative_log_p_ptr[i] = log_p


def _compute_local_residual_mass_kernel(
    local_residual_mass_ptr: torch.Tensor,
    local_residual_mass_stride: int,
    cumulative_log_p_ptr: torch.Tensor,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    target_local_max_ptr: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp_ptr: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_logits_ptr: torch.Tensor,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_local_max_ptr: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp_ptr: torch.Tensor,
    draft_local_sumexp_stride: int,
    draft_sampled_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    vocab_size: int,
    num_logits: int,
    vocab_num_blocks: int,
    BLOCK_SIZE: int,
    PADDED_VOCAB_NUM_BLOCKS: int,
) -> None:
    a = locals()
    v, nb = vocab_size, vocab_num_blocks
    out = local_residual_mass_ptr.view(-1)
    for i in contract.residual_rows(a):
        s, step = int(expanded_idx_mapping_ptr[i]), int(expanded_local_pos_ptr[i])
        t = temp_ptr[s].to(F32)
        # The mass the block-verification residual keeps at this step: sum over x of
        # max(p_prev * p(x) - q(x), 0), p_prev the joint ratio before this step.
        p_prev = numerics.exp32(cumulative_log_p_ptr[i - 1])
        m_b = numerics.exp32(_tiles(target_logits_ptr.reshape(-1)[i * target_logits_stride :], v, BLOCK_SIZE)
                           - contract.row_logsumexp(a, "target", i, nb))
        at = s * draft_logits_stride_0 + step * draft_logits_stride_1
        d = _tiles(draft_logits_ptr.reshape(-1)[at:], v, BLOCK_SIZE) / t
        m_s = numerics.exp32(d - contract.row_logsumexp(a, "draft", i, nb))
        terms = torch.clamp_min(numerics.fma32(p_prev, m_b, -m_s), 0.0)  # one rounding (C29)
        at = i * local_residual_mass_stride
        out[at : at + nb] = numerics.exact_sum(terms)


def _global_argmax(a: dict, row: int, nb: int) -> int:
    """The target argmax of a greedy row from K13's tiles: the first tile holding the highest
    maximum (NaN never wins), then that tile's argmax."""
    m = a["target_local_max_ptr"].reshape(-1)[row * a["target_local_max_stride"] :][:nb]
    b = int(torch.where(m.isnan(), float("-inf"), m).argmax())
    return int(a["target_local_argmax_ptr"].reshape(-1)[row * a["target_local_argmax_stride"] + b])


def residual_mass(a: dict, row: int, token: int, ratio: torch.Tensor, nb: int) -> torch.Tensor:
    """The block-verification residual mass at ``row`` (the next step): K15's tiles summed in
    float64 as C29's ``tree_sum`` and rounded, or for a one-hot draft ``ratio * (1 - p(token))``."""
    if a["HAS_DRAFT_LOGITS"]:
        partials = a["local_residual_mass_ptr"].reshape(-1)[row * a["local_residual_mass_stride"] :][:nb]
        return numerics.tree_sum(partials).to(F32)
    x = a["target_logits_ptr"].reshape(-1)[row * a["target_logits_stride"] + token].to(F32)
    m_b = numerics.exp32(x - contract.row_logsumexp(a, "target", row, nb))
    return ratio * (1.0 - m_b)


def _rejection_kernel(
    sampled_ptr: torch.Tensor,
    sampled_stride: int,
    rejected_steps_ptr: torch.Tensor,
    target_rejected_logsumexp_ptr: torch.Tensor,
    draft_rejected_logsumexp_ptr: torch.Tensor,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    target_local_argmax_ptr: torch.Tensor,
    target_local_argmax_stride: int,
    target_local_max_ptr: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp_ptr: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_sampled_ptr: torch.Tensor,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_local_max_ptr: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp_ptr: torch.Tensor,
    draft_local_sumexp_stride: int,
    cu_num_logits_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    seed_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    synthetic_conditional_rates_ptr: torch.Tensor | None,
    cumulative_log_p_ptr: torch.Tensor | None,
    local_residual_mass_ptr: torch.Tensor | None,
    local_residual_mass_stride: int,
    fly_entropy_ptr: torch.Tensor | None,
    fly_entropy_threshold: float,
    vocab_num_blocks: int,
    PADDED_VOCAB_NUM_BLOCKS: int,
    HAS_DRAFT_LOGITS: bool,
    SYNTHETIC_MODE: bool,
    USE_BLOCK_VERIFICATION: bool,
    FLY_WINDOW_SIZE: int,
) -> None:
    a = locals()
    nb, fly, block = vocab_num_blocks, FLY_WINDOW_SIZE, USE_BLOCK_VERIFICATION
    zero = torch.zeros((), dtype=F32)
    threshold = torch.tensor(fly_entropy_threshold, dtype=F32)  # passed as float32
    tokens = draft_sampled_ptr.to(I64)
    sampled = sampled_ptr.view(-1)
    for q in contract.requests(a):
        t = torch.tensor(q.temp, dtype=F32)
        seed = seed_ptr[q.slot]
        accepted_length, pending, rejected_argmax = 0, -1, 0
        target_lse = draft_lse = zero
        verifying = True
        for i in range(q.drafts):
            row = q.start + i
            d = int(tokens[row + 1])
            valid = d >= 0
            d = max(d, 0)
            if not q.greedy and fly == 0:
                verifying = verifying and valid  # a placeholder ends a random request's verification
            if not verifying:
                continue
            target_argmax, can_defer, accepted = 0, False, False
            u = gumbel.tl_rand32(gumbel.spec_step_seed(seed, i) if block else seed, pos_ptr[row], includes_zero=False)
            if q.greedy:
                target_argmax = _global_argmax(a, row, nb)
                accepted = bool(u < synthetic_conditional_rates_ptr[i]) if SYNTHETIC_MODE else target_argmax == d
                accepted = accepted and valid
                if fly:
                    x = target_logits_ptr.reshape(-1)[row * target_logits_stride + d] if valid else -math.inf
                    can_defer = valid and float(x) > -math.inf
            elif block:
                ratio = numerics.exp32(cumulative_log_p_ptr[row])  # the joint ratio after this step
                nxt = int(tokens[row + 2]) if i < q.drafts - 1 else -1
                if nxt >= 0:
                    mass = residual_mass(a, row + 1, nxt, ratio, nb)
                    denom = mass + 1.0 - ratio
                    h = mass / denom if denom > 0.0 else torch.ones((), dtype=F32)
                else:
                    h = ratio
                # No early exit: a later step's accept takes the whole block up to it.
                if u <= h:
                    accepted_length = i + 1
                sampled[q.index * sampled_stride + i] = d
            else:
                lp, lq, step_target_lse, step_draft_lse = log_probs(a, row, q.slot, i, d if valid else -1, t, nb)
                if fly == 0 or pending < 0:
                    target_lse, draft_lse = step_target_lse, step_draft_lse
                if SYNTHETIC_MODE:
                    accepted = bool(u < synthetic_conditional_rates_ptr[i])
                else:
                    # p(d) > u * q(d), strictly, in the log domain: log p > log u + log q.
                    accepted = bool(lp > numerics.log32(u) + lq)
                if fly:
                    accepted = accepted and valid
                    can_defer = valid and bool(lp > -math.inf) and bool(lq > -math.inf)
            if block and not q.greedy:
                continue
            if fly:
                if pending >= 0:
                    # Only an accepted draft confirms a deferred rejection; FLY_WINDOW_SIZE of them do.
                    verifying = accepted
                    if accepted and i - pending == fly:
                        accepted_length, pending = i + 1, -1
                elif accepted:
                    accepted_length = i + 1
                else:
                    rejected_argmax = target_argmax
                    entropy = fly_entropy_ptr[row]
                    verifying = can_defer and i + fly < q.drafts and bool(entropy >= threshold)
                    if verifying:
                        pending = i
                sampled[q.index * sampled_stride + i] = d
            else:
                verifying = accepted
                accepted_length += int(accepted)
                sampled[q.index * sampled_stride + i] = target_argmax if q.greedy and not accepted else d
        if fly and q.greedy and accepted_length < q.drafts:
            sampled[q.index * sampled_stride + accepted_length] = rejected_argmax
        rejected_steps_ptr[q.index] = accepted_length
        if block and not q.greedy and accepted_length < q.drafts:
            rejected = q.start + accepted_length
            target_lse = contract.row_logsumexp(a, "target", rejected, nb)
            if HAS_DRAFT_LOGITS:
                draft_lse = contract.row_logsumexp(a, "draft", rejected, nb)
        target_rejected_logsumexp_ptr[q.index] = target_lse
        draft_rejected_logsumexp_ptr[q.index] = draft_lse


def _resample_kernel(
    resampled_local_argmax_ptr: torch.Tensor,
    resampled_local_argmax_stride: int,
    resampled_local_max_ptr: torch.Tensor,
    resampled_local_max_stride: int,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    target_rejected_logsumexp_ptr: torch.Tensor,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_rejected_logsumexp_ptr: torch.Tensor,
    rejected_step_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    draft_sampled_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    seed_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    cumulative_log_p_ptr: torch.Tensor | None,
    contexts_ptr: torch.Tensor | None,
    contexts_stride: int,
    watermarking_ptr: torch.Tensor | None,
    watermarking_skip_mask_ptr: torch.Tensor | None,
    watermark_key_0: int,
    watermark_key_1: int,
    vocab_size: int,
    BLOCK_SIZE: int,
    HAS_DRAFT_LOGITS: bool,
    USE_FP64: bool,
    USE_BLOCK_VERIFICATION: bool,
    CONTEXT_WIDTH: int,
    WATERMARK: bool,
    DEDUPLICATE_CONTEXTS: bool,
) -> None:
    a = locals()
    nb = -(-vocab_size // BLOCK_SIZE)
    for q in contract.resamples(a):
        if not q.writes:
            continue  # greedy, rejected at a draft: K16 stored the target argmax
        scores, _ = resample_scores(a, q)
        best = scores.argmax(-1)  # the first index of each tile's maximum
        at = q.index * resampled_local_argmax_stride
        resampled_local_argmax_ptr.view(-1)[at : at + nb] = (torch.arange(nb) * BLOCK_SIZE + best).to(resampled_local_argmax_ptr.dtype)
        at = q.index * resampled_local_max_stride
        resampled_local_max_ptr.view(-1)[at : at + nb] = scores.gather(1, best[:, None])[:, 0].to(resampled_local_max_ptr.dtype)


def resample_scores(a: dict, q: contract.Resample) -> tuple[torch.Tensor, torch.Tensor | None]:
    """K17's Gumbel-max scores of one request, tile by tile (``[NBr, BLOCK_SIZE]``, -inf past V):
    the residual log-probabilities (or the target's logits) plus the noise at temperatures above 0;
    and the ratios q/p of a residual with draft logits (else None)."""
    v, block = a["vocab_size"], a["BLOCK_SIZE"]
    nb = -(-v // block)
    cols = torch.arange(nb * block).view(nb, block)
    ratio = None
    x = _tiles(a["target_logits_ptr"].reshape(-1)[q.row * a["target_logits_stride"] :], v, block)
    if q.residual and a["HAS_DRAFT_LOGITS"]:
        t = torch.tensor(q.temp, dtype=F32)
        at = q.slot * a["draft_logits_stride_0"] + q.step * a["draft_logits_stride_1"]
        y = _tiles(a["draft_logits_ptr"].reshape(-1)[at:], v, block) / t
        lp = x - a["target_rejected_logsumexp_ptr"][q.index]
        if a["USE_BLOCK_VERIFICATION"] and q.step > 0:
            lp = lp + a["cumulative_log_p_ptr"][q.row - 1]  # the block residual scales p by the joint ratio
        lq = y - a["draft_rejected_logsumexp_ptr"][q.index]
        # log max(p - q, 0) = log p + log(1 - q/p), -inf where q >= p (NaN ratios included).
        ratio = numerics.exp32(lq - lp)
        x = torch.where(ratio < 1.0, lp + numerics.log1p32(-ratio), float("-inf"))
    elif q.residual:
        x = torch.where(cols != q.rejected, x, float("-inf"))  # a one-hot draft: the target without it
    if a["USE_FP64"]:
        x = x.to(torch.float64)
    if q.temp != 0.0:
        seed, pos = a["seed_ptr"][q.slot], a["pos_ptr"][q.row]
        if a["USE_FP64"]:
            noise = gumbel.gumbel64(gumbel.murmur3_uniform64(seed, pos, cols))
        else:
            noise = gumbel.gumbel32(gumbel.murmur3_uniform32(seed, pos, cols))
        x = torch.where(cols < v, x + noise, float("-inf"))
    return x, ratio
