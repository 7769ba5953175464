"""The PyTorch oracle of the async-scheduling update (docs/async_update.md, C34): the readable
specification.

For request i of the new batch, ``p = prev_positions[i]`` is its slot in the previous batch
(negative: a new request). It *participates* when ``p >= 0`` and the previous step verified drafts
for it (``prev_num_draft_tokens[p] > 0``); then its count becomes the device's previous count plus
what the previous step emitted, and its accepted count what the previous step emitted. Everything
else takes the CPU's count and keeps its accepted count. Every value is read before anything is
written, and a new request reads nothing.
"""

from __future__ import annotations

import torch


def update_num_computed_tokens_for_batch_change(
    num_computed_tokens: torch.Tensor,
    num_accepted_tokens: torch.Tensor,
    prev_positions: torch.Tensor,
    valid_sampled_token_count: torch.Tensor,
    prev_num_draft_tokens: torch.Tensor,
    cpu_num_computed_tokens: torch.Tensor,
) -> None:
    n = prev_positions.numel()
    prev = prev_positions.to(torch.int64)
    old = prev >= 0
    at = prev[old]
    participating = torch.zeros(n, dtype=torch.bool)
    participating[old] = prev_num_draft_tokens[at] > 0
    valid = torch.zeros(n, dtype=torch.int32)
    valid[old] = valid_sampled_token_count[at]
    computed = torch.zeros(n, dtype=torch.int32)
    computed[old] = num_computed_tokens[at]
    # int32 addition wraps, as the engine's does (C32: value arithmetic wraps).
    num_computed_tokens[:n] = torch.where(participating, computed + valid, cpu_num_computed_tokens)
    num_accepted_tokens.copy_(torch.where(participating, valid, num_accepted_tokens))
