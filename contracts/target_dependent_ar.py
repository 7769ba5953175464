"""Contract of Model Runner V2's EAGLE/MTP drafter kernels (docs/target_dependent_ar.md, C38,
vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py).

After the target model's step, the drafter runs a prefill over the target's batch (its query
shifted by one token, the rejected tokens left out) and then ``num_speculative_steps - 1`` decode
steps of one token per request, each feeding the token it drafted back in. vLLM's package names
the drafter kind ("target-dependent autoregressive": EAGLE, EAGLE-3, MTP); its
``_prepare_prefill_inputs_kernel`` shares a name with Model Runner V2's batch state's, so this
one is ``target_dependent_ar._prepare_prefill_inputs_kernel``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from contracts._checks import exclusive_offsets, item, require_cells, require_rows
from contracts.spec import (
    INT,
    KernelSpec,
    Role,
    constexpr,
    in_int32,
    power_of_two,
    ptr,
    require,
    require_length,
    scalar,
)

I32, I64 = torch.int32, torch.int64
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
MODULE = "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator"
K29 = "target_dependent_ar._prepare_prefill_inputs_kernel"
K30 = "_prepare_decode_inputs_kernel"
K31 = "_update_draft_inputs_kernel"


def _max_model_len(kernel: str, a: Mapping[str, Any]) -> None:
    m = a["max_model_len"]
    require(1 <= m < 2**31, kernel, "max_model_len", f"must be in [1, 2**31), got {m}")


# -- K29: the drafter's prefill over the target's batch --------------------------------------------
def _prefill_pre(a: Mapping[str, Any]) -> None:
    k = K29
    n = a["idx_mapping_ptr"].numel()
    qsl = exclusive_offsets(k, "query_start_loc_ptr", a["query_start_loc_ptr"], n + 1)
    power_of_two(k, "BLOCK_SIZE", a["BLOCK_SIZE"])
    for name in ("seq_lens_ptr", "num_sampled_ptr", "num_rejected_ptr"):
        require_length(k, name, a[name], n)
    idx = a["idx_mapping_ptr"].tolist()
    sampled, rejected = a["num_sampled_ptr"][:n].tolist(), a["num_rejected_ptr"][:n].tolist()
    for b, s in enumerate(idx):
        # The next token: the last sampled one, or (a chunked prefill) the next prompt token.
        source = "last_sampled_ptr" if sampled[b] > 0 else "next_prefill_tokens_ptr"
        size = a[source].numel()
        require(0 <= s < size, k, "idx_mapping_ptr", f"entry {b} = {s} must index '{source}' of {size} elements")
        ql = qsl[b + 1] - qsl[b]
        # At least one token is left after the rejected ones: the one the draft continues from (C38).
        require(0 <= rejected[b] < ql, k, "num_rejected_ptr", f"entry {b} = {rejected[b]} must be in [0, query_len={ql})")
        end = qsl[b] + ql - rejected[b]
        for name in ("target_input_ids_ptr", "target_positions_ptr", "draft_input_ids_ptr", "draft_positions_ptr"):
            require_length(k, name, a[name], end)
    if n:
        m = a["max_num_reqs"]
        require_length(k, "last_token_indices_ptr", a["last_token_indices_ptr"], max(n, m))
        require_length(k, "draft_seq_lens_ptr", a["draft_seq_lens_ptr"], max(n, m))
        require_length(k, "draft_query_start_loc_ptr", a["draft_query_start_loc_ptr"], max(n, m + 1))
        require_length(k, "draft_current_step_ptr", a["draft_current_step_ptr"], 1)


def _prefill_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    idx, qsl = a["idx_mapping_ptr"].tolist(), a["query_start_loc_ptr"].tolist()
    n = len(idx)
    if output in ("draft_input_ids_ptr", "draft_positions_ptr"):
        b = next((b for b in range(n) if qsl[b] <= index < qsl[b + 1]), None)
    else:
        b = index if index < n else None
    if b is None:
        return f"element {index} of {output} lies past the batch's rows or tokens (padded or untouched)"
    return (f"row {b} -> request state {idx[b]}: query [{qsl[b]}, {qsl[b + 1]}), num_rejected={item(a['num_rejected_ptr'], b)}, "
            f"num_sampled={item(a['num_sampled_ptr'], b)}")


PREPARE_PREFILL_INPUTS = KernelSpec(
    name=K29,
    family="target_dependent_ar",
    qualname=f"{MODULE}._prepare_prefill_inputs_kernel",
    params=(
        ptr("last_token_indices_ptr", INT, I64, "[max_num_reqs] each row's last kept token", role=Role.OUT),
        ptr("draft_current_step_ptr", INT, I64, "[] the draft step, reset to 0", role=Role.OUT, ndim=(0, 1)),
        ptr("draft_input_ids_ptr", INT, I32, "[>= num_tokens] the target's tokens shifted by one", role=Role.OUT),
        ptr("draft_positions_ptr", INT, I64, "[>= num_tokens]", role=Role.OUT),
        ptr("draft_query_start_loc_ptr", INT, I32, "[max_num_reqs + 1]", role=Role.OUT),
        ptr("draft_seq_lens_ptr", INT, I32, "[max_num_reqs]", role=Role.OUT),
        ptr("target_input_ids_ptr", INT, I32, "[num_tokens] the target step's input ids"),
        ptr("target_positions_ptr", INT, I64, "[num_tokens]"),
        ptr("idx_mapping_ptr", INT, I64, "[num_reqs] batch row -> request state"),
        ptr("last_sampled_ptr", INT, I64, "[max_num_reqs(, 1)] each request's last sampled token", ndim=(1, 2)),
        ptr("next_prefill_tokens_ptr", INT, I32, "[num_lookahead, max_num_reqs]: row 0 read", ndim=(1, 2)),
        ptr("num_sampled_ptr", INT, I32, "[num_reqs] tokens the step emitted (0: still prefilling)"),
        ptr("num_rejected_ptr", INT, I32, "[num_reqs] query tokens rejected"),
        ptr("query_start_loc_ptr", INT, I32, "[num_reqs + 1] the target's query offsets"),
        ptr("seq_lens_ptr", INT, I32, "[num_reqs] the target's sequence lengths"),
        scalar("max_num_reqs", "rows padded for CUDA graphs"),
        constexpr("BLOCK_SIZE", "token tile (1024 at the call site)"),
    ),
    grid=lambda a: (a["idx_mapping_ptr"].numel(),),
    preconditions=_prefill_pre,
    explain=_prefill_explain,
    rule=lambda a, output, index, kind: "C38 drafter prefill",
    call_site=lambda a: a["max_num_reqs"] + 1 == a["draft_query_start_loc_ptr"].numel(),
)


# -- K30: the first decode step's inputs ----------------------------------------------------------
def _decode_pre(a: Mapping[str, Any]) -> None:
    k = K30
    drafts, stride = a["draft_tokens_ptr"], a["draft_tokens_stride"]
    n = drafts.shape[0]
    power_of_two(k, "BLOCK_SIZE", a["BLOCK_SIZE"])
    require_rows(k, "draft_tokens_ptr", drafts, n, stride, 1)
    for name in ("target_seq_lens_ptr", "num_rejected_ptr", "input_ids_ptr", "sample_src_positions_ptr"):
        require_length(k, name, a[name], n)
    m = a["max_num_reqs"]
    require_length(k, "query_start_loc_ptr", a["query_start_loc_ptr"], m + 1)
    require_length(k, "seq_lens_ptr", a["seq_lens_ptr"], max(n, m))
    advance = a["ADVANCE_DRAFT_POSITIONS"]
    if advance:
        _max_model_len(k, a)
        require_length(k, "positions_ptr", a["positions_ptr"], n)
    sample, seq, rejected = (a[name][:n].tolist() for name in ("sample_src_positions_ptr", "target_seq_lens_ptr", "num_rejected_ptr"))
    for b in range(n):
        in_int32(k, "sample_src_positions_ptr", sample[b] + 1, f"row {b}'s next sampling position")
        in_int32(k, "num_rejected_ptr", seq[b] - rejected[b], f"row {b}'s seq_len")
        if advance:
            in_int32(k, "positions_ptr", int(a["positions_ptr"][b]) + 1, f"row {b}'s next position")
            in_int32(k, "target_seq_lens_ptr", seq[b] - rejected[b] + 1, f"row {b}'s next seq_len")


def _decode_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    n = a["draft_tokens_ptr"].shape[0]
    if index >= n:
        return f"element {index} lies past num_reqs={n}: padding for CUDA graphs (max_num_reqs={a['max_num_reqs']})"
    return (f"row {index}: first draft {item(a['draft_tokens_ptr'], index * a['draft_tokens_stride'])}, "
            f"target seq_len={item(a['target_seq_lens_ptr'], index)}, num_rejected={item(a['num_rejected_ptr'], index)}, "
            f"max_model_len={a['max_model_len']}")


PREPARE_DECODE_INPUTS = KernelSpec(
    name=K30,
    family="target_dependent_ar",
    qualname=f"{MODULE}.{K30}",
    params=(
        ptr("draft_tokens_ptr", INT, I64, "[num_reqs] each request's first draft (a column of the drafts)", contiguous=False),
        scalar("draft_tokens_stride", "the column's stride"),
        ptr("target_seq_lens_ptr", INT, I32, "[num_reqs] the target step's sequence lengths"),
        ptr("num_rejected_ptr", INT, I32, "[num_reqs]"),
        ptr("input_ids_ptr", INT, I32, "[>= num_reqs] the draft token to feed", role=Role.OUT),
        ptr("positions_ptr", INT, I64, "[>= num_reqs] advanced by one, clamped to max_model_len - 1", role=Role.INOUT),
        ptr("sample_src_positions_ptr", INT, I64, "[>= num_reqs] the sampling key, advanced by one", role=Role.INOUT),
        ptr("query_start_loc_ptr", INT, I32, "[max_num_reqs + 1] one token per request", role=Role.OUT),
        ptr("seq_lens_ptr", INT, I32, "[max_num_reqs]", role=Role.OUT),
        scalar("max_model_len", "positions and lengths are clamped to it"),
        scalar("max_num_reqs", "rows padded for CUDA graphs"),
        constexpr("BLOCK_SIZE", "tile (1024 at the call site)"),
        constexpr("ADVANCE_DRAFT_POSITIONS", "positions advance each step (not for Gemma4 MTP)"),
    ),
    # One program per request and one more for the CUDA-graph padding: num_reqs is num_programs - 1.
    grid=lambda a: (a["draft_tokens_ptr"].shape[0] + 1,),
    preconditions=_decode_pre,
    explain=_decode_explain,
    rule=lambda a, output, index, kind: "C38 drafter decode inputs",
    call_site=lambda a: a["draft_tokens_stride"] == a["draft_tokens_ptr"].stride(0),
)


# -- K31: after each draft step -------------------------------------------------------------------
def _update_pre(a: Mapping[str, Any]) -> None:
    k = K31
    n = a["draft_tokens_ptr"].numel()
    power_of_two(k, "BLOCK_SIZE", a["BLOCK_SIZE"])
    require_length(k, "current_draft_step_ptr", a["current_draft_step_ptr"], 1)
    step, steps = int(a["current_draft_step_ptr"].flatten()[0]), a["num_speculative_steps"]
    require(step >= 0, k, "current_draft_step_ptr", f"must be >= 0, got {step}")
    out, stride = a["output_draft_tokens_ptr"], a["output_draft_tokens_stride"]
    for b in range(n):
        require_cells(k, "output_draft_tokens_ptr", out, b * stride + step, 1, f"row {b}'s draft {step}")
    if step >= steps - 1:
        return  # the last step: only the drafts are written
    for name in ("sample_src_positions_ptr", "input_ids_ptr"):
        require_length(k, name, a[name], n)
    h = a["hidden_size"]
    require(h >= 0, k, "hidden_size", f"must be >= 0, got {h}")
    hidden, nxt = a["hidden_states_ptr"], a["next_input_hidden_states_ptr"]
    require(hidden.dtype == nxt.dtype, k, "next_input_hidden_states_ptr", f"must have hidden_states_ptr's dtype {hidden.dtype}, got {nxt.dtype}")
    require_rows(k, "hidden_states_ptr", hidden, n, a["hidden_states_stride"], h)
    require_rows(k, "next_input_hidden_states_ptr", nxt, n, a["next_input_hidden_states_stride"], h)
    sample = a["sample_src_positions_ptr"][:n].tolist()
    for b in range(n):
        in_int32(k, "sample_src_positions_ptr", sample[b] + 1, f"row {b}'s next sampling position")
    if a["ADVANCE_DRAFT_POSITIONS"]:
        _max_model_len(k, a)
        for name in ("positions_ptr", "seq_lens_ptr"):
            require_length(k, name, a[name], n)
            for b, v in enumerate(a[name][:n].tolist()):
                in_int32(k, name, v + 1, f"row {b}'s next value")


def _update_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    step = int(a["current_draft_step_ptr"].flatten()[0])
    return (f"draft step {step} of num_speculative_steps={a['num_speculative_steps']}"
            f"{' (the last: only drafts are written)' if step >= a['num_speculative_steps'] - 1 else ''}; "
            f"element {index} of {output}")


UPDATE_DRAFT_INPUTS = KernelSpec(
    name=K31,
    family="target_dependent_ar",
    qualname=f"{MODULE}.{K31}",
    params=(
        ptr("output_draft_tokens_ptr", INT, I64, "[max_num_reqs, K] each request's drafts; column step written", role=Role.INOUT,
            contiguous=False, ndim=(2,)),
        scalar("output_draft_tokens_stride", "row stride of output_draft_tokens"),
        ptr("next_input_hidden_states_ptr", (F32, BF16, F16), BF16, "[>= num_reqs, hidden] the next step's hidden input",
            role=Role.OUT, contiguous=False, ndim=(2,)),
        scalar("next_input_hidden_states_stride", "its row stride"),
        ptr("input_ids_ptr", INT, I32, "[>= num_reqs] the token drafted, fed next", role=Role.OUT),
        ptr("positions_ptr", INT, I64, "[>= num_reqs] advanced by one, clamped", role=Role.INOUT),
        ptr("sample_src_positions_ptr", INT, I64, "[>= num_reqs] the sampling key, advanced by one", role=Role.INOUT),
        ptr("seq_lens_ptr", INT, I32, "[>= num_reqs] advanced by one, clamped", role=Role.INOUT),
        ptr("draft_tokens_ptr", INT, I64, "[num_reqs] this step's drafted tokens"),
        ptr("current_draft_step_ptr", INT, I64, "[] the draft step", ndim=(0, 1)),
        ptr("hidden_states_ptr", (F32, BF16, F16), BF16, "[>= num_reqs, hidden] the draft model's output", contiguous=False, ndim=(2,)),
        scalar("hidden_states_stride", "its row stride"),
        scalar("hidden_size", "columns copied"),
        scalar("max_model_len", "positions and lengths are clamped to it"),
        scalar("num_speculative_steps", "K: from step K - 1 on only the drafts are written"),
        constexpr("BLOCK_SIZE", "column tile (1024 at the call site)"),
        constexpr("ADVANCE_DRAFT_POSITIONS", "positions advance each step (not for Gemma4 MTP)"),
    ),
    grid=lambda a: (a["draft_tokens_ptr"].numel(),),
    preconditions=_update_pre,
    explain=_update_explain,
    rule=lambda a, output, index, kind: "C38 draft step update",
    call_site=lambda a: (a["output_draft_tokens_stride"] == a["output_draft_tokens_ptr"].stride(0)
                         and a["hidden_states_stride"] == a["hidden_states_ptr"].stride(0)
                         and a["hidden_size"] == a["hidden_states_ptr"].shape[1]),
)

SPECS = (PREPARE_PREFILL_INPUTS, PREPARE_DECODE_INPUTS, UPDATE_DRAFT_INPUTS)
