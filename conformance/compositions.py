"""The host-side compositions of vLLM 0.33.0's V1 rejection sampler (spec §3), over any backend.

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

from conformance import kernels
from conformance.backends import resolve_kernel
from conformance.runner import _copy_args

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


def launch(backend: str, kernel: str, grid: tuple[int, ...], **args: Any) -> None:
    """Launches ``kernel`` on ``backend`` with CPU tensors; outputs land in the given tensors."""
    spec = kernels.get(kernel)
    b, k = resolve_kernel(backend, spec)
    device = b.device()
    # On another device: copies that keep aliasing and strides, and every output copied back.
    moved = args if device == "cpu" else _copy_args(args, device)
    b.launcher(k, grid)(**moved)
    if moved is not args:
        for p in spec.outputs:
            if isinstance(args[p.name], torch.Tensor):
                args[p.name].copy_(moved[p.name])


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
    *,
    backend: str = "reference",
    uniform: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """§3.1: int32 ``[B, S+1]`` output of the V1 rejection sampler (FLy arguments out of scope)."""
    assert draft_token_ids.ndim == 1 and draft_token_ids.is_contiguous()
    assert draft_probs is None or (draft_probs.ndim == 2 and draft_probs.is_contiguous())
    assert cu_num_draft_tokens.ndim == 1 and bonus_token_ids.is_contiguous()
    assert target_logits.ndim == 2 and target_logits.shape[0] == draft_token_ids.shape[0]
    assert max_spec_len <= MAX_SPEC_LEN
    assert synthetic_mode == (synthetic_conditional_rates is not None)
    batch, (num_tokens, vocab) = len(num_draft_tokens), target_logits.shape
    meta = sampling_metadata
    out = torch.full((batch, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32)
    is_greedy = None if meta.all_greedy else meta.temperature == GREEDY_TEMPERATURE
    if uniform is None and (synthetic_mode or not meta.all_greedy):
        uniform = generate_uniform_probs(num_tokens, num_draft_tokens, meta.generators)
    target_probs = None if meta.all_greedy else torch.softmax(target_logits, dim=-1, dtype=torch.float32)

    if not meta.all_random:
        target_argmax = target_logits.argmax(dim=-1)
        launch(backend, "rejection_greedy_sample_kernel", (batch,),
               output_token_ids_ptr=out, cu_num_draft_tokens_ptr=cu_num_draft_tokens, draft_token_ids_ptr=draft_token_ids,
               target_argmax_ptr=target_argmax, bonus_token_ids_ptr=bonus_token_ids, is_greedy_ptr=is_greedy,
               max_spec_len=max_spec_len, uniform_probs_ptr=uniform,
               synthetic_conditional_rates_ptr=synthetic_conditional_rates, SYNTHETIC_MODE=synthetic_mode)
        if meta.all_greedy:
            return out

    recovered = sample_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs,
                                        target_probs, meta, use_fp64_gumbel, backend=backend, noise=noise)
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


__all__ = [
    "SamplingMetadata",
    "expand_batch_to_tokens",
    "generate_uniform_probs",
    "rejection_sample",
    "sample_recovered_tokens",
    "unconditional_to_conditional_rates",
]
