"""The oracle of Model Runner V2's penalties (docs/penalties.md, C42): the readable specification.

``_penalties_kernel``: row ``r`` takes the penalties of request state ``s = expanded_idx_mapping[r]``.
A repetition penalty of 1 with frequency and presence penalties of 0 (``-0.0`` too) leaves the row
unwritten. Otherwise, over its first ``vocab_size`` columns, in float32, one rounding per operation:

- ``count[t]`` is the state's output count of token ``t`` plus how often ``t`` appears among the
  row's earlier drafts, ``token_ids[r - pos + 1 .. r]`` with ``pos = expanded_local_pos[r]`` (an id
  outside ``[0, V)`` counts nowhere); ``seen[t] = count[t] > 0``;
- with a repetition penalty ``p != 1``, a token in the prompt (bit ``t % 32`` of the state's word
  ``t // 32``) or seen takes ``x * RN(1 / p)`` where ``x > 0`` and ``x * p`` where ``x <= 0``
  (vLLM's ``1.0 / scale`` then a product: two roundings, not ``x / p``);
- then ``x - RN(freq * float32(count))``, then ``x - presence * seen`` (the product exact: the
  penalty or a signed zero).

``_bincount_kernel``: for each row's state ``s``, the prompt tokens ``all_token_ids[s, :prompt_len]``
set their bits in ``prompt_bin_mask[s]`` (OR-ed into what is there) and the output tokens
``all_token_ids[s, prompt_len:prefill_len]`` are added to ``output_bin_counts[s]``. Each row
contributes: a state named by two rows gets its prompt's bits (the same) and its outputs counted
twice, in any order (vLLM's atomics).
"""

from __future__ import annotations

import torch

from contracts import penalties as contract
from contracts._checks import flat_view

F32, I32, I64 = torch.float32, torch.int32, torch.int64


def _penalties_kernel(
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    token_ids_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    repetition_penalty_ptr: torch.Tensor,
    frequency_penalty_ptr: torch.Tensor,
    presence_penalty_ptr: torch.Tensor,
    prompt_bin_mask_ptr: torch.Tensor,
    prompt_bin_mask_stride: int,
    output_bin_counts_ptr: torch.Tensor,
    output_bin_counts_stride: int,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    a = locals()
    v = vocab_size
    for r in range(contract.rows(a)):
        s = int(expanded_idx_mapping_ptr[r])
        rep, freq, pres = repetition_penalty_ptr[s], frequency_penalty_ptr[s], presence_penalty_ptr[s]
        if not contract.uses_penalty(float(rep), float(freq), float(pres)) or v == 0:
            continue
        at = s * output_bin_counts_stride
        count = (flat_view(output_bin_counts_ptr)[at : at + v].to(I64) + contract.draft_counts(a, r)).to(I32)
        seen = count > 0
        x = logits_ptr[r, :v].clone()
        if rep != 1.0:
            scale = torch.where(contract.prompt_bits(a, s) | seen, rep, torch.tensor(1.0, dtype=F32))
            x = torch.where(x > 0, x * (1.0 / scale), x * scale)
        x = x - freq * count.to(F32)
        x = x - pres * seen.to(F32)
        logits_ptr[r, :v] = x


def _bincount_kernel(
    expanded_idx_mapping_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    prompt_len_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
    prompt_bin_mask_ptr: torch.Tensor,
    prompt_bin_mask_stride: int,
    output_bin_counts_ptr: torch.Tensor,
    output_bin_counts_stride: int,
    BLOCK_SIZE: int,
) -> None:
    a = locals()
    words, counts = flat_view(prompt_bin_mask_ptr), flat_view(output_bin_counts_ptr)
    for s in expanded_idx_mapping_ptr.tolist():
        prompt, output = contract.prefill_of(a, s)
        if prompt.numel():
            tokens = prompt.unique()
            # Distinct bits of one word add up to their OR; then OR-ed into the word's 32 bits.
            at, word_of = (s * prompt_bin_mask_stride + tokens // contract.WORD).unique(return_inverse=True)
            bits = torch.zeros(at.numel(), dtype=I64).index_add_(0, word_of, 1 << (tokens % contract.WORD))
            merged = (words[at].to(I64) & 0xFFFFFFFF) | bits
            words[at] = torch.where(merged >= 2**31, merged - 2**32, merged).to(I32)  # bit 31: a negative int32
        if output.numel():
            counts.index_add_(0, s * output_bin_counts_stride + output, torch.ones_like(output, dtype=I32))
