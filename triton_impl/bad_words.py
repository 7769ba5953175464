"""Triton kernel of Model Runner V2's bad words, with vLLM 0.33.0's name, parameters and grid
(docs/bad_words.md, C43).

``_bad_words_kernel``: one program per row and bad word (grid ``(num_tokens, max_num_bad_words)``);
a program past its request's count does nothing. A program compares the bad word's prefix with the
end of what its row sees, token by token, and stores -inf at the banned column on a match. Two
programs of a row may ban one column: both store -inf.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _bad_words_kernel(
    logits_ptr,  # [T, V] float32, in place
    logits_stride,
    expanded_idx_mapping_ptr,  # [T] request state of each row
    bad_word_token_ids_ptr,  # [max_num_reqs, W] each request's bad words, flattened
    bad_word_token_ids_stride,
    bad_word_offsets_ptr,  # [max_num_reqs, B + 1] bad word j is [offsets[j], offsets[j + 1])
    bad_word_offsets_stride,
    num_bad_words_ptr,  # [max_num_reqs]
    all_token_ids_ptr,  # [max_num_reqs, max_model_len] committed tokens
    all_token_ids_stride,
    prompt_len_ptr,  # [max_num_reqs]
    total_len_ptr,  # [max_num_reqs]
    input_ids_ptr,  # [T] the last committed token at local position 0, then the drafts
    expanded_local_pos_ptr,  # [T] each row's position among its request's rows
):
    token_idx = tl.program_id(0).to(tl.int64)
    word = tl.program_id(1)
    state = tl.load(expanded_idx_mapping_ptr + token_idx).to(tl.int64)
    if word < tl.load(num_bad_words_ptr + state):
        pos = tl.load(expanded_local_pos_ptr + token_idx).to(tl.int64)
        prompt_len = tl.load(prompt_len_ptr + state).to(tl.int64)
        output_len = tl.load(total_len_ptr + state).to(tl.int64) - prompt_len
        seen = output_len + pos  # the committed output, then the row's drafts 1..pos
        offsets = bad_word_offsets_ptr + state * bad_word_offsets_stride + word
        start = tl.load(offsets).to(tl.int64)
        end = tl.load(offsets + 1).to(tl.int64)
        prefix_len = end - 1 - start
        if prefix_len <= seen:
            tokens = bad_word_token_ids_ptr + state * bad_word_token_ids_stride
            committed = all_token_ids_ptr + state * all_token_ids_stride + prompt_len
            request_rows = input_ids_ptr + token_idx - pos  # local position j's input id at request_rows[j]
            mismatches = tl.full((), 0, tl.int32)
            for i in range(0, prefix_len.to(tl.int32)):
                at = seen - prefix_len + i  # the sequence index prefix token i must match
                if at < output_len:
                    actual = tl.load(committed + at).to(tl.int64)
                else:
                    actual = tl.load(request_rows + (at - output_len + 1)).to(tl.int64)
                expected = tl.load(tokens + start + i).to(tl.int64)
                mismatches += (expected != actual).to(tl.int32)
            if mismatches == 0:
                banned = tl.load(tokens + end - 1).to(tl.int64)
                tl.store(logits_ptr + token_idx * logits_stride + banned, float("-inf"))
