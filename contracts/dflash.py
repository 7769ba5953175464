"""Contract of the DFlash input-preparation kernel (docs/spec.md §2.9, vllm/v1/spec_decode/utils.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from contracts._checks import exclusive_offsets, item, require_rows
from contracts.spec import (
    INT,
    Flag,
    KernelSpec,
    Role,
    at_least,
    cdiv,
    constexpr,
    in_int64,
    power_of_two,
    ptr,
    require,
    require_length,
    scalar,
)

I32, I64 = torch.int32, torch.int64
K9 = "copy_and_expand_dflash_inputs_kernel"


def _rejected(a: Mapping[str, Any], b: int) -> list[int]:
    """rej(r) per request: the rejected-count tensor's entries, or zeros without one."""
    if a["HAS_NUM_REJECTED"]:
        return a["num_rejected_tokens_ptr"][:b].tolist()
    return [0] * b


def _preconditions(a: Mapping[str, Any]) -> None:
    qsl_t = a["query_start_loc_ptr"]
    require(qsl_t.numel() >= 1, K9, "query_start_loc_ptr", "must hold at least one element (B + 1)")
    b = qsl_t.numel() - 1
    qsl = exclusive_offsets(K9, "query_start_loc_ptr", qsl_t, b + 1)
    positions = a["target_positions_ptr"]
    n_ctx = a["total_input_tokens"]
    for name in ("out_context_positions_ptr", "out_context_slot_mapping_ptr"):
        require_length(K9, name, a[name], qsl[b])
    # Context reads: min(i, N_ctx - 1) for i in [qsl[0], qsl[B]).
    if qsl[b] > qsl[0]:
        require(n_ctx >= 1, K9, "total_input_tokens", f"must be >= 1 when there are context tokens, got {n_ctx}")
        require_length(K9, "target_positions_ptr", positions, min(qsl[b], n_ctx))
    if a["HAS_NUM_REJECTED"]:
        require_length(K9, "num_rejected_tokens_ptr", a["num_rejected_tokens_ptr"], b)
    rej = _rejected(a, b)
    which = "num_rejected_tokens_ptr" if a["HAS_NUM_REJECTED"] else "query_start_loc_ptr"
    for r in range(b):
        last = qsl[r + 1] - rej[r] - 1
        inside = 0 <= last < positions.numel()
        require(inside, K9, which, f"makes request {r} read its last position at {last}, outside target_positions_ptr[0, {positions.numel()})")
    q, k = a["num_query_per_req"], a["num_speculative_tokens"]
    at_least(K9, "num_query_per_req", q, 1)
    require(k == q - 1, K9, "num_speculative_tokens", f"must be num_query_per_req - 1 = {q - 1}, got {k}")
    require_length(K9, "next_token_ids_ptr", a["next_token_ids_ptr"], b)
    for name in ("out_input_ids_ptr", "out_query_positions_ptr", "out_query_slot_mapping_ptr"):
        require_length(K9, name, a[name], b * q)
    require_length(K9, "out_token_indices_ptr", a["out_token_indices_ptr"], b * k)
    at_least(K9, "block_size", a["block_size"], 1)
    stride = a["block_table_stride"]
    at_least(K9, "block_table_stride", stride, 1)
    require_rows(K9, "block_table_ptr", a["block_table_ptr"], b, stride, stride)
    power_of_two(K9, "BLOCK_SIZE", a["BLOCK_SIZE"])
    # Positions are >= 0 (C25): every context position read, and last + 1 (the first query's).
    if qsl[b] > qsl[0]:
        reads = positions[min(qsl[0], n_ctx - 1) : min(qsl[b], n_ctx)]
        require(int(reads.min()) >= 0, K9, "target_positions_ptr", "must hold context positions >= 0 (C25)")
    for r in range(b):
        last = int(positions[qsl[r + 1] - rej[r] - 1])
        require(last >= -1, K9, "target_positions_ptr", f"gives request {r} a first query position {last + 1} < 0 (C25)")
        in_int64(K9, "target_positions_ptr", last + q, "a request's last query position")


def _grid(a: Mapping[str, Any]) -> tuple[int, int]:
    # Canonical (len(qsl) - 1, ceil(max_tokens_per_req / BLOCK_SIZE)) with max_tokens_per_req =
    # max_query_len + Q, a dispatcher value recomputed here from the arguments (§1.11).
    qsl = a["query_start_loc_ptr"].tolist()
    b = len(qsl) - 1
    longest = max((qsl[r + 1] - qsl[r] for r in range(b)), default=0)
    return (b, cdiv(longest + a["num_query_per_req"], a["BLOCK_SIZE"]))


def _explain(a: Mapping[str, Any], output: str, index: int) -> str:
    qsl = a["query_start_loc_ptr"].tolist()
    b = len(qsl) - 1
    q, k = a["num_query_per_req"], a["num_speculative_tokens"]
    if output.startswith("out_context"):
        r = next((r for r in range(b) if qsl[r] <= index < qsl[r + 1]), None)
        if r is None:
            return f"context slot {index} lies outside [{qsl[0]}, {qsl[b]}): it must stay untouched"
        src = min(index, a["total_input_tokens"] - 1)
        pos = item(a["target_positions_ptr"], src)
        where = f"context token {index - qsl[r]}: target_positions[{src}]={pos}"
    else:
        per = k if output == "out_token_indices_ptr" else q
        if per == 0 or index >= b * per:
            return f"element {index} lies past B*{per}={b * per}: it must stay untouched"
        r, j = divmod(index, per)
        kq = j + 1 if output == "out_token_indices_ptr" else j
        rej = _rejected(a, b)[r]
        last = item(a["target_positions_ptr"], qsl[r + 1] - rej - 1)
        pos = last + 1 + kq
        where = f"query {kq}: last context position target_positions[{qsl[r + 1] - rej - 1}]={last} (rejected {rej}), position {pos}"
    stride, bs = a["block_table_stride"], a["block_size"]
    col = min(pos // bs, stride - 1) if pos >= 0 else None
    table = "" if col is None else f", block column {col}: block_table[{r * stride + col}]={item(a['block_table_ptr'], r * stride + col)}"
    return f"request {r} (context {qsl[r]}..{qsl[r + 1]}, next_token={item(a['next_token_ids_ptr'], r)}); {where}; block_size={bs}{table}"


COPY_AND_EXPAND_DFLASH_INPUTS = KernelSpec(
    name=K9,
    family="dflash",
    qualname=f"vllm.v1.spec_decode.utils.{K9}",
    params=(
        ptr("next_token_ids_ptr", INT, I32, "[B] next token per request"),
        ptr("target_positions_ptr", INT, I64, "[N_ctx] context positions, rejected ones included"),
        ptr("out_input_ids_ptr", INT, I32, "[>= B*Q] query-token ids", role=Role.OUT),
        ptr("out_context_positions_ptr", INT, I64, "[>= N_ctx]", role=Role.OUT),
        ptr("out_query_positions_ptr", INT, I64, "[>= B*Q]", role=Role.OUT),
        ptr("out_context_slot_mapping_ptr", INT, I64, "[>= N_ctx]", role=Role.OUT),
        ptr("out_query_slot_mapping_ptr", INT, I64, "[>= B*Q]", role=Role.OUT),
        ptr("out_token_indices_ptr", INT, I32, "[B*K] sample indices of the mask tokens", role=Role.OUT),
        ptr("block_table_ptr", INT, I32, "[>= B, nb] block ids, rows of stride block_table_stride", contiguous=False, ndim=(2,)),
        scalar("block_table_stride", "row stride and column clamp bound"),
        ptr("query_start_loc_ptr", INT, I32, "[B+1] context ranges"),
        ptr("num_rejected_tokens_ptr", INT, I32, "[B] rejected context tokens, or the integer 0", optional=True, int_zero=True),
        scalar("parallel_drafting_token_id", "id of the mask (query) tokens after the first"),
        scalar("block_size", "drafter KV-cache block size"),
        scalar("num_query_per_req", "Q = 1 + K"),
        scalar("num_speculative_tokens", "K"),
        scalar("total_input_tokens", "N_ctx: context reads are clamped to N_ctx - 1"),
        constexpr("BLOCK_SIZE", "token tile, min(256, next_power_of_2(max_query_len + Q))"),
        constexpr("HAS_NUM_REJECTED", "a rejected-count tensor is given", default=False),
    ),
    grid=_grid,
    preconditions=_preconditions,
    flags=(Flag("HAS_NUM_REJECTED", "num_rejected_tokens_ptr", lambda x: isinstance(x, torch.Tensor), "num_rejected_tokens_ptr is a tensor"),),
    explain=_explain,
    rule=lambda a, output, index, kind: "C23 last context position" if output.startswith("out_query") else "C23 context",
    # _copy_and_expand_dflash_inputs passes block_table.stride(0) as the stride.
    call_site=lambda a: isinstance(a["block_table_ptr"], torch.Tensor) and a["block_table_stride"] == a["block_table_ptr"].stride(0),
)

SPECS = (COPY_AND_EXPAND_DFLASH_INPUTS,)
