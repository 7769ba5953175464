"""Contracts of Model Runner V2's rejection-sampler family (vLLM 0.33.0's default GPU path,
``vllm/v1/worker/gpu/spec_decode/rejection_sampler.py`` and ``rejection_sampler_utils.py``).

MRV2 lays a batch out by logits row: request ``r`` owns rows ``cu[r] .. cu[r+1]-1`` of
``cu_num_logits`` (exclusive offsets, ``R + 1`` entries), one row per draft position plus its
bonus row. The integer kernels here prepare and flatten that layout:

* ``_gather_draft_sampled_kernel`` reads, for every logits row, the token and position the row
  was scheduled with, and marks as placeholders (-1) the draft rows of a step that started inside
  the request's prefill;
* ``_flatten_sampled_kernel`` copies each request's accepted tokens into the flat per-row output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from conformance.contract import (
    INT,
    KernelSpec,
    Role,
    at_least,
    cdiv,
    constexpr,
    power_of_two,
    ptr,
    require,
    require_fits,
    require_length,
    scalar,
)
from conformance.kernels._checks import exclusive_offsets, flat_view, holds, item, span

I32, I64 = torch.int32, torch.int64
_MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"
K11 = "_gather_draft_sampled_kernel"
K12 = "_flatten_sampled_kernel"


# -- K11 -------------------------------------------------------------------------------------------
def _gather_preconditions(a: Mapping[str, Any]) -> None:
    k, n = K11, a["num_logits"]
    at_least(k, "num_logits", n, 0)
    power_of_two(k, "BLOCK_SIZE", a["BLOCK_SIZE"])
    for name in ("draft_sampled_ptr", "pos_ptr", "logits_indices_ptr", "expanded_idx_mapping_ptr", "expanded_local_pos_ptr"):
        require_length(k, name, a[name], n)
    if n == 0:
        return
    idx = a["logits_indices_ptr"][:n].to(I64)
    tokens = min(a["input_ids_ptr"].numel(), a["positions_ptr"].numel())
    require(int(idx.min()) >= 0 and int(idx.max()) < tokens, k, "logits_indices_ptr",
            f"must hold token indices in [0, {tokens}) (the shorter of input_ids and positions)")
    slots = a["expanded_idx_mapping_ptr"][:n].to(I64)
    require(int(slots.min()) >= 0 and int(slots.max()) < a["prefill_len_ptr"].numel(), k, "expanded_idx_mapping_ptr",
            f"must hold request slots in [0, {a['prefill_len_ptr'].numel()}) (prefill_len's length)")
    # Positions and local positions are counts: with both >= 0, `pos - local_pos` is exact at any
    # width (C25: negative positions are invalid input).
    positions = a["positions_ptr"].to(I64)[idx]
    require(int(positions.min()) >= 0, k, "positions_ptr", "must hold positions >= 0 at the gathered tokens (C25)")
    require(int(a["expanded_local_pos_ptr"][:n].min()) >= 0, k, "expanded_local_pos_ptr", "must hold local positions >= 0")
    ids = a["input_ids_ptr"].to(I64)[idx]
    for v in (int(ids.min()), int(ids.max())):
        require_fits(k, "input_ids_ptr", v, "draft_sampled_ptr", a["draft_sampled_ptr"])
    require_fits(k, "positions_ptr", int(positions.max()), "pos_ptr", a["pos_ptr"])


def _explain_gather(a: Mapping[str, Any], output: str, index: int) -> str:
    if index >= a["num_logits"]:
        return f"row {index} lies past num_logits={a['num_logits']}: it must stay untouched"
    t = item(a["logits_indices_ptr"], index)
    s = item(a["expanded_idx_mapping_ptr"], index)
    lp = item(a["expanded_local_pos_ptr"], index)
    pos = item(a["positions_ptr"], t)
    return (f"row {index}: token {t} (input_id={item(a['input_ids_ptr'], t)}, position={pos}), slot {s} "
            f"(prefill_len={item(a['prefill_len_ptr'], s)}), local_pos={lp}: placeholder iff local_pos > 0 and "
            f"position - local_pos < prefill_len")


# -- K12 -------------------------------------------------------------------------------------------
def _flatten_preconditions(a: Mapping[str, Any]) -> None:
    k = K12
    cu_t = a["cu_num_logits_ptr"]
    require(cu_t.numel() >= 1, k, "cu_num_logits_ptr", "must hold at least one element (num_reqs + 1)")
    cu = exclusive_offsets(k, "cu_num_logits_ptr", cu_t, cu_t.numel())
    r = len(cu) - 1
    require_length(k, "num_sampled_ptr", a["num_sampled_ptr"], r)
    if r == 0:
        return
    ns = a["num_sampled_ptr"][:r].to(I64)
    rows = torch.tensor(cu, dtype=I64)
    room = rows[1:] - rows[:-1]
    bad = ((ns < 0) | (ns > room)).nonzero()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"{k}: 'num_sampled_ptr' must hold counts in [0, cu[r+1] - cu[r]] so that requests write "
                         f"disjoint rows; request {i} has {int(ns[i])} for {int(room[i])} rows")
    require_length(k, "flat_sampled_ptr", a["flat_sampled_ptr"], cu[-1])
    stride, t = a["sampled_stride"], a["sampled_ptr"]
    # Request r reads its own num_sampled[r] tokens from r * stride: rows past the span (a Python
    # int, never wrapped) fail first, then rows that start in a gap between the tensor's rows.
    for req, n in enumerate(ns.tolist()):
        if n and not (0 <= req * stride <= span(t) - n and bool(holds(t, torch.tensor([req * stride]), n))):
            raise ValueError(f"{k}: 'sampled_ptr' must hold request {req}'s {n} accepted tokens at flat index "
                             f"{req * stride} (row stride {stride}), shape {tuple(t.shape)}")
    if int(ns.max()):
        cols = torch.arange(int(ns.max()), dtype=I64)
        flat = (torch.arange(r, dtype=I64)[:, None] * stride + cols[None, :])[cols[None, :] < ns[:, None]]
        vals = flat_view(t).to(I64)[flat]
        for v in (int(vals.min()), int(vals.max())):
            require_fits(k, "sampled_ptr", v, "flat_sampled_ptr", a["flat_sampled_ptr"])


def _explain_flatten(a: Mapping[str, Any], output: str, index: int) -> str:
    cu = a["cu_num_logits_ptr"].to(I64)
    r = int(torch.searchsorted(cu, index, right=True)) - 1
    if r < 0 or r >= cu.numel() - 1:
        return f"flat row {index} lies outside every request: it must stay untouched"
    i = index - int(cu[r])
    n = item(a["num_sampled_ptr"], r)
    return f"request {r}, row {i} (cu={int(cu[r])}, num_sampled={n}, sampled row stride {a['sampled_stride']})"


GATHER_DRAFT_SAMPLED = KernelSpec(
    name=K11,
    family="mrv2",
    qualname=f"{_MODULE}.{K11}",
    params=(
        ptr("draft_sampled_ptr", INT, I32, "[NL] the row's input token, -1 for a placeholder draft", role=Role.OUT),
        ptr("pos_ptr", INT, I64, "[NL] the row's position", role=Role.OUT),
        ptr("input_ids_ptr", INT, I32, "[num_tokens] scheduled tokens"),
        ptr("positions_ptr", INT, I64, "[num_tokens] their positions"),
        ptr("logits_indices_ptr", INT, I64, "[NL] the token of each logits row"),
        ptr("expanded_idx_mapping_ptr", INT, I64, "[NL] the request state slot of each row"),
        ptr("expanded_local_pos_ptr", INT, I32, "[NL] the row's position inside its request (0 = first)"),
        ptr("prefill_len_ptr", INT, I32, "[max_num_reqs] prefill length per state slot"),
        scalar("num_logits", "NL"),
        constexpr("BLOCK_SIZE", "rows per program (1024 at the call site)"),
    ),
    grid=lambda a: (cdiv(a["num_logits"], a["BLOCK_SIZE"]),),
    preconditions=_gather_preconditions,
    explain=_explain_gather,
    rule=lambda a, output, index, kind: "MRV2 placeholder draft" if output == "draft_sampled_ptr" else "MRV2 gather",
    doc="MRV2: each logits row's token and position; draft rows of a step begun inside the prefill become -1",
)

FLATTEN_SAMPLED = KernelSpec(
    name=K12,
    family="mrv2",
    qualname=f"{_MODULE}.{K12}",
    params=(
        ptr("flat_sampled_ptr", INT, I64, "[NL] per-row output (the host zero-fills it)", role=Role.OUT),
        ptr("sampled_ptr", INT, I64, "[R, K+1] accepted tokens per request, rows sampled_stride apart",
            ndim=(1, 2), contiguous=False),
        scalar("sampled_stride", "row stride of sampled"),
        ptr("num_sampled_ptr", INT, I32, "[R] tokens to copy per request"),
        ptr("cu_num_logits_ptr", INT, I32, "[R+1] exclusive row offsets"),
    ),
    grid=lambda a: (max(a["cu_num_logits_ptr"].numel() - 1, 0),),
    preconditions=_flatten_preconditions,
    explain=_explain_flatten,
    doc="MRV2: copy each request's num_sampled tokens to rows cu[r] .. cu[r] + num_sampled[r] - 1",
)

SPECS = (GATHER_DRAFT_SAMPLED, FLATTEN_SAMPLED)
