"""The oracle of Model Runner V2's bad words (docs/bad_words.md, C43): the readable specification.

``_bad_words_kernel``: row ``r`` of request state ``s`` at local position ``pos`` sees the request's
committed output ``all_token_ids[s, prompt_len[s]:total_len[s]]`` followed by the drafts before it,
``input_ids[r - pos + 1 : r + 1]`` (local position 0 is the row after the last committed token; it
sees no draft). Each of the state's ``num_bad_words[s]`` bad words whose prefix (all its tokens but
the last) ends that sequence bans its last token: the row's logit there becomes -inf, whatever it
held (-inf, NaN). A one-token bad word bans always; a prefix longer than the sequence never matches.
Nothing else is written.
"""

from __future__ import annotations

import torch

from contracts import bad_words as contract


def _bad_words_kernel(
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    bad_word_token_ids_ptr: torch.Tensor,
    bad_word_token_ids_stride: int,
    bad_word_offsets_ptr: torch.Tensor,
    bad_word_offsets_stride: int,
    num_bad_words_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    prompt_len_ptr: torch.Tensor,
    total_len_ptr: torch.Tensor,
    input_ids_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
) -> None:
    a = locals()
    for r in range(contract.rows(a)):
        s = int(expanded_idx_mapping_ptr[r])
        if int(num_bad_words_ptr[s]) == 0:
            continue
        sequence = contract.seen(a, r)
        for word in contract.words(a, s):
            if contract.bans(word, sequence):
                logits_ptr[r, word[-1]] = float("-inf")
