"""The host-side compositions of vLLM 0.33.0's V1 rejection sampler (docs/spec.md §3), over any backend.

The host code is the same torch code for every backend; only the kernel launches differ.
Randomness is an input: ``generate_uniform_probs`` and the exponential noise of
``sample_recovered_tokens`` can be drawn once and injected, so every backend sees the same
numbers and random-path outputs compare exactly. Host results run on the CPU and each launch
copies its tensors to the backend's device and back, so softmax and argmax are shared too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

import contracts
from conformance.backends import resolve_kernel
from conformance.runner import copy_args, poison_value
from contracts.spec import cdiv, next_power_of_2, tensors

PLACEHOLDER_TOKEN_ID = -1
GREEDY_TEMPERATURE = 0.0
MAX_SPEC_LEN = 128


@dataclass
class SamplingMetadata:
    """The fields of vLLM's SamplingMetadata the rejection sampler reads."""

    temperature: torch.Tensor | None  # float32 [B]; None when all greedy
    all_greedy: bool
    all_random: bool
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    top_k: torch.Tensor | None = None  # [B] int; None: no top-k
    top_p: torch.Tensor | None = None  # float32 [B]; None: no top-p


def launch(backend: str, kernel: str, grid: tuple[int, ...], **args: Any) -> None:
    """Launches ``kernel`` on ``backend`` with CPU tensors; outputs land in the given tensors."""
    spec = contracts.get(kernel)
    b, k = resolve_kernel(backend, spec)
    device = b.device()
    # On another device: copies that keep aliasing and strides, and every output copied back.
    moved = args if device == "cpu" else copy_args(args, device)
    b.launcher(k, grid)(**moved)
    if moved is not args:
        copies = {label: t for label, _, t in tensors(spec, moved)}
        for label, p, t in tensors(spec, args):
            if p.is_output:
                t.copy_(copies[label])


def generate_uniform_probs(
    num_tokens: int, num_draft_tokens: list[int], generators: dict[int, torch.Generator], device: str = "cpu"
) -> torch.Tensor:
    """§3.3: float64 uniforms from the global generator, overwritten per seeded request."""
    u = torch.rand(num_tokens, dtype=torch.float64, device=device)
    offset = 0
    for i, n in enumerate(num_draft_tokens):
        if n == 0:
            continue  # a request without drafts consumes nothing from its generator
        if i in generators:
            u[offset : offset + n].uniform_(generator=generators[i])
        offset += n
    return u


def exponential_noise(batch: int, vocab: int, generators: dict[int, torch.Generator], num_draft_tokens: list[int], fp64: bool) -> torch.Tensor:
    """§3.4 step 1: one Exp(1) row per request (seeded requests with drafts redrawn)."""
    q = torch.empty(batch, vocab, dtype=torch.float64 if fp64 else torch.float32).exponential_()
    for i, gen in generators.items():
        if num_draft_tokens[i] > 0:
            q[i].exponential_(generator=gen)
    return q


def expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0, *, backend: str = "reference"
) -> torch.Tensor:
    """§3.2: per-request values to per-token values, through ``expand_kernel``."""
    batch = x.shape[0]
    assert cu_num_tokens.shape[0] == batch
    out = x.new_empty(num_tokens)
    launch(backend, "expand_kernel", (batch,), output_ptr=out, input_ptr=x, cu_num_tokens_ptr=cu_num_tokens,
           replace_from=replace_from, replace_to=replace_to, MAX_NUM_TOKENS=MAX_SPEC_LEN)
    return out


def sample_recovered_tokens(
    max_spec_len: int,
    num_draft_tokens: list[int],
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    sampling_metadata: SamplingMetadata,
    use_fp64_gumbel: bool = False,
    *,
    backend: str = "reference",
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """§3.4: Gumbel-max (exponential race) sample of the residual per draft position."""
    batch, vocab = len(num_draft_tokens), target_probs.shape[-1]
    if noise is None:
        noise = exponential_noise(batch, vocab, sampling_metadata.generators, num_draft_tokens, use_fp64_gumbel)
    inv_q = 1.0 / noise
    recovered = torch.empty_like(draft_token_ids)
    launch(backend, "sample_recovered_tokens_kernel", (batch, max_spec_len),
           output_token_ids_ptr=recovered, cu_num_draft_tokens_ptr=cu_num_draft_tokens, draft_token_ids_ptr=draft_token_ids,
           draft_probs_ptr=draft_probs, target_probs_ptr=target_probs, inv_q_ptr=inv_q, vocab_size=vocab, BLOCK_SIZE=8192,
           NO_DRAFT_PROBS=draft_probs is None, USE_FP64_GUMBEL=inv_q.dtype == torch.float64)
    return recovered


def compute_fly_entropy(values: torch.Tensor, entropy_top_k: int, *, from_logits: bool = False) -> torch.Tensor:
    """FLy's entropy per row (docs/fly.md): ``-sum(p log p)`` over the ``entropy_top_k`` largest
    probabilities (from logits: their softmax), not renormalised, 0 log 0 = 0; float32."""
    if values.ndim != 2:
        raise ValueError("FLy expects 2-D target probabilities or logits")
    if values.shape[-1] == 0:
        raise ValueError("FLy requires a non-empty target vocabulary")
    if entropy_top_k <= 0:
        raise ValueError("fly_entropy_top_k must be greater than zero")
    values = values.to(torch.float32)
    top = torch.topk(values, k=min(entropy_top_k, values.shape[-1]), dim=-1).values
    if from_logits:
        log_p = top - values.logsumexp(dim=-1, keepdim=True)
        p = log_p.exp()
    else:
        p, log_p = top, top.log()
    return -torch.where(p > 0, p * log_p, torch.zeros_like(p)).sum(dim=-1)


def rejection_sample(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    sampling_metadata: SamplingMetadata,
    synthetic_mode: bool = False,
    synthetic_conditional_rates: torch.Tensor | None = None,
    use_fp64_gumbel: bool = False,
    fly_window_size: int | None = None,
    fly_entropy_threshold: float | None = None,
    fly_entropy_top_k: int = 3,
    *,
    backend: str = "reference",
    uniform: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """§3.1: int32 ``[B, S+1]`` output of the V1 rejection sampler, with the FLy pre-pass
    (docs/fly.md) when ``fly_window_size`` is given."""
    assert draft_token_ids.ndim == 1 and draft_token_ids.is_contiguous()
    assert draft_probs is None or (draft_probs.ndim == 2 and draft_probs.is_contiguous())
    assert cu_num_draft_tokens.ndim == 1 and bonus_token_ids.is_contiguous()
    assert target_logits.ndim == 2 and target_logits.shape[0] == draft_token_ids.shape[0]
    assert max_spec_len <= MAX_SPEC_LEN
    assert synthetic_mode == (synthetic_conditional_rates is not None)
    fly = fly_window_size is not None
    if fly:
        assert fly_entropy_threshold is not None
        if synthetic_mode:
            raise ValueError("FLy is incompatible with synthetic rejection sampling")
    batch, (num_tokens, vocab) = len(num_draft_tokens), target_logits.shape
    meta = sampling_metadata
    out = torch.full((batch, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32)
    is_greedy = None if meta.all_greedy else meta.temperature == GREEDY_TEMPERATURE
    if uniform is None and (synthetic_mode or not meta.all_greedy):
        uniform = generate_uniform_probs(num_tokens, num_draft_tokens, meta.generators)
    target_probs = None
    if fly or not meta.all_greedy:
        target_probs = torch.softmax(target_logits, dim=-1, dtype=torch.float32)
    entropy = compute_fly_entropy(target_probs, fly_entropy_top_k) if fly else None

    if not meta.all_random:
        target_argmax = target_logits.argmax(dim=-1)
        if fly:
            launch(backend, "apply_fly_greedy_acceptance_kernel", (batch,),
                   cu_num_draft_tokens_ptr=cu_num_draft_tokens, draft_token_ids_ptr=draft_token_ids,
                   target_argmax_ptr=target_argmax, target_logits_ptr=target_logits, fly_entropy_ptr=entropy,
                   is_greedy_ptr=is_greedy, vocab_size=vocab, fly_entropy_threshold=fly_entropy_threshold,
                   FLY_WINDOW_SIZE=fly_window_size)
        launch(backend, "rejection_greedy_sample_kernel", (batch,),
               output_token_ids_ptr=out, cu_num_draft_tokens_ptr=cu_num_draft_tokens, draft_token_ids_ptr=draft_token_ids,
               target_argmax_ptr=target_argmax, bonus_token_ids_ptr=bonus_token_ids, is_greedy_ptr=is_greedy,
               max_spec_len=max_spec_len, uniform_probs_ptr=uniform,
               synthetic_conditional_rates_ptr=synthetic_conditional_rates, SYNTHETIC_MODE=synthetic_mode)
        if meta.all_greedy:
            return out

    recovered = sample_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs,
                                        target_probs, meta, use_fp64_gumbel, backend=backend, noise=noise)
    if fly:
        uniform = uniform.clone()  # the pre-pass rewrites it; an injected uniform stays the caller's
        launch(backend, "apply_fly_random_acceptance_kernel", (batch,),
               cu_num_draft_tokens_ptr=cu_num_draft_tokens, draft_token_ids_ptr=draft_token_ids, draft_probs_ptr=draft_probs,
               target_probs_ptr=target_probs, uniform_probs_ptr=uniform, fly_entropy_ptr=entropy, is_greedy_ptr=is_greedy,
               vocab_size=vocab, fly_entropy_threshold=fly_entropy_threshold, NO_DRAFT_PROBS=draft_probs is None,
               FLY_WINDOW_SIZE=fly_window_size)
    launch(backend, "rejection_random_sample_kernel", (batch,),
           output_token_ids_ptr=out, cu_num_draft_tokens_ptr=cu_num_draft_tokens, draft_token_ids_ptr=draft_token_ids,
           draft_probs_ptr=draft_probs, target_probs_ptr=target_probs, bonus_token_ids_ptr=bonus_token_ids,
           recovered_token_ids_ptr=recovered, uniform_probs_ptr=uniform, is_greedy_ptr=is_greedy,
           max_spec_len=max_spec_len, vocab_size=vocab,
           synthetic_conditional_rates_ptr=synthetic_conditional_rates, NO_DRAFT_PROBS=draft_probs is None,
           SYNTHETIC_MODE=synthetic_mode)
    return out


def unconditional_to_conditional_rates(rates: list[float]) -> torch.Tensor:
    """§3.5: c_i = a_i / a_{i-1} (a_{-1} = 1), 0 where the previous rate is not positive."""
    out, prev = [], 1.0
    for a in rates:
        out.append(a / prev if prev > 0 else 0.0)
        prev = a
    return torch.tensor(out, dtype=torch.float32)


# -- Model Runner V2 (docs/mrv2.md) ------------------------------------------------------------------
MRV2_VOCAB_BLOCK = 8192
MRV2_RESAMPLE_BLOCK = 1024


def _scratch(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """vLLM allocates its intermediates uninitialised; poison makes a read of a cell nothing wrote
    show in the results (the same poison on every backend, so results still compare exactly)."""
    return torch.full(shape, poison_value(dtype), dtype=dtype)


def mrv2_rejection_sample(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_sampled: torch.Tensor,
    cu_num_logits: torch.Tensor,
    pos: torch.Tensor,
    idx_mapping: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    expanded_local_pos: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    num_speculative_steps: int,
    synthetic_conditional_rates: torch.Tensor | None = None,
    use_fp64: bool = False,
    use_block_verification: bool = False,
    *,
    backend: str = "reference",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rejection_sample`` of vLLM 0.33.0's ``rejection_sampler_utils.py`` (watermark and FLy out of
    scope): ``(sampled [R, K+1] int64, num_sampled [R] int32)``; cells of ``sampled`` past
    ``num_sampled`` are unspecified (here: poison)."""
    assert target_logits.ndim == 2 and target_logits.stride(-1) == 1
    assert draft_logits is None or (draft_logits.ndim == 3 and draft_logits.stride(-1) == 1)
    assert not (use_block_verification and synthetic_conditional_rates is not None)
    num_reqs = cu_num_logits.shape[0] - 1
    num_logits, vocab = target_logits.shape
    has_draft = draft_logits is not None
    s0 = s1 = 0
    if has_draft:
        s0, s1 = draft_logits.stride(0), draft_logits.stride(1)
        vocab = min(vocab, draft_logits.shape[-1])
    nb = cdiv(vocab, MRV2_VOCAB_BLOCK)
    padded = next_power_of_2(nb)
    stats = {name: _scratch((num_logits, nb), torch.int64 if name == "target_local_argmax" else torch.float32)
             for name in ("target_local_argmax", "target_local_max", "target_local_sumexp", "draft_local_max",
                          "draft_local_sumexp")}
    strided = {f"{k}_ptr": v for k, v in stats.items()} | {f"{k}_stride": v.stride(0) for k, v in stats.items()}
    target = dict(target_logits_ptr=target_logits, target_logits_stride=target_logits.stride(0))
    draft = dict(draft_logits_ptr=draft_logits, draft_logits_stride_0=s0, draft_logits_stride_1=s1)

    def side(*names: str) -> dict[str, Any]:
        return {k: v for k, v in strided.items() if k.removesuffix("_ptr").removesuffix("_stride") in names}

    launch(backend, "_compute_local_logits_stats_kernel", (num_logits, nb), **strided, **target, **draft,
           expanded_idx_mapping_ptr=expanded_idx_mapping, expanded_local_pos_ptr=expanded_local_pos, temp_ptr=temperature,
           vocab_size=vocab, num_logits=num_logits, BLOCK_SIZE=MRV2_VOCAB_BLOCK, HAS_DRAFT_LOGITS=has_draft)
    stats_t = side("target_local_max", "target_local_sumexp")
    stats_d = side("draft_local_max", "draft_local_sumexp")
    cumulative = residual = None
    if use_block_verification:
        cumulative = _scratch((num_logits,), torch.float32)
        launch(backend, "_compute_cumulative_log_p_kernel", (num_reqs,), cumulative_log_p_ptr=cumulative, **target,
               **stats_t, draft_sampled_ptr=draft_sampled, **draft, **stats_d, cu_num_logits_ptr=cu_num_logits,
               idx_mapping_ptr=idx_mapping, temp_ptr=temperature, vocab_num_blocks=nb, PADDED_VOCAB_NUM_BLOCKS=padded,
               HAS_DRAFT_LOGITS=has_draft)
        if has_draft:
            residual = _scratch((num_logits, nb), torch.float32)
            launch(backend, "_compute_local_residual_mass_kernel", (num_logits, nb), local_residual_mass_ptr=residual,
                   local_residual_mass_stride=residual.stride(0), cumulative_log_p_ptr=cumulative, **target, **stats_t,
                   **draft, **stats_d, draft_sampled_ptr=draft_sampled, expanded_idx_mapping_ptr=expanded_idx_mapping,
                   expanded_local_pos_ptr=expanded_local_pos, temp_ptr=temperature, vocab_size=vocab,
                   num_logits=num_logits, vocab_num_blocks=nb, BLOCK_SIZE=MRV2_VOCAB_BLOCK, PADDED_VOCAB_NUM_BLOCKS=padded)
    sampled = _scratch((num_reqs, num_speculative_steps + 1), torch.int64)
    num_sampled = _scratch((num_reqs,), torch.int32)
    target_lse, draft_lse = _scratch((num_reqs,), torch.float32), _scratch((num_reqs,), torch.float32)
    launch(backend, "_rejection_kernel", (num_reqs,), sampled_ptr=sampled, sampled_stride=sampled.stride(0),
           rejected_steps_ptr=num_sampled, target_rejected_logsumexp_ptr=target_lse, draft_rejected_logsumexp_ptr=draft_lse,
           **target, **side("target_local_argmax"), **stats_t, draft_sampled_ptr=draft_sampled, **draft, **stats_d,
           cu_num_logits_ptr=cu_num_logits, idx_mapping_ptr=idx_mapping, temp_ptr=temperature, seed_ptr=seed, pos_ptr=pos,
           synthetic_conditional_rates_ptr=synthetic_conditional_rates, cumulative_log_p_ptr=cumulative,
           local_residual_mass_ptr=residual, local_residual_mass_stride=0 if residual is None else residual.stride(0),
           fly_entropy_ptr=None, fly_entropy_threshold=0.3, vocab_num_blocks=nb, PADDED_VOCAB_NUM_BLOCKS=padded,
           HAS_DRAFT_LOGITS=has_draft, SYNTHETIC_MODE=synthetic_conditional_rates is not None,
           USE_BLOCK_VERIFICATION=use_block_verification, FLY_WINDOW_SIZE=0)
    rnb = cdiv(vocab, MRV2_RESAMPLE_BLOCK)
    local_argmax = _scratch((num_reqs, rnb), torch.int64)
    local_max = _scratch((num_reqs, rnb), torch.float64 if use_fp64 else torch.float32)
    launch(backend, "_resample_kernel", (num_reqs, rnb), resampled_local_argmax_ptr=local_argmax,
           resampled_local_argmax_stride=local_argmax.stride(0), resampled_local_max_ptr=local_max,
           resampled_local_max_stride=local_max.stride(0), **target, target_rejected_logsumexp_ptr=target_lse, **draft,
           draft_rejected_logsumexp_ptr=draft_lse, rejected_step_ptr=num_sampled, cu_num_logits_ptr=cu_num_logits,
           expanded_idx_mapping_ptr=expanded_idx_mapping, draft_sampled_ptr=draft_sampled, temp_ptr=temperature,
           seed_ptr=seed, pos_ptr=pos, cumulative_log_p_ptr=cumulative, contexts_ptr=None, contexts_stride=0,
           watermarking_ptr=None, watermarking_skip_mask_ptr=None, watermark_key_0=0, watermark_key_1=0,
           vocab_size=vocab, BLOCK_SIZE=MRV2_RESAMPLE_BLOCK, HAS_DRAFT_LOGITS=has_draft, USE_FP64=use_fp64,
           USE_BLOCK_VERIFICATION=use_block_verification, CONTEXT_WIDTH=1, WATERMARK=False, DEDUPLICATE_CONTEXTS=False)
    launch(backend, "_insert_resampled_kernel", (num_reqs,), sampled_ptr=sampled, sampled_stride=sampled.stride(0),
           num_sampled_ptr=num_sampled, resampled_local_argmax_ptr=local_argmax,
           resampled_local_argmax_stride=local_argmax.stride(0), resampled_local_max_ptr=local_max,
           resampled_local_max_stride=local_max.stride(0), resample_num_blocks=rnb, cu_num_logits_ptr=cu_num_logits,
           expanded_idx_mapping_ptr=expanded_idx_mapping, temp_ptr=temperature,
           PADDED_RESAMPLE_NUM_BLOCKS=next_power_of_2(rnb))
    return sampled, num_sampled


def apply_topp_split(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor, *, backend: str, num_sm: int,
                     mask_value: float = float("-inf"), workspace: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """vLLM's ``_apply_topp_split`` (topk_topp_triton.py:1572-1615) over ``backend``: the stats kernel,
    five step rounds and the mask (``split_launches``), with S = ``_topp_split_count(B, V, num_sm)``
    and vLLM's workspace (``workspace``, else a fresh one of vLLM's sizes). Masks ``logits`` in place:
    the rows with p < 1 and, given ``k``, k >= V (C36)."""
    from contracts import topk_topp as c

    b, v = logits.shape
    ws = workspace if workspace is not None else c.split_workspace(logits.device)
    for name, grid, args in c.split_launches(logits, k, p, slices=c.split_count(b, v, num_sm), workspace=ws,
                                             mask_value=mask_value):
        launch(backend, name, grid, **args)


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None, *, backend: str,
                      programs: int | None = None, mask_value: float = float("-inf"), cuda_sm: int | None = None) -> torch.Tensor:
    """vLLM's ``apply_top_k_top_p_triton`` (topk_topp_triton.py:1618-1728) over ``backend``. As vLLM's:
    no k and no p (or no rows) returns ``logits`` itself; a non-unit inner stride masks a contiguous
    copy, which is returned. Off CUDA (``cuda_sm`` None) the monolithic kernel masks every row, with
    ``programs`` defaulting to the CPU platform's ``num_compute_units`` (the thread count) and vLLM's
    CPU tiles. ``cuda_sm`` takes vLLM's CUDA dispatch, as on a GPU of that many SMs, whatever device
    the tensors are on: CUDA's tiles, and for at most 64 rows with p the split pipeline, alone
    without k, or after the monolithic kernel (SPLIT_COVERS_PONLY) for the rows with k >= V."""
    from contracts.topk_topp import launch_args

    b = logits.shape[0]
    if b == 0 or (k is None and p is None):
        return logits
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    k = None if k is None else k.to(torch.int32)
    p = None if p is None else p.to(torch.float32)
    split = cuda_sm is not None and p is not None and b <= 64
    if split and k is None:
        apply_topp_split(logits, None, p, backend=backend, num_sm=cuda_sm, mask_value=mask_value)
        return logits
    tiles = dict(block=256, trunc=128) if cuda_sm is None else dict(block=8192, trunc=4096)
    programs = min(programs or cuda_sm or torch.get_num_threads(), b)
    launch(backend, "_topk_topp_kernel", (programs,),
           **launch_args(logits, k, p, programs=programs, mask_value=mask_value, split=split, **tiles))
    if split:
        apply_topp_split(logits, k, p, backend=backend, num_sm=cuda_sm, mask_value=mask_value)
    return logits


def apply_sampling_constraints(logits: torch.Tensor, cu_num_draft_tokens: torch.Tensor, sampling_metadata: SamplingMetadata,
                               *, backend: str) -> torch.Tensor:
    """V1's ``apply_sampling_constraints`` (vllm/v1/sample/rejection_sampler.py:589-645): all greedy
    returns ``logits`` untouched; otherwise the per-request temperature (0, greedy, read as 1), top-k
    and top-p are expanded to the draft tokens through ``expand_kernel``, ``logits`` is divided in place,
    and the mask applied (``apply_top_k_top_p`` on ``backend``)."""
    if sampling_metadata.all_greedy:
        return logits
    n = logits.shape[0]
    # vLLM passes its GREEDY_TEMPERATURE, the int 0 (a tl.constexpr), to the kernel.
    temperature = expand_batch_to_tokens(sampling_metadata.temperature, cu_num_draft_tokens, n, replace_from=int(GREEDY_TEMPERATURE),
                                         replace_to=1, backend=backend)
    logits.div_(temperature.unsqueeze(-1))
    k, p = sampling_metadata.top_k, sampling_metadata.top_p
    top_k = None if k is None else expand_batch_to_tokens(k, cu_num_draft_tokens, n, backend=backend)
    top_p = None if p is None else expand_batch_to_tokens(p, cu_num_draft_tokens, n, backend=backend)
    return apply_top_k_top_p(logits, top_k, top_p, backend=backend)


# -- Model Runner V2's sampling step (docs/sample.md) ----------------------------------------
@dataclass
class RequestParams:
    """The sampling parameters of one request, as ``SamplingParams`` carries them to MRV2's states."""

    temperature: float = 1.0
    top_k: int | None = None  # None: the whole vocabulary
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    bad_words: list[list[int]] = field(default_factory=list)
    allowed_token_ids: list[int] = field(default_factory=list)
    logit_bias: dict[int, float] = field(default_factory=dict)
    min_tokens: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    restore_when_all_masked: bool = False  # vLLM: the request has structured outputs


class MRV2SamplingStates:
    """The per-request tables MRV2's ``Sampler`` keeps (``SamplingStates`` and the logit-bias,
    penalties and bad-words processors of ``vllm/v1/worker/gpu/sample/``), ``max_num_reqs`` rows each,
    at vLLM's dtypes and widths; ``add_request`` fills a slot as theirs do, and ``apply_staged_writes``
    launches the penalties' bincount (K40) for the slots added since, on ``backend``."""

    def __init__(self, max_num_reqs: int, vocab_size: int, max_model_len: int, *, table_width: int | None = None) -> None:
        """``table_width`` narrows the id tables (allowed, bias, stop and bad-word tokens; vLLM's are
        1024, 1024, 128 and 1024 wide, 128 bad words) for batches of many thousand requests."""
        r, v = max_num_reqs, vocab_size
        w = table_width or 1024
        # logit_bias.py's MAX_NUM_* widths; VLLM_MAX_NUM_BAD_WORDS and VLLM_MAX_BAD_WORDS_TOTAL_TOKENS.
        self.MAX_ALLOWED, self.MAX_BIAS, self.MAX_STOP = w, w, min(128, w)
        self.MAX_BAD_WORDS, self.MAX_BAD_WORD_TOKENS = min(128, w), w
        self.vocab_size = v
        i32, f32 = torch.int32, torch.float32

        def zeros(*shape: int, dtype: torch.dtype = i32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype)

        self.temperature, self.top_p, self.min_p = zeros(r, dtype=f32), torch.ones(r), zeros(r, dtype=f32)
        self.top_k, self.seeds = torch.full((r,), v, dtype=i32), zeros(r, dtype=torch.int64)
        self.repetition_penalty, self.frequency_penalty = torch.ones(r), zeros(r, dtype=f32)
        self.presence_penalty = zeros(r, dtype=f32)
        self.prompt_bin_mask, self.output_bin_counts = zeros(r, cdiv(v, 32)), zeros(r, v)
        self.bad_word_token_ids, self.bad_word_offsets = zeros(r, self.MAX_BAD_WORD_TOKENS), zeros(r, self.MAX_BAD_WORDS + 1)
        self.num_bad_words = zeros(r)
        self.num_allowed_token_ids, self.allowed_token_ids = zeros(r), zeros(r, self.MAX_ALLOWED)
        self.num_logit_bias, self.logit_bias_token_ids = zeros(r), zeros(r, self.MAX_BIAS)
        self.logit_bias = zeros(r, self.MAX_BIAS, dtype=f32)
        self.min_lens, self.num_stop_token_ids, self.restore_when_all_masked = zeros(r), zeros(r), zeros(r)
        self.stop_token_ids = zeros(r, self.MAX_STOP)
        self.all_token_ids = zeros(r, max_model_len)
        self.prompt_len, self.prefill_len, self.total_len = zeros(r), zeros(r), zeros(r)
        self.use_penalty = torch.zeros(r, dtype=torch.bool)
        self.use_logit_bias = torch.zeros(r, dtype=torch.bool)
        self._new_penalties: list[int] = []

    def add_request(self, slot: int, prompt: list[int], output: list[int], params: RequestParams) -> None:
        """A request in ``slot``: its prompt and the output it resumes with (prefill = both)."""
        n, tokens = len(prompt), [*prompt, *output]
        self.all_token_ids[slot].zero_()
        self.all_token_ids[slot, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        self.prompt_len[slot], self.prefill_len[slot], self.total_len[slot] = n, len(tokens), len(tokens)
        self.temperature[slot], self.top_p[slot], self.min_p[slot] = params.temperature, params.top_p, params.min_p
        self.top_k[slot] = self.vocab_size if params.top_k is None else params.top_k
        self.seeds[slot] = params.seed
        self.repetition_penalty[slot] = params.repetition_penalty
        self.frequency_penalty[slot] = params.frequency_penalty
        self.presence_penalty[slot] = params.presence_penalty
        use = params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
        self.use_penalty[slot] = use
        if use:
            self._new_penalties.append(slot)
        flat = [t for word in params.bad_words for t in word]
        offsets = [0]
        for word in params.bad_words:
            offsets.append(offsets[-1] + len(word))
        self.num_bad_words[slot] = len(params.bad_words)
        self.bad_word_token_ids[slot, : len(flat)] = torch.tensor(flat, dtype=torch.int32)
        self.bad_word_offsets[slot, : len(offsets)] = torch.tensor(offsets, dtype=torch.int32)
        allowed, bias = params.allowed_token_ids, params.logit_bias
        self.num_allowed_token_ids[slot] = len(allowed)
        self.allowed_token_ids[slot, : len(allowed)] = torch.tensor(allowed, dtype=torch.int32)
        self.num_logit_bias[slot] = len(bias)
        self.logit_bias_token_ids[slot, : len(bias)] = torch.tensor(list(bias), dtype=torch.int32)
        self.logit_bias[slot, : len(bias)] = torch.tensor(list(bias.values()), dtype=torch.float32)
        self.min_lens[slot] = n + params.min_tokens
        stops = params.stop_token_ids if params.min_tokens > 0 else []
        self.num_stop_token_ids[slot] = len(stops)
        self.stop_token_ids[slot, : len(stops)] = torch.tensor(stops, dtype=torch.int32)
        self.restore_when_all_masked[slot] = int(bool(stops) and params.restore_when_all_masked)
        self.use_logit_bias[slot] = bool(allowed or bias or stops)

    def apply_staged_writes(self, *, backend: str) -> None:
        """``PenaltiesState.apply_staged_writes``: the new slots' rows zeroed, then counted by K40."""
        if not self._new_penalties:
            return
        idx = torch.tensor(self._new_penalties, dtype=torch.int64)
        self.prompt_bin_mask.index_fill_(0, idx, 0)
        self.output_bin_counts.index_fill_(0, idx, 0)
        kernel, grid, args = self.bincount_launch(idx)
        launch(backend, kernel, grid, **args)
        self._new_penalties.clear()

    def bincount_launch(self, slots: torch.Tensor) -> tuple[str, tuple[int, ...], dict[str, Any]]:
        """``bincount``'s launch (``penalties.py``) over the int64 ``slots``: ``(kernel, grid, arguments)``."""
        return "_bincount_kernel", (len(slots), cdiv(int(self.prefill_len[slots].max()), 1024)), dict(
            expanded_idx_mapping_ptr=slots, all_token_ids_ptr=self.all_token_ids,
            all_token_ids_stride=self.all_token_ids.stride(0), prompt_len_ptr=self.prompt_len,
            prefill_len_ptr=self.prefill_len, prompt_bin_mask_ptr=self.prompt_bin_mask,
            prompt_bin_mask_stride=self.prompt_bin_mask.stride(0), output_bin_counts_ptr=self.output_bin_counts,
            output_bin_counts_stride=self.output_bin_counts.stride(0), BLOCK_SIZE=1024)


def sampling_param_launches(logits: torch.Tensor, states: MRV2SamplingStates, expanded_idx_mapping: torch.Tensor,
                            idx_mapping: torch.Tensor, pos: torch.Tensor, input_ids: torch.Tensor,
                            expanded_local_pos: torch.Tensor, *, penalties_block: int = 8192
                            ) -> list[tuple[str, tuple[int, ...], dict[str, Any]]]:
    """The launches ``Sampler.apply_sampling_params`` makes on the float32 ``logits`` before top-k/top-p,
    in vLLM's pipeline order (bias adds, then penalties scale: they do not commute), each left out
    where vLLM skips it: ``(kernel, grid, arguments)``. ``penalties_block``: 8192, or 1024 as vLLM's
    CPU build sets it."""
    s, reqs = states, idx_mapping.long()
    n, v = logits.shape
    rows = dict(logits_ptr=logits, logits_stride=logits.stride(0), expanded_idx_mapping_ptr=expanded_idx_mapping)
    launches: list[tuple[str, tuple[int, ...], dict[str, Any]]] = []
    if bool(s.use_logit_bias[reqs].any()):
        launches.append(("_bias_kernel", (n,), dict(
            **rows, vocab_size=v, num_allowed_token_ids_ptr=s.num_allowed_token_ids, allowed_token_ids_ptr=s.allowed_token_ids,
            allowed_token_ids_stride=s.allowed_token_ids.stride(0), num_logit_bias_ptr=s.num_logit_bias,
            bias_token_ids_ptr=s.logit_bias_token_ids, bias_token_ids_stride=s.logit_bias_token_ids.stride(0),
            bias_ptr=s.logit_bias, bias_stride=s.logit_bias.stride(0), pos_ptr=pos, min_lens_ptr=s.min_lens,
            num_stop_token_ids_ptr=s.num_stop_token_ids, restore_when_all_masked_ptr=s.restore_when_all_masked,
            stop_token_ids_ptr=s.stop_token_ids, stop_token_ids_stride=s.stop_token_ids.stride(0),
            BLOCK_SIZE=next_power_of_2(max(s.MAX_ALLOWED, s.MAX_BIAS, s.MAX_STOP)), LOGITS_BLOCK_SIZE=8192,
            CHECK_ALL_MASKED_ROWS=bool(s.restore_when_all_masked[reqs].any()))))
    if bool(s.use_penalty[reqs].any()):
        launches.append(("_penalties_kernel", (n, cdiv(v, penalties_block)), dict(
            **rows, token_ids_ptr=input_ids, expanded_local_pos_ptr=expanded_local_pos,
            repetition_penalty_ptr=s.repetition_penalty, frequency_penalty_ptr=s.frequency_penalty,
            presence_penalty_ptr=s.presence_penalty, prompt_bin_mask_ptr=s.prompt_bin_mask,
            prompt_bin_mask_stride=s.prompt_bin_mask.stride(0), output_bin_counts_ptr=s.output_bin_counts,
            output_bin_counts_stride=s.output_bin_counts.stride(0), vocab_size=v, BLOCK_SIZE=penalties_block)))
    bad_words = int(s.num_bad_words[reqs].max()) if len(reqs) else 0
    if bad_words:
        launches.append(("_bad_words_kernel", (n, bad_words), dict(
            **rows, bad_word_token_ids_ptr=s.bad_word_token_ids, bad_word_token_ids_stride=s.bad_word_token_ids.stride(0),
            bad_word_offsets_ptr=s.bad_word_offsets, bad_word_offsets_stride=s.bad_word_offsets.stride(0),
            num_bad_words_ptr=s.num_bad_words, all_token_ids_ptr=s.all_token_ids,
            all_token_ids_stride=s.all_token_ids.stride(0), prompt_len_ptr=s.prompt_len, total_len_ptr=s.total_len,
            input_ids_ptr=input_ids, expanded_local_pos_ptr=expanded_local_pos)))
    t = s.temperature[reqs]
    if not bool(((t == 0.0) | (t == 1.0)).all()):
        launches.append(("_temperature_kernel", (n, cdiv(v, 8192)),
                         dict(**rows, temperature_ptr=s.temperature, vocab_size=v, BLOCK_SIZE=8192)))
    if bool((s.min_p[reqs] != 0.0).any()):
        launches.append(("_min_p_kernel", (n,), dict(**rows, min_p_ptr=s.min_p, vocab_size=v, BLOCK_SIZE=1024)))
    return launches


def mrv2_apply_sampling_params(logits: torch.Tensor, states: MRV2SamplingStates, expanded_idx_mapping: torch.Tensor,
                               idx_mapping: torch.Tensor, pos: torch.Tensor, input_ids: torch.Tensor,
                               expanded_local_pos: torch.Tensor, *, backend: str, penalties_block: int = 8192,
                               skip_top_k_top_p: bool = False) -> torch.Tensor:
    """``Sampler.apply_sampling_params`` of vLLM 0.33.0 (``sampler.py:226``) over ``backend``: a float32
    copy of ``logits`` (``logits`` itself when no request of ``idx_mapping`` needs processing), then
    ``sampling_param_launches`` (logit bias, penalties, bad words, temperature, min-p) and top-k/top-p
    (``apply_top_k_top_p``). ``input_ids``: each row's input token (the rejection sampler passes
    ``draft_sampled``: a request's last committed token, then its drafts). Thinking budgets and custom
    processors are not modelled."""
    s, reqs, m = states, idx_mapping.long(), expanded_idx_mapping.long()
    k = s.top_k[m] if bool((s.top_k[reqs] != s.vocab_size).any()) else None
    p = s.top_p[m] if bool((s.top_p[reqs] != 1.0).any()) else None
    processed = torch.empty_like(logits, dtype=torch.float32)
    launches = sampling_param_launches(processed, s, expanded_idx_mapping, idx_mapping, pos, input_ids, expanded_local_pos,
                                       penalties_block=penalties_block)
    if not launches and k is None and p is None:  # no request needs processing: vLLM hands the logits on
        return logits
    processed.copy_(logits)
    for kernel, grid, args in launches:
        launch(backend, kernel, grid, **args)
    return processed if skip_top_k_top_p else apply_top_k_top_p(processed, k, p, backend=backend)


def mrv2_verify(logits: torch.Tensor, states: MRV2SamplingStates, draft_logits: torch.Tensor | None,
                draft_sampled: torch.Tensor, cu_num_logits: torch.Tensor, pos: torch.Tensor, idx_mapping: torch.Tensor,
                expanded_idx_mapping: torch.Tensor, expanded_local_pos: torch.Tensor, num_speculative_steps: int,
                *, backend: str, **options: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MRV2's verification (``RejectionSampler._verify``, ``spec_decode/rejection_sampler.py:251``):
    the sampling parameters applied to the target's rows (the drafts as ``input_ids``), then the
    rejection sampler (K13-K18) on the processed logits with the states' temperatures and seeds:
    ``(processed_logits, sampled, num_sampled)``. ``options``: ``penalties_block``, and
    ``mrv2_rejection_sample``'s ``use_fp64`` and ``use_block_verification``."""
    block = options.pop("penalties_block", 8192)
    processed = mrv2_apply_sampling_params(logits, states, expanded_idx_mapping, idx_mapping, pos, draft_sampled,
                                           expanded_local_pos, backend=backend, penalties_block=block)
    sampled, num_sampled = mrv2_rejection_sample(
        processed, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping, expanded_local_pos,
        states.temperature, states.seeds, num_speculative_steps, backend=backend, **options)
    return processed, sampled, num_sampled


__all__ = [
    "apply_sampling_constraints",
    "apply_top_k_top_p",
    "apply_topp_split",
    "SamplingMetadata",
    "compute_fly_entropy",
    "expand_batch_to_tokens",
    "generate_uniform_probs",
    "MRV2SamplingStates",
    "mrv2_apply_sampling_params",
    "mrv2_verify",
    "sampling_param_launches",
    "mrv2_rejection_sample",
    "rejection_sample",
    "RequestParams",
    "sample_recovered_tokens",
    "unconditional_to_conditional_rates",
]
