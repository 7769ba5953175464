"""Contract of Model Runner V2's repetition, frequency and presence penalties (docs/penalties.md, C42;
vLLM's ``vllm/v1/worker/gpu/sample/penalties.py``).

``PenaltiesState`` keeps, per request state, a bitmask of the prompt's tokens (``prompt_bin_mask``:
int32 words, bit ``t % 32`` of word ``t // 32``) and a count of each output token
(``output_bin_counts``). When a request is added, ``bincount`` (``penalties.py:271``) zeroes its
two rows and K40 ``_bincount_kernel`` (``:220``) fills them from its prefill tokens. Every step the
sampler's logits processors run ``apply_penalties`` (``:187``) on the sampler's float32 copy of the
logits: K39 ``_penalties_kernel`` (``:108``) penalises, in place, each row of a request that has a
penalty, counting the earlier drafts of its own verification rows as output tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from contracts._checks import flat_view, require_cells, require_rows
from contracts.spec import (
    INT,
    Earlier,
    KernelSpec,
    Role,
    at_least,
    cdiv,
    constexpr,
    in_int32,
    power_of_two,
    ptr,
    require,
    scalar,
)

F32, I32, I64 = torch.float32, torch.int32, torch.int64
K39, K40 = "_penalties_kernel", "_bincount_kernel"
PENALTIES_BLOCK_SIZE = 8192  # apply_penalties' tile on a GPU; vLLM's CPU worker patches it to 1024 (cpu/shm.py)
BINCOUNT_BLOCK_SIZE = 1024  # bincount's tile
WORD = 32  # prompt tokens per bitmask word
# |frequency penalty| bound: times any int32 count (|c| <= 2**31) the product stays below 2**127, finite,
# so no lane subtracts an infinity from an infinity (a NaN, whose bits are the platform's: C30).
FREQUENCY_BOUND = 2.0**96
INT32_MAX = 2**31 - 1
_MODULE = "vllm.v1.worker.gpu.sample.penalties"


# -- K39 ---------------------------------------------------------------------------------------------
def rows(a: Mapping[str, Any]) -> int:
    """K39's rows: the logits' rows (apply_penalties' grid, ``logits.shape[0]``)."""
    return a["logits_ptr"].shape[0]


def penalties_of(a: Mapping[str, Any], s: int) -> tuple[float, float, float]:
    """Request state ``s``'s (repetition, frequency, presence) penalties, as float32 values."""
    return (float(a["repetition_penalty_ptr"][s]), float(a["frequency_penalty_ptr"][s]), float(a["presence_penalty_ptr"][s]))


def uses_penalty(rep: float, freq: float, pres: float) -> bool:
    """Whether a row is penalised: a repetition penalty other than 1 or a frequency or presence penalty
    other than 0 (``-0.0`` equals 0; NaN differs from everything)."""
    return rep != 1.0 or freq != 0.0 or pres != 0.0


def draft_span(a: Mapping[str, Any], r: int) -> tuple[int, int]:
    """The token_ids [first, r] that row ``r`` counts: the ``pos`` entries before and at it, from its
    request's local position 1 (local position 0, the last committed token, is never counted)."""
    pos = int(a["expanded_local_pos_ptr"][r])
    return r - pos + 1, r


def draft_counts(a: Mapping[str, Any], r: int) -> torch.Tensor:
    """How often each column of the vocabulary appears among row ``r``'s earlier drafts ([V] int64):
    a token id outside [0, V) (vLLM's -1 placeholder of a draft not yet proposed) counts nowhere."""
    v = a["vocab_size"]
    first, last = draft_span(a, r)
    drafts = a["token_ids_ptr"][first : last + 1].to(I64) if last >= first else torch.zeros(0, dtype=I64)
    return torch.bincount(drafts[(drafts >= 0) & (drafts < v)], minlength=v)[:v]


def prompt_bits(a: Mapping[str, Any], s: int) -> torch.Tensor:
    """Whether each column of the vocabulary is among request state ``s``'s prompt tokens ([V] bool):
    bit ``t % 32`` of word ``t // 32`` (bit 31 of a negative int32 word included; bits past V unread)."""
    v = a["vocab_size"]
    at = s * a["prompt_bin_mask_stride"]
    words = flat_view(a["prompt_bin_mask_ptr"])[at : at + cdiv(v, WORD)].to(I64) & 0xFFFFFFFF
    cols = torch.arange(v)
    return ((words[cols // WORD] >> (cols % WORD)) & 1).bool()


def _tiles_fit(k: str, v: int, block: int) -> None:
    at_least(k, "vocab_size", v, 0)
    power_of_two(k, "BLOCK_SIZE", block)
    require(WORD <= block <= 2**16, k, "BLOCK_SIZE", f"must be in [32, 65536] (a tile of whole bitmask words), got {block}")
    in_int32(k, "vocab_size", v + block, "vocab_size + BLOCK_SIZE (column indices are int32)")


def _penalties_pre(a: Mapping[str, Any]) -> None:
    k, v, n = K39, a["vocab_size"], rows(a)
    _tiles_fit(k, v, a["BLOCK_SIZE"])
    logits, stride = a["logits_ptr"], a["logits_stride"]
    if n > 1:  # rows written never overlap
        require(stride == logits.stride(0), k, "logits_stride", f"must be logits_ptr's row stride {logits.stride(0)}, got {stride}")
        at_least(k, "logits_stride", stride, v)
    require_rows(k, "logits_ptr", logits, n, stride, v)
    for name in ("expanded_idx_mapping_ptr", "expanded_local_pos_ptr"):
        require(a[name].numel() >= n, k, name, f"must hold an entry per row ({n}), has {a[name].numel()}")
    for name, width in (("prompt_bin_mask_ptr", cdiv(v, WORD)), ("output_bin_counts_ptr", v)):
        require(a[name].shape[1] >= width, k, name, f"must have >= {width} columns (a request state's row), has {a[name].shape[1]}")
    tables = ("repetition_penalty_ptr", "frequency_penalty_ptr", "presence_penalty_ptr")
    mapping = a["expanded_idx_mapping_ptr"][:n].tolist()
    for r, s in enumerate(mapping):
        for table in tables:
            require(0 <= s < a[table].numel(), k, "expanded_idx_mapping_ptr",
                    f"entry {r} = {s} must index '{table}' of {a[table].numel()} request states")
    if not v:
        return
    for r, s in enumerate(mapping):
        rep, freq, pres = penalties_of(a, s)
        if not uses_penalty(rep, freq, pres):
            continue  # the row is neither read nor written
        _penalised_row(a, r, s, rep, freq, pres)


def _penalised_row(a: Mapping[str, Any], r: int, s: int, rep: float, freq: float, pres: float) -> None:
    """C42's domain where a row is penalised: every index it reads inside its tensor, and no lane that
    makes a NaN (vLLM's sampling parameters: a repetition penalty finite and > 0, the other two in [-2, 2])."""
    k, v = K39, a["vocab_size"]
    require(rep == 1.0 or 0.0 < rep < float("inf"), k, "repetition_penalty_ptr",
            f"must be finite and > 0 where a row is penalised (C42); state {s} holds {rep!r}")
    require(abs(freq) <= FREQUENCY_BOUND, k, "frequency_penalty_ptr",
            f"must be finite, |x| <= 2**96, where a row is penalised (C42); state {s} holds {freq!r}")
    require(abs(pres) < float("inf"), k, "presence_penalty_ptr",
            f"must be finite where a row is penalised (C42); state {s} holds {pres!r}")
    row = a["logits_ptr"][r, :v]
    if bool(torch.isnan(row).any()):
        raise ValueError(f"{k}: 'logits_ptr' must hold no NaN in a row it penalises (C42, C30); row {r}, "
                         f"column {int(torch.isnan(row).nonzero()[0])}")
    pos = int(a["expanded_local_pos_ptr"][r])
    require(0 <= pos <= r + 1, k, "expanded_local_pos_ptr",
            f"entry {r} = {pos} must be in [0, {r + 1}]: the row's earlier drafts token_ids[r - pos + 1 .. r] lie from index 0 on")
    if pos:
        require(a["token_ids_ptr"].numel() > r, k, "token_ids_ptr",
                f"must hold row {r}'s token (its earlier drafts end there), has {a['token_ids_ptr'].numel()}")
    require_cells(k, "output_bin_counts_ptr", a["output_bin_counts_ptr"], s * a["output_bin_counts_stride"], v,
                  f"request state {s}'s {v} counts")
    if rep != 1.0:
        words = cdiv(v, WORD)
        require_cells(k, "prompt_bin_mask_ptr", a["prompt_bin_mask_ptr"], s * a["prompt_bin_mask_stride"], words,
                      f"request state {s}'s {words} prompt words")
    if pos:
        extra = draft_counts(a, r)
        hit = extra.nonzero()[:, 0]
        if hit.numel():
            base = flat_view(a["output_bin_counts_ptr"])[s * a["output_bin_counts_stride"] + hit].to(I64)
            worst = int((base + extra[hit]).argmax())
            t = int(hit[worst])
            in_int32(k, "output_bin_counts_ptr", int(base[worst]) + int(extra[t]),
                     f"row {r}'s count of token {t} (request state {s}'s count plus its earlier drafts)")


def _row_col(a: Mapping[str, Any], index: int) -> tuple[int, int]:
    return divmod(index, a["logits_stride"]) if a["logits_stride"] else (0, index)


def _penalised_cell(a: Mapping[str, Any], index: int) -> tuple[int, int, int, float, float] | None:
    """(row, column, state, repetition, frequency) of a logits cell K39 writes, or None."""
    r, c = _row_col(a, index)
    if r >= rows(a) or c >= a["vocab_size"]:
        return None
    s = int(a["expanded_idx_mapping_ptr"][r])
    rep, freq, pres = penalties_of(a, s)
    return (r, c, s, rep, freq) if uses_penalty(rep, freq, pres) else None


def count_of(a: Mapping[str, Any], r: int, s: int, c: int) -> int:
    """Row ``r``'s count of column ``c``: state ``s``'s plus its earlier drafts'."""
    return int(flat_view(a["output_bin_counts_ptr"])[s * a["output_bin_counts_stride"] + c]) + int(draft_counts(a, r)[c])


def reciprocal_cell(a: Mapping[str, Any], output: str, index: int) -> bool:
    """A cell the repetition penalty scales by RN(1 / p): a positive logit in the prompt or counted
    (compiled Triton's ``1.0 / scale`` is approximate there: C6)."""
    cell = _penalised_cell(a, index)
    if cell is None or cell[3] == 1.0:
        return False
    r, c, s, _, _ = cell
    return float(a["logits_ptr"][r, c]) > 0 and (bool(prompt_bits(a, s)[c]) or count_of(a, r, s, c) > 0)


def fused_cell(a: Mapping[str, Any], output: str, index: int) -> bool:
    """A cell whose frequency term freq * count is not zero: a compiled kernel may fuse it, or the
    repetition product before it, into one fma with the subtraction (C42 rounds each product)."""
    cell = _penalised_cell(a, index)
    if cell is None or cell[4] == 0.0:
        return False
    r, c, s, _, _ = cell
    return count_of(a, r, s, c) != 0


def _penalties_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    r, c = _row_col(a, index)
    v = a["vocab_size"]
    if r >= rows(a) or c >= v:
        return f"flat index {index} lies outside the rows' {v} columns: it must stay untouched"
    s = int(a["expanded_idx_mapping_ptr"][r])
    rep, freq, pres = penalties_of(a, s)
    line = f"row {r}, column {c} -> request state {s}: repetition {rep!r}, frequency {freq!r}, presence {pres!r}"
    if not uses_penalty(rep, freq, pres):
        return line + " (no penalty: untouched)"
    count = int(flat_view(a["output_bin_counts_ptr"])[s * a["output_bin_counts_stride"] + c])
    first, last = draft_span(a, r)
    drafts = int(draft_counts(a, r)[c])
    word = int(flat_view(a["prompt_bin_mask_ptr"])[s * a["prompt_bin_mask_stride"] + c // WORD]) if rep != 1.0 else 0
    in_prompt = (word >> (c % WORD)) & 1
    return (line + f"; count {count} + {drafts} among token_ids[{first}..{last}], in the prompt: {bool(in_prompt)}; "
            f"logit {float(a['logits_ptr'][r, c])!r}")


def _penalties_rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    r, c = _row_col(a, index)
    if r >= rows(a) or c >= a["vocab_size"]:
        return "C42 untouched columns"
    s = int(a["expanded_idx_mapping_ptr"][r])
    rep, freq, pres = penalties_of(a, s)
    if not uses_penalty(rep, freq, pres):
        return "C42 row without penalty"
    return "C42 repetition penalty" if rep != 1.0 else "C42 frequency and presence"


def _penalties_bytes(a: Mapping[str, Any]) -> int:
    n, v = rows(a), a["vocab_size"]
    return n * (2 * v * 4 + v * 4 + cdiv(v, WORD) * 4 + a["expanded_idx_mapping_ptr"].element_size() + 12)


PENALTIES = KernelSpec(
    name=K39,
    family="penalties",
    qualname=f"{_MODULE}.{K39}",
    params=(
        ptr("logits_ptr", (F32,), F32, "[T, >= V] float32 logits (the sampler's copy), rows logits_stride apart; in place",
            role=Role.INOUT, ndim=(2,), contiguous=False),
        scalar("logits_stride", "row stride of logits (logits.stride(0))"),
        ptr("expanded_idx_mapping_ptr", INT, I64, "[>= T] each row's request state"),
        ptr("token_ids_ptr", INT, I32, "[T] the step's input tokens (draft_sampled for the rejection sampler): "
            "a request's local position 0 holds its last committed token, 1..K its drafts; any id (-1: a placeholder)"),
        ptr("expanded_local_pos_ptr", INT, I32, "[>= T] each row's position within its request's rows (0..K)"),
        ptr("repetition_penalty_ptr", (F32,), F32, "[max_num_reqs] each request's repetition penalty (1: off)"),
        ptr("frequency_penalty_ptr", (F32,), F32, "[max_num_reqs] each request's frequency penalty (0: off)"),
        ptr("presence_penalty_ptr", (F32,), F32, "[max_num_reqs] each request's presence penalty (0: off)"),
        ptr("prompt_bin_mask_ptr", (I32,), I32, "[max_num_reqs, >= cdiv(V, 32)] prompt tokens, bit t % 32 of word t // 32",
            ndim=(2,), contiguous=False),
        scalar("prompt_bin_mask_stride", "row stride of prompt_bin_mask"),
        ptr("output_bin_counts_ptr", (I32,), I32, "[max_num_reqs, >= V] each output token's count", ndim=(2,), contiguous=False),
        scalar("output_bin_counts_stride", "row stride of output_bin_counts"),
        scalar("vocab_size", "V, the columns of a row"),
        constexpr("BLOCK_SIZE", "vocabulary tile width, a power of two >= 32 (8192 on a GPU, 1024 on vLLM's CPU worker)"),
    ),
    grid=lambda a: (rows(a), cdiv(a["vocab_size"], a["BLOCK_SIZE"])),
    preconditions=_penalties_pre,
    explain=_penalties_explain,
    rule=_penalties_rule,
    call_site=lambda a: (a["logits_stride"] == a["logits_ptr"].stride(0)
                         and a["prompt_bin_mask_stride"] == a["prompt_bin_mask_ptr"].stride(0)
                         and a["output_bin_counts_stride"] == a["output_bin_counts_ptr"].stride(0)
                         and a["BLOCK_SIZE"] in (PENALTIES_BLOCK_SIZE, 1024)),
    bytes_moved=_penalties_bytes,
)


def _with_max_spec_len(a: Mapping[str, Any]) -> dict[str, Any]:
    """Through 0.21.0 the draft loop ran MAX_SPEC_LEN (the speculative steps) times, skipping steps at
    or past the row's position: the same counts when MAX_SPEC_LEN covers every position."""
    n = rows(a)
    longest = int(a["expanded_local_pos_ptr"][:n].max()) if n else 0
    return {**a, "MAX_SPEC_LEN": max(1, longest)}


PENALTIES.earlier = (
    Earlier("0.21.0", (*PENALTIES.arg_names, "MAX_SPEC_LEN"),
            "the draft loop unrolled to MAX_SPEC_LEN (num_speculative_tokens) steps", bind=_with_max_spec_len),
)


# -- K40 ---------------------------------------------------------------------------------------------
def bincount_rows(a: Mapping[str, Any]) -> int:
    """K40's rows: the new requests (bincount's grid, ``expanded_idx_mapping.shape[0]``)."""
    return a["expanded_idx_mapping_ptr"].numel()


def longest_prefill(a: Mapping[str, Any]) -> int:
    """The longest prefill among the rows' states (the host's ``max_prefill_len``); states outside the
    table count 0 (such a launch is refused by the preconditions, never run)."""
    lens = a["prefill_len_ptr"]
    states = [s for s in a["expanded_idx_mapping_ptr"].tolist() if 0 <= s < lens.numel()]
    return max((int(lens[s]) for s in states), default=0)


def bincount_grid(a: Mapping[str, Any]) -> tuple[int, int]:
    """(rows, cdiv(max_prefill_len, BLOCK_SIZE)): a program per row and tile of the longest prefill; a
    program whose tile starts at or past its own row's prefill_len does nothing."""
    return (bincount_rows(a), cdiv(max(longest_prefill(a), 0), a["BLOCK_SIZE"]))


def prefill_of(a: Mapping[str, Any], s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request state ``s``'s prompt tokens and its output tokens below prefill_len (int64)."""
    p, f = int(a["prompt_len_ptr"][s]), int(a["prefill_len_ptr"][s])
    at = s * a["all_token_ids_stride"]
    tokens = flat_view(a["all_token_ids_ptr"])[at : at + f].to(I64)
    return tokens[:p], tokens[p:]


def _bincount_pre(a: Mapping[str, Any]) -> None:
    k, block = K40, a["BLOCK_SIZE"]
    power_of_two(k, "BLOCK_SIZE", block)
    require(block <= 2**16, k, "BLOCK_SIZE", f"must be <= 65536 (a tile), got {block}")
    mask, counts = a["prompt_bin_mask_ptr"], a["output_bin_counts_ptr"]
    m_words, c_width = mask.shape[1], counts.shape[1]
    mapping = a["expanded_idx_mapping_ptr"].tolist()
    added: list[torch.Tensor] = []  # the flat count cells the rows add 1 to, once per output token
    for r, s in enumerate(mapping):
        for table in ("prefill_len_ptr", "prompt_len_ptr"):
            require(0 <= s < a[table].numel(), k, "expanded_idx_mapping_ptr",
                    f"entry {r} = {s} must index '{table}' of {a[table].numel()} request states")
        p, f = int(a["prompt_len_ptr"][s]), int(a["prefill_len_ptr"][s])
        require(0 <= p <= f, k, "prompt_len_ptr", f"entry {s} = {p} must be in [0, prefill_len = {f}] (row {r})")
        in_int32(k, "prefill_len_ptr", f + block, f"request state {s}'s prefill_len + BLOCK_SIZE (token indices are int32)")
        if not f:
            continue
        require_cells(k, "all_token_ids_ptr", a["all_token_ids_ptr"], s * a["all_token_ids_stride"], f,
                      f"request state {s}'s prefill tokens [0, {f})")
        prompt, output = prefill_of(a, s)
        if prompt.numel():
            lo, hi = int(prompt.min()), int(prompt.max())
            require(lo >= 0 and hi // WORD < m_words, k, "all_token_ids_ptr",
                    f"request state {s}'s prompt tokens must lie in [0, 32 x {m_words} prompt_bin_mask words), hold "
                    f"{lo if lo < 0 else hi}")
            require_cells(k, "prompt_bin_mask_ptr", mask, s * a["prompt_bin_mask_stride"], hi // WORD + 1,
                          f"request state {s}'s prompt words")
        if output.numel():
            lo, hi = int(output.min()), int(output.max())
            require(lo >= 0 and hi < c_width, k, "all_token_ids_ptr",
                    f"request state {s}'s output tokens must lie in [0, {c_width}) (output_bin_counts' columns), hold "
                    f"{lo if lo < 0 else hi}")
            require_cells(k, "output_bin_counts_ptr", counts, s * a["output_bin_counts_stride"], hi + 1,
                          f"request state {s}'s counts")
            added.append(s * a["output_bin_counts_stride"] + output)
    if added:  # each row adds its outputs (a state named twice, twice): every count stays int32
        cells, times = torch.cat(added).unique(return_counts=True)
        now = flat_view(counts)[cells].to(I64) + times
        worst = int(now.argmax())
        in_int32(k, "output_bin_counts_ptr", int(now[worst]), f"the count at flat index {int(cells[worst])} plus its new tokens")


def _bincount_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    stride = a["prompt_bin_mask_stride" if output == "prompt_bin_mask_ptr" else "output_bin_counts_stride"]
    s, c = divmod(index, stride) if stride else (0, index)
    rows_of = [r for r, x in enumerate(a["expanded_idx_mapping_ptr"].tolist()) if x == s]
    if not rows_of:
        return f"request state {s} is not among the rows: its cell {c} must stay as it was"
    prompt, out = prefill_of(a, s)
    what = (f"word {c} (tokens [{c * WORD}, {c * WORD + WORD}))" if output == "prompt_bin_mask_ptr"
            else f"token {c}: {int((out == c).sum())} of {out.numel()} output tokens")
    return f"request state {s} (rows {rows_of}): prompt_len {prompt.numel()}, prefill_len {prompt.numel() + out.numel()}; {what}"


BINCOUNT = KernelSpec(
    name=K40,
    family="penalties",
    qualname=f"{_MODULE}.{K40}",
    params=(
        ptr("expanded_idx_mapping_ptr", INT, I64, "[N] the new requests' states"),
        ptr("all_token_ids_ptr", INT, I32, "[max_num_reqs, max_model_len] every request's tokens", ndim=(2,), contiguous=False),
        scalar("all_token_ids_stride", "row stride of all_token_ids"),
        ptr("prompt_len_ptr", INT, I32, "[max_num_reqs] tokens of each request's prompt"),
        ptr("prefill_len_ptr", INT, I32, "[max_num_reqs] tokens each request prefills (>= prompt_len)"),
        ptr("prompt_bin_mask_ptr", (I32,), I32, "[max_num_reqs, cdiv(V, 32)] prompt bits, OR-ed in", role=Role.INOUT,
            ndim=(2,), contiguous=False),
        scalar("prompt_bin_mask_stride", "row stride of prompt_bin_mask"),
        ptr("output_bin_counts_ptr", (I32,), I32, "[max_num_reqs, V] output counts, added to", role=Role.INOUT, ndim=(2,),
            contiguous=False),
        scalar("output_bin_counts_stride", "row stride of output_bin_counts"),
        constexpr("BLOCK_SIZE", "token tile width (1024 at the call site)"),
    ),
    grid=bincount_grid,
    preconditions=_bincount_pre,
    explain=_bincount_explain,
    rule=lambda a, output, index, kind: "C42 prompt bits" if output == "prompt_bin_mask_ptr" else "C42 output counts",
    call_site=lambda a: (a["all_token_ids_stride"] == a["all_token_ids_ptr"].stride(0)
                         and a["prompt_bin_mask_stride"] == a["prompt_bin_mask_ptr"].stride(0)
                         and a["output_bin_counts_stride"] == a["output_bin_counts_ptr"].stride(0)
                         and a["BLOCK_SIZE"] == BINCOUNT_BLOCK_SIZE
                         and len(set(a["expanded_idx_mapping_ptr"].tolist())) == bincount_rows(a)),
    bytes_moved=lambda a: sum(2 * int(a["prefill_len_ptr"][s]) * 4 for s in a["expanded_idx_mapping_ptr"].tolist()),
)

SPECS = (PENALTIES, BINCOUNT)
