"""Contract of the async-scheduling update (docs/async_update.md, vllm/v1/spec_decode/utils.py).

``update_num_computed_tokens_for_batch_change`` is not a Triton kernel: vLLM 0.33.0 runs it as a
``torch.compile``d PyTorch function on the device, with no range checks. With async scheduling the
CPU's token counts assume every draft was accepted; this corrects, on the device, the requests of
the new batch that were in the previous one with drafts, from the previous step's valid counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from contracts.spec import INT, KernelSpec, Role, ptr, require

I32, I64 = torch.int32, torch.int64
K21 = "update_num_computed_tokens_for_batch_change"


def _preconditions(a: Mapping[str, Any]) -> None:
    prev = a["prev_positions"]
    n = prev.numel()
    for name in ("num_accepted_tokens", "cpu_num_computed_tokens"):
        t = a[name]
        require(t.numel() == n, K21, name, f"must hold exactly len(prev_positions) = {n} elements, has {t.numel()}")
    nc = a["num_computed_tokens"]
    require(nc.numel() >= n, K21, "num_computed_tokens", f"must hold at least len(prev_positions) = {n} elements, has {nc.numel()}")
    # A previous position indexes three tensors of the previous batch (C34); negative: a new request.
    old = prev[prev >= 0].to(I64)
    if old.numel():
        top, i = int(old.max()), int(prev.to(I64).argmax())
        for name in ("valid_sampled_token_count", "prev_num_draft_tokens", "num_computed_tokens"):
            size = a[name].numel()
            require(top < size, K21, "prev_positions",
                    f"entry {i} = {top} indexes '{name}' of {size} elements (must be < {size}, or negative for a new request)")


def _explain(a: Mapping[str, Any], output: str, index: int) -> str:
    prev = a["prev_positions"]
    if index >= prev.numel():
        return f"element {index} lies past len(prev_positions) = {prev.numel()}: it must stay untouched"
    p = int(prev[index])
    line = f"request {index}: prev_positions={p}, cpu_num_computed_tokens={int(a['cpu_num_computed_tokens'][index])}"
    if p >= 0:
        line += (f", previous: num_computed_tokens={int(a['num_computed_tokens'][p])}, "
                 f"valid_sampled_token_count={int(a['valid_sampled_token_count'][p])}, "
                 f"prev_num_draft_tokens={int(a['prev_num_draft_tokens'][p])}")
    return line


def _rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    return "C34 async correction"


UPDATE = KernelSpec(
    name=K21,
    family="async_update",
    qualname=f"vllm.v1.spec_decode.utils.{K21}",
    params=(
        ptr("num_computed_tokens", (I32,), I32, "[>= n] per slot; the first n are rewritten", role=Role.INOUT),
        ptr("num_accepted_tokens", (I32,), I32, "[n] per request; corrected where it had drafts", role=Role.INOUT),
        ptr("prev_positions", INT, I64, "[n] the request's slot in the previous batch, or negative when new"),
        ptr("valid_sampled_token_count", (I32,), I32, "[previous batch] tokens the previous step emitted"),
        ptr("prev_num_draft_tokens", INT, I32, "[previous batch] drafts the previous step verified"),
        ptr("cpu_num_computed_tokens", (I32,), I32, "[n] the CPU's count (optimistic for requests with drafts)"),
    ),
    grid=lambda a: (1,),
    preconditions=_preconditions,
    explain=_explain,
    rule=_rule,
    host=True,
)

SPECS = (UPDATE,)
