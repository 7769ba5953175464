"""Contract of Model Runner V2's batch-state kernels (docs/input_batch.md, C37,
vllm/v1/worker/gpu/input_batch.py).

Each step, MRV2 lays the scheduled requests out as a batch: row ``b`` of the batch is the
persistent request state ``s = idx_mapping[b]`` (a row of every ``[max_num_reqs, ...]`` state
tensor), and its query tokens are ``[query_start_loc[b], query_start_loc[b + 1])``. These kernels
copy prefill tokens in, lay out positions and sequence lengths, write the last sampled token and
the drafts into ``input_ids``, count what the rejection sampler kept, and commit it to the state.

vLLM has a second ``_prepare_prefill_inputs_kernel`` (the EAGLE/MTP drafter's), so this family's
is named by its module, ``input_batch._prepare_prefill_inputs_kernel``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from contracts._checks import exclusive_offsets, flat_view, item, require_cells, require_rows
from contracts.spec import (
    INT,
    Earlier,
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
MODULE = "vllm.v1.worker.gpu.input_batch"
K22 = "input_batch._prepare_prefill_inputs_kernel"
K23 = "_prepare_pos_seq_lens_kernel"
K24 = "_combine_sampled_and_draft_tokens_kernel"
K25 = "_get_num_sampled_and_rejected_kernel"
K26 = "_post_update_kernel"
K27 = "_post_update_num_computed_tokens_kernel"
K28 = "_expand_idx_mapping_kernel"


# -- shared checks ------------------------------------------------------------------------------
def state_rows(kernel: str, a: Mapping[str, Any], states: tuple[str, ...], *, distinct: bool = False,
               skip_negative: bool = False) -> list[int]:
    """``idx_mapping``'s entries, each a row of every state tensor in ``states`` (C37). ``distinct``:
    no two batch rows share a state (their writes would race); ``skip_negative``: a negative entry
    marks a row the kernel skips."""
    idx = a["idx_mapping_ptr"].tolist()
    for name in states:
        size = a[name].numel()
        for b, s in enumerate(idx):
            if s < 0 and skip_negative:
                continue
            require(0 <= s < size, kernel, "idx_mapping_ptr",
                    f"entry {b} = {s} must index '{name}' of {size} elements"
                    + (" (or be negative: a skipped row)" if skip_negative else ""))
    if distinct:
        seen: dict[int, int] = {}
        for b, s in enumerate(idx):
            if s >= 0:
                require(s not in seen, kernel, "idx_mapping_ptr",
                        f"entries {seen.get(s)} and {b} are both {s}: a request state appears once in a batch (C37)")
                seen[s] = b
    return idx


# -- K22: prefill tokens into input_ids -----------------------------------------------------------
def _prefill_pre(a: Mapping[str, Any]) -> None:
    k = K22
    n = a["idx_mapping_ptr"].numel()
    qsl = exclusive_offsets(k, "query_start_loc_ptr", a["query_start_loc_ptr"], n + 1)
    idx = state_rows(k, a, ("prefill_lens_ptr", "num_computed_tokens_ptr"), distinct=True)
    power_of_two(k, "BLOCK_SIZE", a["BLOCK_SIZE"])
    power_of_two(k, "LOOKAHEAD_BLOCK", a["LOOKAHEAD_BLOCK"])
    nl = a["num_lookahead"]
    require(0 <= nl <= a["LOOKAHEAD_BLOCK"], k, "num_lookahead", f"must be in [0, LOOKAHEAD_BLOCK={a['LOOKAHEAD_BLOCK']}], got {nl}")
    prefill, computed = a["prefill_lens_ptr"], a["num_computed_tokens_ptr"]
    tokens, t_stride = a["all_token_ids_ptr"], a["all_token_ids_stride"]
    nxt, n_stride = a["next_prefill_tokens_ptr"], a["next_prefill_tokens_stride"]
    widest = -1  # the highest request state that prefills
    for b, s in enumerate(idx):
        p, c = int(prefill[s]), int(computed[s])
        if c >= p:
            continue  # not prefilling: nothing read or written past its state
        ql = qsl[b + 1] - qsl[b]
        require(c >= 0, k, "num_computed_tokens_ptr", f"entry {s} = {c} (row {b}, prefilling) must be >= 0")
        # Reads: the query's tokens, then the lookahead tokens that lie below prefill_len.
        last = max(c + ql, min(p, c + ql + nl))
        require_cells(k, "all_token_ids_ptr", tokens, s * t_stride + c, last - c, f"request state {s}'s tokens [{c}, {last})")
        require_length(k, "input_ids_ptr", a["input_ids_ptr"], qsl[b + 1])
        widest = max(widest, s)
    # Lookahead j of state s is written at j * stride + s: num_lookahead rows reaching column `widest`.
    require_rows(k, "next_prefill_tokens_ptr", nxt, nl, n_stride, widest + 1)


def _prefill_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    idx, qsl = a["idx_mapping_ptr"].tolist(), a["query_start_loc_ptr"].tolist()
    if output == "input_ids_ptr":
        b = next((b for b in range(len(idx)) if qsl[b] <= index < qsl[b + 1]), None)
        if b is None:
            return f"token {index} lies in no request's query: it must stay untouched"
        where = f"query token {index - qsl[b]}"
    else:
        j, s = divmod(index, a["next_prefill_tokens_stride"])
        b = idx.index(s) if s in idx else None
        if b is None:
            return f"request state {s} is not in the batch: lookahead {j} must stay untouched"
        where = f"lookahead {j}"
    s = idx[b]
    return (f"row {b} -> request state {s}: prefill_len={item(a['prefill_lens_ptr'], s)}, "
            f"num_computed={item(a['num_computed_tokens_ptr'], s)}, query [{qsl[b]}, {qsl[b + 1]}); {where}")


# Earlier releases' parameter lists (KernelSpec.earlier), from their source distributions: reported
# as declared drift, never launched with the contract's names.
_EARLIER_K22 = (Earlier("0.21.0", ("input_ids_ptr", "next_prefill_tokens_ptr", "idx_mapping_ptr", "query_start_loc_ptr",
                                   "all_token_ids_ptr", "all_token_ids_stride", "prefill_lens_ptr", "num_computed_tokens_ptr",
                                   "BLOCK_SIZE"),
                        "one next prefill token per request: the lookahead rows (next_prefill_tokens_stride, num_lookahead, "
                        "LOOKAHEAD_BLOCK) came by 0.30.0"),)
_EARLIER_K24 = (Earlier("0.21.0", ("input_ids_ptr", "idx_mapping_ptr", "last_sampled_tokens_ptr", "query_start_loc_ptr",
                                   "seq_lens_ptr", "prefill_len_ptr", "draft_tokens_ptr", "draft_tokens_stride", "cu_num_logits_ptr",
                                   "logits_indices_ptr", "BLOCK_SIZE"),
                        "one new sampled token per step: NUM_NEW_SAMPLED_TOKENS and its prompt-tail rule came by 0.30.0"),)
_EARLIER_K26 = (Earlier("0.32.0", ("idx_mapping_ptr", "num_computed_tokens_ptr", "last_sampled_tokens_ptr", "output_bin_counts_ptr",
                                   "output_bin_counts_stride", "sampled_tokens_ptr", "sampled_tokens_stride", "num_sampled_ptr",
                                   "num_rejected_ptr", "query_start_loc_ptr", "all_token_ids_ptr", "all_token_ids_stride",
                                   "total_len_ptr"),
                        "no copy of the drafts (draft_tokens_ptr, draft_tokens_out_ptr, num_draft_tokens came in 0.33.0); "
                        "through 0.21.0 also no skipped rows and a required query_start_loc"),)


PREPARE_PREFILL_INPUTS = KernelSpec(
    name=K22,
    earlier=_EARLIER_K22,
    family="input_batch",
    qualname=f"{MODULE}._prepare_prefill_inputs_kernel",
    params=(
        ptr("input_ids_ptr", INT, I32, "[>= num_tokens] the step's token ids; prefill rows' query written", role=Role.OUT),
        ptr("next_prefill_tokens_ptr", INT, I32, "[num_lookahead, max_num_reqs] the tokens after each prefill query",
            role=Role.OUT, contiguous=False, ndim=(2,)),
        scalar("next_prefill_tokens_stride", "row stride of next_prefill_tokens"),
        scalar("num_lookahead", "lookahead tokens per prefilling request"),
        ptr("idx_mapping_ptr", INT, I64, "[num_reqs] batch row -> request state"),
        ptr("query_start_loc_ptr", INT, I32, "[>= num_reqs + 1] query offsets"),
        ptr("all_token_ids_ptr", INT, I32, "[max_num_reqs, max_model_len] every request's tokens", contiguous=False, ndim=(2,)),
        scalar("all_token_ids_stride", "row stride of all_token_ids"),
        ptr("prefill_lens_ptr", INT, I32, "[max_num_reqs] tokens the request prefills"),
        ptr("num_computed_tokens_ptr", INT, I32, "[max_num_reqs] tokens already in the KV cache"),
        constexpr("BLOCK_SIZE", "query tile (1024 at the call site)"),
        constexpr("LOOKAHEAD_BLOCK", "next_power_of_2(num_lookahead)"),
    ),
    grid=lambda a: (a["idx_mapping_ptr"].numel(),),
    preconditions=_prefill_pre,
    explain=_prefill_explain,
    rule=lambda a, output, index, kind: "C37 prefill copy" if output == "input_ids_ptr" else "C37 prefill lookahead",
    call_site=lambda a: (a["next_prefill_tokens_stride"] == a["next_prefill_tokens_ptr"].stride(0)
                         and a["all_token_ids_stride"] == a["all_token_ids_ptr"].stride(0)
                         and a["num_lookahead"] == a["next_prefill_tokens_ptr"].shape[0]),
)


# -- K23: positions and sequence lengths ----------------------------------------------------------
def _pos_pre(a: Mapping[str, Any]) -> None:
    k = K23
    n = a["idx_mapping_ptr"].numel()
    qsl = exclusive_offsets(k, "query_start_loc_ptr", a["query_start_loc_ptr"], n + 1)
    idx = state_rows(k, a, ("num_computed_tokens_ptr",))
    power_of_two(k, "BLOCK_SIZE", a["BLOCK_SIZE"])
    require_length(k, "pos_ptr", a["pos_ptr"], qsl[n])
    computed = a["num_computed_tokens_ptr"]
    for b, s in enumerate(idx):
        c = int(computed[s])
        in_int32(k, "num_computed_tokens_ptr", c, f"row {b}'s first position")
        in_int32(k, "num_computed_tokens_ptr", c + qsl[b + 1] - qsl[b], f"row {b}'s seq_len")
    # Rows [num_reqs, max_num_reqs) are zeroed for full CUDA graphs.
    require_length(k, "seq_lens_ptr", a["seq_lens_ptr"], max(n, a["max_num_reqs"]))


def _pos_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    idx, qsl = a["idx_mapping_ptr"].tolist(), a["query_start_loc_ptr"].tolist()
    n = len(idx)
    if output == "seq_lens_ptr":
        if index >= n:
            return f"seq_lens[{index}] is a padded row (num_reqs={n}, max_num_reqs={a['max_num_reqs']}): 0 below max_num_reqs"
        b, where = index, "seq_len = num_computed + query_len"
    else:
        b = next((b for b in range(n) if qsl[b] <= index < qsl[b + 1]), None)
        if b is None:
            return f"token {index} lies in no request's query: it must stay untouched"
        where = f"query token {index - qsl[b]}: position = num_computed + {index - qsl[b]}"
    s = idx[b]
    return f"row {b} -> request state {s}: num_computed={item(a['num_computed_tokens_ptr'], s)}, query [{qsl[b]}, {qsl[b + 1]}); {where}"


PREPARE_POS_SEQ_LENS = KernelSpec(
    name=K23,
    family="input_batch",
    qualname=f"{MODULE}.{K23}",
    params=(
        ptr("pos_ptr", INT, I64, "[>= num_tokens] positions", role=Role.OUT),
        ptr("seq_lens_ptr", INT, I32, "[max_num_reqs] sequence lengths; rows past num_reqs zeroed", role=Role.OUT),
        ptr("idx_mapping_ptr", INT, I64, "[num_reqs] batch row -> request state"),
        ptr("query_start_loc_ptr", INT, I32, "[>= num_reqs + 1] query offsets"),
        ptr("num_computed_tokens_ptr", INT, I32, "[max_num_reqs]"),
        scalar("max_num_reqs", "seq_lens rows, zeroed past num_reqs"),
        constexpr("BLOCK_SIZE", "tile (1024 at the call site)"),
    ),
    # One program per request and one more that pads seq_lens: num_reqs is num_programs - 1.
    grid=lambda a: (a["idx_mapping_ptr"].numel() + 1,),
    preconditions=_pos_pre,
    explain=_pos_explain,
    rule=lambda a, output, index, kind: ("C37 padded rows" if output == "seq_lens_ptr" and index >= a["idx_mapping_ptr"].numel()
                                         else "C37 positions"),
    call_site=lambda a: a["max_num_reqs"] == a["seq_lens_ptr"].numel(),
)


# -- K24: the last sampled token and the drafts into input_ids -------------------------------------
def _combine_pre(a: Mapping[str, Any]) -> None:
    k = K24
    n = a["idx_mapping_ptr"].numel()
    qsl = exclusive_offsets(k, "query_start_loc_ptr", a["query_start_loc_ptr"], n + 1)
    cu = exclusive_offsets(k, "cu_num_logits_ptr", a["cu_num_logits_ptr"], n + 1)
    idx = state_rows(k, a, ("prefill_len_ptr",))
    new = a["NUM_NEW_SAMPLED_TOKENS"]
    require(new in (0, 1), k, "NUM_NEW_SAMPLED_TOKENS", f"must be 0 or 1, got {new}")
    power_of_two(k, "BLOCK_SIZE", a["BLOCK_SIZE"])
    require_length(k, "seq_lens_ptr", a["seq_lens_ptr"], n)
    require_length(k, "logits_indices_ptr", a["logits_indices_ptr"], cu[n])
    require_length(k, "input_ids_ptr", a["input_ids_ptr"], qsl[n])
    seq, prefill = a["seq_lens_ptr"], a["prefill_len_ptr"]
    last, drafts, stride = a["last_sampled_tokens_ptr"], a["draft_tokens_ptr"], a["draft_tokens_stride"]
    for b, s in enumerate(idx):
        nl, ql = cu[b + 1] - cu[b], qsl[b + 1] - qsl[b]
        # The logits rows are the query's last nl tokens, in one tile (C37).
        require(new <= nl <= ql, k, "cu_num_logits_ptr",
                f"gives row {b} {nl} logits: must be in [NUM_NEW_SAMPLED_TOKENS={new}, its {ql} query tokens]")
        require(nl <= a["BLOCK_SIZE"], k, "cu_num_logits_ptr", f"gives row {b} {nl} logits, more than BLOCK_SIZE={a['BLOCK_SIZE']}")
        sl, p = int(seq[b]), int(prefill[s])
        if sl <= p:
            continue  # prefill: only the logits indices
        if new and sl - nl >= p:
            require(s < last.numel(), k, "last_sampled_tokens_ptr", f"must hold request state {s}'s entry, has {last.numel()}")
        require_cells(k, "draft_tokens_ptr", drafts, s * stride, nl - new, f"request state {s}'s {nl - new} drafts")


def _combine_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    idx, qsl, cu = (a[n].tolist() for n in ("idx_mapping_ptr", "query_start_loc_ptr", "cu_num_logits_ptr"))
    rows = range(len(idx))
    if output == "logits_indices_ptr":
        b = next((b for b in rows if cu[b] <= index < cu[b + 1]), None)
        where = f"logit {index - cu[b]}" if b is not None else ""
    else:
        b = next((b for b in rows if qsl[b] <= index < qsl[b + 1]), None)
        where = f"query token {index - qsl[b]}" if b is not None else ""
    if b is None:
        return f"element {index} belongs to no row: it must stay untouched"
    s = idx[b]
    return (f"row {b} -> request state {s}: query [{qsl[b]}, {qsl[b + 1]}), {cu[b + 1] - cu[b]} logits, "
            f"seq_len={item(a['seq_lens_ptr'], b)}, prefill_len={item(a['prefill_len_ptr'], s)}; {where}")


def _combine_rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    return "C37 logits indices" if output == "logits_indices_ptr" else "C37 sampled and draft tokens"


COMBINE_SAMPLED_AND_DRAFT_TOKENS = KernelSpec(
    name=K24,
    earlier=_EARLIER_K24,
    family="input_batch",
    qualname=f"{MODULE}.{K24}",
    params=(
        ptr("input_ids_ptr", INT, I32, "[>= num_tokens] token ids; generated rows rewritten", role=Role.INOUT),
        ptr("idx_mapping_ptr", INT, I64, "[num_reqs] batch row -> request state"),
        ptr("last_sampled_tokens_ptr", INT, I64, "[max_num_reqs(, 1)] each request's last sampled token", ndim=(1, 2)),
        ptr("query_start_loc_ptr", INT, I32, "[>= num_reqs + 1] query offsets"),
        ptr("seq_lens_ptr", INT, I32, "[>= num_reqs] this step's sequence lengths"),
        ptr("prefill_len_ptr", INT, I32, "[max_num_reqs]"),
        ptr("draft_tokens_ptr", INT, I64, "[max_num_reqs, K] each request's drafts", contiguous=False, ndim=(2,)),
        scalar("draft_tokens_stride", "row stride of draft_tokens"),
        ptr("cu_num_logits_ptr", INT, I32, "[num_reqs + 1] logits offsets"),
        ptr("logits_indices_ptr", INT, I64, "[num_logits] the token rows logits are computed at", role=Role.OUT),
        constexpr("BLOCK_SIZE", "next_power_of_2(K + NUM_NEW_SAMPLED_TOKENS): one tile per request"),
        constexpr("NUM_NEW_SAMPLED_TOKENS", "bonus tokens per step, 0 or 1", default=1),
    ),
    grid=lambda a: (a["idx_mapping_ptr"].numel(),),
    preconditions=_combine_pre,
    explain=_combine_explain,
    rule=_combine_rule,
    call_site=lambda a: a["draft_tokens_stride"] == a["draft_tokens_ptr"].stride(0),
)


# -- K25: what the rejection sampler kept ---------------------------------------------------------
def _counts_pre(a: Mapping[str, Any]) -> None:
    k = K25
    n = a["idx_mapping_ptr"].numel()
    cu = exclusive_offsets(k, "cu_num_logits_ptr", a["cu_num_logits_ptr"], n + 1)
    state_rows(k, a, ("prefill_len_ptr",))
    for name in ("num_sampled_ptr", "num_rejected_ptr", "seq_lens_ptr"):
        require_length(k, name, a[name], n)
    sampled = a["num_sampled_ptr"][:n].tolist()
    for b in range(n):
        nl = cu[b + 1] - cu[b]
        in_int32(k, "cu_num_logits_ptr", nl, f"row {b}'s logits count")  # num_rejected is at most it
        require(0 <= sampled[b] <= nl, k, "num_sampled_ptr", f"entry {b} = {sampled[b]} must be in [0, {nl}] (its logits)")


def _counts_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    idx = a["idx_mapping_ptr"].tolist()
    if index >= len(idx):
        return f"element {index} lies past num_reqs={len(idx)}: it must stay untouched"
    s, cu = idx[index], a["cu_num_logits_ptr"].tolist()
    return (f"row {index} -> request state {s}: seq_len={item(a['seq_lens_ptr'], index)}, "
            f"prefill_len={item(a['prefill_len_ptr'], s)}, {cu[index + 1] - cu[index]} logits")


GET_NUM_SAMPLED_AND_REJECTED = KernelSpec(
    name=K25,
    family="input_batch",
    qualname=f"{MODULE}.{K25}",
    params=(
        ptr("num_sampled_ptr", INT, I32, "[num_reqs] tokens emitted; zeroed for chunked prefills", role=Role.INOUT),
        ptr("num_rejected_ptr", INT, I32, "[num_reqs] logits rows not emitted", role=Role.OUT),
        ptr("seq_lens_ptr", INT, I32, "[>= num_reqs]"),
        ptr("cu_num_logits_ptr", INT, I32, "[num_reqs + 1] logits offsets"),
        ptr("idx_mapping_ptr", INT, I64, "[num_reqs] batch row -> request state"),
        ptr("prefill_len_ptr", INT, I32, "[max_num_reqs]"),
    ),
    grid=lambda a: (a["idx_mapping_ptr"].numel(),),
    preconditions=_counts_pre,
    explain=_counts_explain,
    rule=lambda a, output, index, kind: "C37 chunked prefill counts",
)


# -- K26: commit the step to the request state ----------------------------------------------------
def _post_pre(a: Mapping[str, Any]) -> None:
    k = K26
    n = a["idx_mapping_ptr"].numel()
    idx = state_rows(k, a, ("num_computed_tokens_ptr", "last_sampled_tokens_ptr", "total_len_ptr"),
                     distinct=True, skip_negative=True)
    for name in ("num_sampled_ptr", "num_rejected_ptr"):
        require_length(k, name, a[name], n)
    if a["query_start_loc_ptr"] is not None:
        require_length(k, "query_start_loc_ptr", a["query_start_loc_ptr"], n + 1)
    nd, drafts, out = a["num_draft_tokens"], a["draft_tokens_ptr"], a["draft_tokens_out_ptr"]
    if drafts is not None:
        require(out is not None, k, "draft_tokens_out_ptr", "must be a tensor when draft_tokens_ptr is one")
        require(nd >= 0, k, "num_draft_tokens", f"must be >= 0, got {nd}")
    sampled_t, s_stride = a["sampled_tokens_ptr"], a["sampled_tokens_stride"]
    tokens, t_stride = a["all_token_ids_ptr"], a["all_token_ids_stride"]
    bins, b_stride = a["output_bin_counts_ptr"], a["output_bin_counts_stride"]
    total = a["total_len_ptr"]
    num_sampled = a["num_sampled_ptr"][:n].tolist()
    for b, s in enumerate(idx):
        if s < 0:
            continue
        if drafts is not None:
            require_cells(k, "draft_tokens_ptr", drafts, b * nd, nd, f"row {b}'s drafts")
            require_cells(k, "draft_tokens_out_ptr", out, s * nd, nd, f"request state {s}'s drafts")
        ns = num_sampled[b]
        require(ns >= 0, k, "num_sampled_ptr", f"entry {b} = {ns} must be >= 0")
        require_cells(k, "sampled_tokens_ptr", sampled_t, b * s_stride, ns, f"row {b}'s {ns} sampled tokens")
        if ns:
            start = int(total[s])
            in_int32(k, "num_sampled_ptr", start + ns, f"request state {s}'s total_len")
            require(start >= 0, k, "total_len_ptr", f"entry {s} = {start} must be >= 0 where tokens are appended")
            require_cells(k, "all_token_ids_ptr", tokens, s * t_stride + start, ns,
                          f"request state {s}'s tokens [{start}, {start + ns})")
        if bins is not None:
            row = flat_view(sampled_t)[b * s_stride : b * s_stride + ns].tolist() if ns else []
            for t in row:
                require(t >= 0, k, "sampled_tokens_ptr", f"token {t} of row {b} indexes output_bin_counts (must be >= 0)")
                require_cells(k, "output_bin_counts_ptr", bins, s * b_stride + t, 1, f"request state {s}'s count of token {t}")
            for t in set(row):
                count = int(flat_view(bins)[s * b_stride + t])
                in_int32(k, "output_bin_counts_ptr", count + row.count(t), f"request state {s}'s count of token {t}")
        qsl = a["query_start_loc_ptr"]
        ql = 0 if qsl is None else int(qsl[b + 1]) - int(qsl[b])
        in_int32(k, "query_start_loc_ptr", ql, f"row {b}'s query_len")
        delta = ql - int(a["num_rejected_ptr"][b])
        in_int32(k, "num_rejected_ptr", delta, f"row {b}'s query_len - num_rejected")
        in_int32(k, "num_computed_tokens_ptr", int(a["num_computed_tokens_ptr"][s]) + delta, f"request state {s}'s num_computed")


def _post_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    idx = a["idx_mapping_ptr"].tolist()
    sizes = {"num_computed_tokens_ptr": 1, "last_sampled_tokens_ptr": 1, "total_len_ptr": 1}
    if output in sizes:
        s = index
    else:
        stride = {"all_token_ids_ptr": a["all_token_ids_stride"], "output_bin_counts_ptr": a["output_bin_counts_stride"],
                  "draft_tokens_out_ptr": max(a["num_draft_tokens"], 1)}[output]
        s = index // stride if stride > 0 else index
    if s not in idx:
        return f"request state {s} is not in the batch (or its row is skipped): it must stay untouched"
    b = idx.index(s)
    qsl = a["query_start_loc_ptr"]
    ql = "0 (no query_start_loc)" if qsl is None else str(int(qsl[b + 1]) - int(qsl[b]))
    return (f"row {b} -> request state {s}: num_sampled={item(a['num_sampled_ptr'], b)}, "
            f"num_rejected={item(a['num_rejected_ptr'], b)}, query_len={ql}, total_len={item(a['total_len_ptr'], s)}")


POST_UPDATE = KernelSpec(
    name=K26,
    earlier=_EARLIER_K26,
    family="input_batch",
    qualname=f"{MODULE}.{K26}",
    params=(
        ptr("idx_mapping_ptr", INT, I64, "[num_reqs] batch row -> request state; negative: skip the row"),
        ptr("num_computed_tokens_ptr", INT, I32, "[max_num_reqs] advanced by query_len - num_rejected", role=Role.INOUT),
        ptr("last_sampled_tokens_ptr", INT, I64, "[max_num_reqs(, 1)]", role=Role.INOUT, ndim=(1, 2)),
        ptr("output_bin_counts_ptr", INT, I32, "[max_num_reqs, vocab] per-token output counts, or None",
            role=Role.INOUT, optional=True, contiguous=False, ndim=(2,)),
        scalar("output_bin_counts_stride", "row stride of output_bin_counts (0 without it)"),
        ptr("sampled_tokens_ptr", INT, I64, "[num_reqs, K + 1] tokens emitted per row", contiguous=False, ndim=(2,)),
        scalar("sampled_tokens_stride", "row stride of sampled_tokens"),
        ptr("num_sampled_ptr", INT, I32, "[num_reqs]"),
        ptr("num_rejected_ptr", INT, I32, "[num_reqs]"),
        ptr("query_start_loc_ptr", INT, I32, "[num_reqs + 1] query offsets, or None (query_len 0)", optional=True),
        ptr("all_token_ids_ptr", INT, I32, "[max_num_reqs, max_model_len] emitted tokens appended",
            role=Role.INOUT, contiguous=False, ndim=(2,)),
        scalar("all_token_ids_stride", "row stride of all_token_ids"),
        ptr("total_len_ptr", INT, I32, "[max_num_reqs] advanced by num_sampled", role=Role.INOUT),
        ptr("draft_tokens_ptr", INT, I64, "[num_reqs, num_draft_tokens] drafts received, or None", optional=True, ndim=(1, 2)),
        ptr("draft_tokens_out_ptr", INT, I64, "[max_num_reqs, num_draft_tokens] the state's drafts", role=Role.INOUT, optional=True,
            ndim=(1, 2)),
        scalar("num_draft_tokens", "row stride of both draft tensors (0 without them)"),
    ),
    grid=lambda a: (a["idx_mapping_ptr"].numel(),),
    preconditions=_post_pre,
    explain=_post_explain,
    rule=lambda a, output, index, kind: "C37 post update",
    call_site=lambda a: a["sampled_tokens_stride"] == a["sampled_tokens_ptr"].stride(0)
    and a["all_token_ids_stride"] == a["all_token_ids_ptr"].stride(0),
)


# -- K27: num_computed_tokens without sampling ----------------------------------------------------
def _computed_pre(a: Mapping[str, Any]) -> None:
    k = K27
    n = a["idx_mapping_ptr"].numel()
    require_length(k, "query_start_loc_ptr", a["query_start_loc_ptr"], n + 1)
    idx = state_rows(k, a, ("num_computed_tokens_ptr",), distinct=True)
    qsl = a["query_start_loc_ptr"][: n + 1].tolist()
    for b, s in enumerate(idx):
        in_int32(k, "query_start_loc_ptr", qsl[b + 1] - qsl[b], f"row {b}'s query_len")
        in_int32(k, "num_computed_tokens_ptr", int(a["num_computed_tokens_ptr"][s]) + qsl[b + 1] - qsl[b], f"request state {s}'s num_computed")


POST_UPDATE_NUM_COMPUTED_TOKENS = KernelSpec(
    name=K27,
    family="input_batch",
    qualname=f"{MODULE}.{K27}",
    params=(
        ptr("idx_mapping_ptr", INT, I64, "[num_reqs] batch row -> request state"),
        ptr("num_computed_tokens_ptr", INT, I32, "[max_num_reqs] advanced by query_len", role=Role.INOUT),
        ptr("query_start_loc_ptr", INT, I32, "[>= num_reqs + 1] query offsets"),
    ),
    grid=lambda a: (a["idx_mapping_ptr"].numel(),),
    preconditions=_computed_pre,
    explain=lambda a, output, index: (f"request state {index}: advanced by its query length if in the batch, "
                                      f"num_computed was {item(a['num_computed_tokens_ptr'], index)}"),
    rule=lambda a, output, index, kind: "C37 computed tokens",
)


# -- K28: one entry per logits row --------------------------------------------------------------
def _expand_pre(a: Mapping[str, Any]) -> None:
    k = K28
    n = a["idx_mapping_ptr"].numel()
    cu = exclusive_offsets(k, "cu_num_logits_ptr", a["cu_num_logits_ptr"], n + 1)
    power_of_two(k, "BLOCK_SIZE", a["BLOCK_SIZE"])
    for b in range(n):
        nl = cu[b + 1] - cu[b]
        require(nl <= a["BLOCK_SIZE"], k, "cu_num_logits_ptr", f"gives row {b} {nl} logits, more than BLOCK_SIZE={a['BLOCK_SIZE']}")
    for name in ("expanded_idx_mapping_ptr", "expanded_local_pos_ptr"):
        require_length(k, name, a[name], cu[n])


EXPAND_IDX_MAPPING = KernelSpec(
    name=K28,
    family="input_batch",
    qualname=f"{MODULE}.{K28}",
    params=(
        ptr("idx_mapping_ptr", INT, I64, "[num_reqs] batch row -> request state"),
        ptr("expanded_idx_mapping_ptr", INT, I64, "[num_logits] the request state of each logits row", role=Role.OUT),
        ptr("expanded_local_pos_ptr", INT, I32, "[num_logits] each logits row's place in its request", role=Role.OUT),
        ptr("cu_num_logits_ptr", INT, I32, "[num_reqs + 1] logits offsets"),
        constexpr("BLOCK_SIZE", "next_power_of_2(max logits per request)"),
    ),
    grid=lambda a: (a["idx_mapping_ptr"].numel(),),
    preconditions=_expand_pre,
    explain=lambda a, output, index: f"logits row {index} of cu_num_logits {a['cu_num_logits_ptr'].tolist()}",
    rule=lambda a, output, index, kind: "C37 expanded rows",
)

SPECS = (
    PREPARE_PREFILL_INPUTS,
    PREPARE_POS_SEQ_LENS,
    COMBINE_SAMPLED_AND_DRAFT_TOKENS,
    GET_NUM_SAMPLED_AND_REJECTED,
    POST_UPDATE,
    POST_UPDATE_NUM_COMPUTED_TOKENS,
    EXPAND_IDX_MAPPING,
)
