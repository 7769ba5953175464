"""The PyTorch oracle of the rejection-sampler kernels: the readable specification.

Each function has the vLLM kernel's name, parameters and order, runs on CPU tensors and
writes the caller's buffers in place, in their own dtype. Semantics follow docs/spec.md §2.1–§2.4
and the contract decisions of §5; where a width matters (float32 ratios and products,
float64 uniforms) it is spelled out.
"""

from __future__ import annotations

import torch

from contracts.rejection import residual_weight
from contracts.spec import counts, starts


def rejection_greedy_sample_kernel(
    output_token_ids_ptr: torch.Tensor,
    cu_num_draft_tokens_ptr: torch.Tensor,
    draft_token_ids_ptr: torch.Tensor,
    target_argmax_ptr: torch.Tensor,
    bonus_token_ids_ptr: torch.Tensor,
    is_greedy_ptr: torch.Tensor | None,
    max_spec_len: int,
    uniform_probs_ptr: torch.Tensor | None,
    synthetic_conditional_rates_ptr: torch.Tensor | None,
    SYNTHETIC_MODE: bool,
) -> None:
    out = output_token_ids_ptr.view(-1)
    cu = cu_num_draft_tokens_ptr
    draft = draft_token_ids_ptr.tolist()
    argmax = target_argmax_ptr.tolist()
    bonus = bonus_token_ids_ptr.reshape(-1).tolist()
    greedy = None if is_greedy_ptr is None else is_greedy_ptr.tolist()
    if SYNTHETIC_MODE:
        u = uniform_probs_ptr.tolist()  # Python floats: float64, never narrowed (C7)
        rates = synthetic_conditional_rates_ptr.tolist()  # float32 widened exactly
    row = max_spec_len + 1  # the row stride comes from the argument (C2)

    for r, (s, n) in enumerate(zip(starts(cu).tolist(), counts(cu).tolist())):
        if greedy is not None and not greedy[r]:
            continue
        rejected = False
        for pos in range(n):
            d = draft[s + pos]
            a = _as_int32(argmax[s + pos])
            if SYNTHETIC_MODE:
                # Rates are indexed by the position inside the request (C13); -1 drafts never pass (C10).
                accept = u[s + pos] < rates[pos] and d >= 0
                out[r * row + pos] = d if accept else a
            else:
                accept = d == a
                out[r * row + pos] = a
            if not accept:
                rejected = True
                break
        if not rejected:
            out[r * row + n] = bonus[r]


def rejection_random_sample_kernel(
    output_token_ids_ptr: torch.Tensor,
    cu_num_draft_tokens_ptr: torch.Tensor,
    draft_token_ids_ptr: torch.Tensor,
    draft_probs_ptr: torch.Tensor | None,
    target_probs_ptr: torch.Tensor,
    bonus_token_ids_ptr: torch.Tensor,
    recovered_token_ids_ptr: torch.Tensor,
    uniform_probs_ptr: torch.Tensor,
    is_greedy_ptr: torch.Tensor,
    max_spec_len: int,
    vocab_size: int,
    synthetic_conditional_rates_ptr: torch.Tensor | None,
    NO_DRAFT_PROBS: bool,
    SYNTHETIC_MODE: bool,
) -> None:
    out = output_token_ids_ptr.view(-1)
    cu = cu_num_draft_tokens_ptr
    n_tokens = int(cu[-1]) if cu.numel() else 0
    d = draft_token_ids_ptr[:n_tokens].to(torch.int64)
    u = uniform_probs_ptr[:n_tokens]

    # Decide every draft token at once; the row loop below only finds the first rejection.
    if SYNTHETIC_MODE:
        pos_in_row = torch.arange(n_tokens) - torch.repeat_interleave(starts(cu), counts(cu))
        rates = synthetic_conditional_rates_ptr.to(torch.float64)
        # Greedy rows' tokens are never decided here, and the contract sizes the rates for the
        # processed rows only: a greedy row may be longer than the rates.
        read = pos_in_row < rates.numel()
        accept = torch.zeros(n_tokens, dtype=torch.bool)
        # strict; float64 against the widened rate (C7, C8)
        accept[read] = (u[read] < rates[pos_in_row[read]]) & (d[read] >= 0)
    else:
        col = d.clamp(0, vocab_size - 1)  # negative drafts are rejected below without their value mattering
        rows = torch.arange(n_tokens)
        p = target_probs_ptr[rows, col]
        q = torch.ones_like(p) if NO_DRAFT_PROBS else draft_probs_ptr[rows, col]
        ratio = p / q  # float32 quotient, correctly rounded (C6)
        # q == 0 and NaN reject (C9); the float32 ratio is widened exactly and compared non-strictly.
        accept = (d >= 0) & (q > 0) & (ratio.to(torch.float64) >= u)

    accept = accept.tolist()
    draft = d.tolist()
    recovered = recovered_token_ids_ptr.tolist()
    bonus = bonus_token_ids_ptr.reshape(-1).tolist()
    greedy = is_greedy_ptr.tolist()
    row = max_spec_len + 1
    for r, (s, n) in enumerate(zip(starts(cu).tolist(), counts(cu).tolist())):
        if greedy[r]:
            continue
        rejected = False
        for pos in range(n):
            t = s + pos
            if accept[t]:
                out[r * row + pos] = draft[t]
            else:
                out[r * row + pos] = recovered[t]
                rejected = True
                break
        if not rejected:
            out[r * row + n] = bonus[r]


def expand_kernel(
    output_ptr: torch.Tensor,
    input_ptr: torch.Tensor,
    cu_num_tokens_ptr: torch.Tensor,
    replace_from: int,
    replace_to: int,
    MAX_NUM_TOKENS: int,
) -> None:
    dtype = input_ptr.dtype
    # The test and the replacement happen in the data's dtype (C18): the ints are converted to it.
    hit = input_ptr == torch.tensor(replace_from, dtype=dtype)
    values = torch.where(hit, torch.tensor(replace_to, dtype=dtype), input_ptr)
    cu = cu_num_tokens_ptr
    for r, (s, n) in enumerate(zip(starts(cu).tolist(), counts(cu).tolist())):
        output_ptr[s : s + min(n, MAX_NUM_TOKENS)] = values[r]


def sample_recovered_tokens_kernel(
    output_token_ids_ptr: torch.Tensor,
    cu_num_draft_tokens_ptr: torch.Tensor,
    draft_token_ids_ptr: torch.Tensor,
    draft_probs_ptr: torch.Tensor | None,
    target_probs_ptr: torch.Tensor,
    inv_q_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
    NO_DRAFT_PROBS: bool,
    USE_FP64_GUMBEL: bool,
) -> None:
    # BLOCK_SIZE only tiles the Triton kernel's scan; the result never depends on it (C15).
    # Vectorised and device-agnostic: the GPU benchmarks time this oracle on the GPU too.
    cu = cu_num_draft_tokens_ptr
    n_tokens = int(cu[-1]) if cu.numel() else 0
    if n_tokens == 0:
        return
    p = target_probs_ptr[:n_tokens]
    if NO_DRAFT_PROBS:
        # Exactly the draft's lane is zeroed; an id outside [0, V) excludes nothing (C16).
        w = p.clone()
        d = draft_token_ids_ptr[:n_tokens].to(torch.int64)
        inside = (d >= 0) & (d < vocab_size)
        w[torch.arange(n_tokens, device=d.device)[inside], d[inside]] = 0.0
    else:
        diff = p - draft_probs_ptr[:n_tokens]  # one float32 subtraction
        w = residual_weight(diff)  # max(diff, 0); NaN gives 0 (C16)

    # One noise row per request, shared by its positions (§3.4).
    request = torch.repeat_interleave(torch.arange(cu.numel(), device=cu.device), counts(cu))
    noise = inv_q_ptr[request]
    score = w.to(torch.float64) * noise if USE_FP64_GUMBEL else w * noise  # C17: width of the product

    # Lowest index of the maximum over the non-NaN scores; all NaN gives 0 (C15).
    score = torch.where(torch.isnan(score), torch.full_like(score, float("-inf")), score)
    output_token_ids_ptr[:n_tokens] = torch.argmax(score, dim=1).to(output_token_ids_ptr.dtype)


def _as_int32(x: int) -> int:
    """The kernel narrows the int64 argmax to int32 before storing it."""
    return (x + 2**31) % 2**32 - 2**31
