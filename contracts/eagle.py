"""Contracts of the EAGLE input-preparation kernels (docs/spec.md §2.5–§2.8, vllm/v1/spec_decode/utils.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from contracts._checks import exclusive_offsets, item, require_rows
from contracts.spec import (
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

BOOL = torch.bool
I32, I64 = torch.int32, torch.int64
_MODULE = "vllm.v1.spec_decode.utils"

K5 = "eagle_step_slot_mapping_metadata_kernel"
K6 = "eagle_prepare_inputs_padded_kernel"
K7 = "eagle_prepare_next_token_padded_kernel"
K8 = "copy_and_expand_eagle_inputs_kernel"


# -- K5 ------------------------------------------------------------------------------------------
def _step_preconditions(a: Mapping[str, Any]) -> None:
    b = a["batch_size"]
    slots = a["out_slot_mapping_ptr"].numel()
    require(0 <= b <= slots, K5, "batch_size", f"must be in [0, len(out_slot_mapping_ptr) = {slots}], got {b}")
    for name in ("positions_ptr", "seq_lens_ptr", "out_clamped_positions_ptr"):
        require_length(K5, name, a[name], b)
    for name in ("block_size", "max_model_len", "n_blocks_per_req"):
        at_least(K5, name, a[name], 1)
    require_rows(K5, "block_table_ptr", a["block_table_ptr"], b, a["block_table_stride"], a["n_blocks_per_req"])
    if b:
        low = int(a["positions_ptr"][:b].min())
        require(low >= -1, K5, "positions_ptr", f"must hold positions >= -1 (C25), got {low}")
    require_fits(K5, "PAD_ID", a["PAD_ID"], "out_slot_mapping_ptr", a["out_slot_mapping_ptr"])


def _explain_step(a: Mapping[str, Any], output: str, index: int) -> str:
    b = a["batch_size"]
    if index >= b:
        return f"row {index} is cudagraph padding (batch_size={b}): only out_slot_mapping gets PAD_ID={a['PAD_ID']}"
    p = item(a["positions_ptr"], index)
    bs, mml, nb = a["block_size"], a["max_model_len"], a["n_blocks_per_req"]
    over = p + 1 >= mml
    cp = 0 if over else p + 1
    col = min(cp // bs, nb - 1)
    flat = index * a["block_table_stride"] + col
    return (
        f"request {index}: position={p} -> new position {cp} ({'>= max_model_len=' + str(mml) if over else 'in range'}), "
        f"block column {col} (n_blocks_per_req={nb}), block_table[{flat}]={item(a['block_table_ptr'], flat)}, "
        f"block_size={bs}, seq_len={item(a['seq_lens_ptr'], index)}"
    )


# -- K6 ------------------------------------------------------------------------------------------
def _inputs_padded_preconditions(a: Mapping[str, Any]) -> None:
    # The kernel clamps nothing and indexes nothing by value: only lengths matter (§2.6).
    n = a["num_reqs"]
    at_least(K6, "num_reqs", n, 0)
    for name in ("cu_num_draft_tokens_ptr", "valid_sampled_tokens_count_ptr", "token_indices_to_sample_ptr", "num_rejected_tokens_gpu_ptr"):
        require_length(K6, name, a[name], n)
    require_length(K6, "query_start_loc_gpu_ptr", a["query_start_loc_gpu_ptr"], n + 1)


def _explain_inputs_padded(a: Mapping[str, Any], output: str, index: int) -> str:
    r = index
    if r >= a["num_reqs"]:
        return f"element {r} lies past num_reqs={a['num_reqs']}: it must stay untouched"
    cu = a["cu_num_draft_tokens_ptr"]
    nd = item(cu, 0) if r == 0 else item(cu, r) - item(cu, r - 1)
    return (
        f"request {r}: drafts nd={nd} (cu[{r}]={item(cu, r)}), valid_sampled_tokens_count={item(a['valid_sampled_tokens_count_ptr'], r)}, "
        f"query_start_loc[{r + 1}]={item(a['query_start_loc_gpu_ptr'], r + 1)}"
    )


# -- K7 ------------------------------------------------------------------------------------------
def _next_token_preconditions(a: Mapping[str, Any]) -> None:
    n, w = a["num_reqs"], a["num_sampled_tokens_per_req"]
    at_least(K7, "num_reqs", n, 0)
    at_least(K7, "num_sampled_tokens_per_req", w, 0)
    bst = a["BLOCK_SIZE_TOKENS"]
    power_of_two(K7, "BLOCK_SIZE_TOKENS", bst)
    require(bst >= w, K7, "BLOCK_SIZE_TOKENS", f"must be >= num_sampled_tokens_per_req ({w}), got {bst}")
    require_rows(K7, "sampled_token_ids_ptr", a["sampled_token_ids_ptr"], n, a["stride_sampled_token_ids"], w)
    for name in ("discard_request_mask_ptr", "backup_next_token_ids_ptr", "next_token_ids_ptr", "valid_sampled_tokens_count_ptr"):
        require_length(K7, name, a[name], n)


def _explain_next_token(a: Mapping[str, Any], output: str, index: int) -> str:
    r = index
    if r >= a["num_reqs"]:
        return f"element {r} lies past num_reqs={a['num_reqs']}: it must stay untouched"
    w, stride = a["num_sampled_tokens_per_req"], a["stride_sampled_token_ids"]
    row = [item(a["sampled_token_ids_ptr"], r * stride + j) for j in range(w)]
    return (
        f"request {r}: discard={bool(a['discard_request_mask_ptr'][r])}, sampled row {row} (valid: != -1 and "
        f"< vocab_size={a['vocab_size']}), backup={item(a['backup_next_token_ids_ptr'], r)}"
    )


# -- K8 ------------------------------------------------------------------------------------------
def _expand_shape(a: Mapping[str, Any]) -> tuple[int, int, int, list[int], list[int]]:
    """(B, P, net_new, qsl[0..B], query_end_loc) of a K8 launch, unchecked."""
    qend = a["query_end_loc_ptr"].tolist()
    b = len(qend)
    p = a["num_padding_slots_per_request"]
    net_new = p - (1 if a["shift_input_ids"] else 0)
    return b, p, net_new, a["query_start_loc_ptr"][: b + 1].tolist(), qend


def _copy_expand_preconditions(a: Mapping[str, Any]) -> None:
    qend = a["query_end_loc_ptr"].tolist()
    b = len(qend)
    qsl = exclusive_offsets(K8, "query_start_loc_ptr", a["query_start_loc_ptr"], b + 1)
    for r in range(b):
        ok = qsl[r] <= qend[r] <= qsl[r + 1] - 1
        require(ok, K8, "query_end_loc_ptr", f"entry {r} ({qend[r]}) must lie in request {r}'s tokens [{qsl[r]}, {qsl[r + 1]})")
    n_in = a["total_input_tokens"]
    require(qsl[b] <= n_in, K8, "total_input_tokens", f"must be >= query_start_loc[{b}] = {qsl[b]}, got {n_in}")
    require_length(K8, "target_token_ids_ptr", a["target_token_ids_ptr"], n_in)
    require_length(K8, "target_positions_ptr", a["target_positions_ptr"], n_in)
    require_length(K8, "next_token_ids_ptr", a["next_token_ids_ptr"], b)
    p = a["num_padding_slots_per_request"]
    at_least(K8, "num_padding_slots_per_request", p, 1)
    n_out = qsl[b] + b * (p - (1 if a["shift_input_ids"] else 0))
    for name in ("out_input_ids_ptr", "out_positions_ptr", "out_is_rejected_token_mask_ptr", "out_is_masked_token_mask_ptr"):
        require_length(K8, name, a[name], n_out)
    require_length(K8, "out_new_token_indices_ptr", a["out_new_token_indices_ptr"], b * p)
    if a["shift_input_ids"]:
        require_length(K8, "out_hidden_state_mapping_ptr", a["out_hidden_state_mapping_ptr"], qsl[b])
    power_of_two(K8, "BLOCK_SIZE_TOKENS", a["BLOCK_SIZE_TOKENS"])


def _copy_expand_grid(a: Mapping[str, Any]) -> tuple[int, int]:
    # Canonical (batch_size, num_blocks): num_blocks is a dispatcher value, ceil((max_query_len
    # + net_new) / BLOCK_SIZE_TOKENS), recomputed here from the arguments (§1.11).
    b, _, net_new, qsl, _ = _expand_shape(a)
    longest = max((qsl[r + 1] - qsl[r] for r in range(b)), default=0)
    return (b, cdiv(longest + net_new, a["BLOCK_SIZE_TOKENS"]))


def _explain_copy_expand(a: Mapping[str, Any], output: str, index: int) -> str:
    b, p, net_new, qsl, qend = _expand_shape(a)
    shift = bool(a["shift_input_ids"])
    if output == "out_new_token_indices_ptr":
        if index >= b * p:
            return f"element {index} lies past B*P={b * p}: it must stay untouched"
        r, k = divmod(index, p)
        where = f"new-token slot {k} ({'bonus' if k == 0 else 'parallel'})"
    elif output == "out_hidden_state_mapping_ptr":
        r = next((r for r in range(b) if qsl[r] <= index < qsl[r + 1]), None)
        if r is None or not shift:
            return f"input token {index}: outside every request or not shifting: it must stay untouched"
        where = f"input token {index - qsl[r]} of the request"
    else:
        starts = [qsl[r] + r * net_new for r in range(b + 1)]
        r = next((r for r in range(b) if starts[r] <= index < starts[r + 1]), None)
        if r is None:
            return f"output slot {index} lies outside [{starts[0]}, {starts[b]}): it must stay untouched"
        j = index - starts[r]
        nv = qend[r] - qsl[r] + (0 if shift else 1)
        region = "valid" if j < nv else "bonus" if j == nv else "parallel" if j < nv + p else "rejected"
        where = f"output slot j={j}, region {region} (valid tokens nv={nv})"
    return (
        f"request {r}: query_start_loc={qsl[r]}..{qsl[r + 1]}, query_end_loc={qend[r]}, shift={shift}, P={p}, "
        f"next_token={item(a['next_token_ids_ptr'], r)}, first position={item(a['target_positions_ptr'], qsl[r])}; {where}"
    )


# -- the contracts ---------------------------------------------------------------------------------
_TABLE = dict(contiguous=False, ndim=(2,))

EAGLE_STEP_SLOT_MAPPING_METADATA = KernelSpec(
    name=K5,
    family="eagle",
    qualname=f"{_MODULE}.{K5}",
    params=(
        ptr("positions_ptr", INT, I64, "[batch_size] current position per request; may alias out_clamped_positions_ptr",
            may_alias="out_clamped_positions_ptr"),
        ptr("block_table_ptr", INT, I32, "[batch_size, n_blocks] block ids, rows of stride block_table_stride", **_TABLE),
        scalar("block_table_stride", "row stride of the block table"),
        ptr("seq_lens_ptr", INT, I32, "[batch_size] sequence lengths, updated in place", role=Role.INOUT),
        ptr("out_clamped_positions_ptr", INT, I64, "[batch_size] new positions", role=Role.OUT),
        ptr("out_slot_mapping_ptr", INT, I64, "[input_batch_size] KV slot per (padded) row", role=Role.OUT),
        constexpr("block_size", "drafter KV-cache block size"),
        constexpr("max_model_len", "a new position >= this neutralises the request"),
        constexpr("n_blocks_per_req", "block_table.shape[1]: the column clamp bound"),
        constexpr("PAD_ID", "slot of padding rows and neutralised requests (-1)"),
        scalar("batch_size", "real rows; rows past it are cudagraph padding"),
    ),
    # input_batch_size is a dispatcher value; the call site passes a slot slice of that length.
    grid=lambda a: (a["out_slot_mapping_ptr"].numel(),),
    preconditions=_step_preconditions,
    explain=_explain_step,
    rule=lambda a, output, index, kind: "C21 padding row" if index >= a["batch_size"] else "C21 draft step",
    # eagle_step_update_slot_mapping_and_metadata passes positions of exactly batch_size entries and
    # the table's own row stride and width.
    call_site=lambda a: (
        isinstance(a["positions_ptr"], torch.Tensor) and a["positions_ptr"].numel() == a["batch_size"]
        and isinstance(a["block_table_ptr"], torch.Tensor) and a["block_table_ptr"].dim() == 2
        and a["block_table_stride"] == a["block_table_ptr"].stride(0) and a["n_blocks_per_req"] == a["block_table_ptr"].shape[1]
    ),
)

EAGLE_PREPARE_INPUTS_PADDED = KernelSpec(
    name=K6,
    family="eagle",
    qualname=f"{_MODULE}.{K6}",
    params=(
        ptr("cu_num_draft_tokens_ptr", INT, I32, "[>= num_reqs] inclusive cumulative draft counts"),
        ptr("valid_sampled_tokens_count_ptr", INT, I32, "[>= num_reqs] accepted + 1, 0 for discarded"),
        ptr("query_start_loc_gpu_ptr", INT, I32, "[>= num_reqs + 1] exclusive token offsets"),
        ptr("token_indices_to_sample_ptr", INT, I32, "[num_reqs] last valid token per request", role=Role.OUT),
        ptr("num_rejected_tokens_gpu_ptr", INT, I32, "[num_reqs] rejected trailing tokens", role=Role.OUT),
        scalar("num_reqs"),
    ),
    grid=lambda a: (a["num_reqs"],),
    preconditions=_inputs_padded_preconditions,
    explain=_explain_inputs_padded,
)

EAGLE_PREPARE_NEXT_TOKEN_PADDED = KernelSpec(
    name=K7,
    family="eagle",
    qualname=f"{_MODULE}.{K7}",
    params=(
        ptr("sampled_token_ids_ptr", INT, I32, "[num_reqs, W] sampled tokens (-1 = rejected), row stride given", **_TABLE),
        ptr("discard_request_mask_ptr", (BOOL,), BOOL, "[>= num_reqs] ignore this request's samples"),
        ptr("backup_next_token_ids_ptr", INT, I32, "[>= num_reqs] fallback next token"),
        ptr("next_token_ids_ptr", INT, I32, "[num_reqs] next token per request", role=Role.OUT),
        ptr("valid_sampled_tokens_count_ptr", INT, I32, "[num_reqs] valid sampled tokens", role=Role.OUT),
        scalar("vocab_size"),
        scalar("num_sampled_tokens_per_req", "W = sampled.shape[1]"),
        scalar("num_reqs"),
        scalar("stride_sampled_token_ids", "row stride of sampled_token_ids"),
        constexpr("BLOCK_SIZE_TOKENS", "next_power_of_2(W): the token tile"),
    ),
    grid=lambda a: (a["num_reqs"],),
    preconditions=_next_token_preconditions,
    explain=_explain_next_token,
)

_OUT = dict(role=Role.OUT)

COPY_AND_EXPAND_EAGLE_INPUTS = KernelSpec(
    name=K8,
    family="eagle",
    qualname=f"{_MODULE}.{K8}",
    params=(
        ptr("target_token_ids_ptr", INT, I32, "[N_in] target input ids, rejected ones included"),
        ptr("target_positions_ptr", INT, I64, "[N_in] target positions (1-D)"),
        ptr("next_token_ids_ptr", INT, I32, "[B] bonus / next token per request"),
        ptr("out_input_ids_ptr", INT, I32, "[>= N_out] drafter input ids", **_OUT),
        ptr("out_positions_ptr", INT, I64, "[>= N_out] drafter positions", **_OUT),
        ptr("out_is_rejected_token_mask_ptr", (BOOL,), BOOL, "[>= N_out]", **_OUT),
        ptr("out_is_masked_token_mask_ptr", (BOOL,), BOOL, "[>= N_out] parallel-drafting slots", **_OUT),
        ptr("out_new_token_indices_ptr", INT, I32, "[B*P] where the drafter samples", **_OUT),
        ptr("out_hidden_state_mapping_ptr", INT, I32, "[N_in] input token -> output slot, when shifting", **_OUT),
        ptr("query_start_loc_ptr", INT, I32, "[B+1] exclusive token offsets"),
        ptr("query_end_loc_ptr", INT, I32, "[B] last accepted input token per request"),
        scalar("padding_token_id", "id of rejected slots (0)"),
        scalar("parallel_drafting_token_id", "id of parallel-drafting slots"),
        scalar("total_input_tokens", "N_in"),
        scalar("num_padding_slots_per_request", "P"),
        scalar("shift_input_ids", "EAGLE-style: ids shift left by one"),
        constexpr("BLOCK_SIZE_TOKENS", "token tile, min(256, next_power_of_2(max_query_len + net_new))"),
    ),
    grid=_copy_expand_grid,
    preconditions=_copy_expand_preconditions,
    explain=_explain_copy_expand,
)

SPECS = (
    EAGLE_STEP_SLOT_MAPPING_METADATA,
    EAGLE_PREPARE_INPUTS_PADDED,
    EAGLE_PREPARE_NEXT_TOKEN_PADDED,
    COPY_AND_EXPAND_EAGLE_INPUTS,
)
