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
from dataclasses import dataclass
from typing import Any

import torch

from contracts._checks import exclusive_offsets, flat_view, holds, item, span
from contracts.numerics import logsumexp
from contracts.spec import (
    INT,
    Earlier,
    Flag,
    KernelSpec,
    Role,
    at_least,
    cdiv,
    constexpr,
    power_of_two,
    ptr,
    real,
    require,
    require_fits,
    require_length,
    scalar,
)

I32, I64, F32 = torch.int32, torch.int64, torch.float32
LOGITS = (torch.float32, torch.bfloat16, torch.float16)
_MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"
_UTILS = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"
K11 = "_gather_draft_sampled_kernel"
K12 = "_flatten_sampled_kernel"
K13 = "_compute_local_logits_stats_kernel"
K14 = "_compute_cumulative_log_p_kernel"
K15 = "_compute_local_residual_mass_kernel"
K16 = "_rejection_kernel"
K17 = "_resample_kernel"
K18 = "_insert_resampled_kernel"
# C29: tile sums are exact sums of terms truncated to multiples of 2^-46; a tile of at most 2^16
# terms in [0, 1] then fits int64.
MAX_BLOCK = 1 << 16


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


def _request_offsets(k: str, a: Mapping[str, Any]) -> list[int]:
    """``cu_num_logits``: all of it, R + 1 non-decreasing exclusive row offsets."""
    cu_t = a["cu_num_logits_ptr"]
    require(cu_t.numel() >= 1, k, "cu_num_logits_ptr", "must hold at least one element (num_reqs + 1)")
    return exclusive_offsets(k, "cu_num_logits_ptr", cu_t, cu_t.numel())


def _bonus_offsets(k: str, a: Mapping[str, Any]) -> list[int]:
    """``cu_num_logits`` of a vocabulary-wide kernel: every request owns at least its bonus row."""
    cu = _request_offsets(k, a)
    for row, end in zip(cu[:-1], cu[1:]):
        require(end > row, k, "cu_num_logits_ptr", "must give every request at least its bonus row")
    return cu


# -- K12 -------------------------------------------------------------------------------------------
def _flatten_preconditions(a: Mapping[str, Any]) -> None:
    k = K12
    cu = _request_offsets(k, a)
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

# -- the vocabulary-wide kernels: shared checks ------------------------------------------------------
def is_bonus(local_pos: torch.Tensor, n: int) -> torch.Tensor:
    """Row i is a request's bonus row when it is the last row or the next row starts a request."""
    nxt = torch.cat([local_pos[1:n].to(I64), torch.zeros(1, dtype=I64)])[:n]
    return nxt == 0


def _float_cells(k: str, name: str, t: torch.Tensor, starts: list[int], width: int) -> torch.Tensor:
    """The float32 values of ``width`` elements from each flat start (Python ints: a huge stride
    never wraps), after checking they exist, hold no NaN and no +inf (C30)."""
    if not starts or width == 0:
        return torch.zeros((len(starts), width), dtype=F32)
    span = t.numel()
    for at in starts:
        require(0 <= at <= span - width, k, name, f"must hold {width} elements from flat index {at} ({span} elements)")
    vals = t.reshape(-1)[torch.tensor(starts, dtype=I64)[:, None] + torch.arange(width)[None, :]].to(F32)
    bad = torch.isnan(vals) | (vals == float("inf"))
    if bool(bad.any()):
        r, c = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"{k}: '{name}' must hold finite values or -inf in the cells read (C30); "
                         f"flat index {starts[r] + c} holds {float(vals[r, c])}")
    return vals


def _need_draft_cells(k: str, a: Mapping[str, Any], places: list[tuple[int, int, int]], t: torch.Tensor,
                      width: int) -> torch.Tensor:
    """``width`` draft logits from each (slot, step, column) exist, are finite or -inf, and stay
    below +inf once divided by their temperature ``t`` (C30); returns them divided."""
    s0, s1 = a["draft_logits_stride_0"], a["draft_logits_stride_1"]
    at_least(k, "draft_logits_stride_0", s0, 0)
    at_least(k, "draft_logits_stride_1", s1, 0)
    vals = _float_cells(k, "draft_logits_ptr", a["draft_logits_ptr"], [s * s0 + st * s1 + c for s, st, c in places], width)
    scaled = vals / t[:, None]  # float32, rounded once: div_rn
    require(not bool((scaled == float("inf")).any()), k, "draft_logits_ptr",
            "divided by the temperature must stay below +inf (C30)")
    return scaled


def _need_cells(k: str, name: str, t: torch.Tensor, rows: torch.Tensor, stride: int, width: int, written: bool = False) -> None:
    # An output's rows are disjoint (C31 within one buffer): rows that overlap race in Triton.
    if written and rows.numel() > 1 and width:
        require(stride >= width, k, name, f"must have rows {width} cells apart or more (rows written may not overlap), row stride {stride}")
    if rows.numel() and width:
        last = int(rows.max()) * stride + width
        require(stride >= 0 and last <= t.numel(), k, name,
                f"must hold {width} cells of row {int(rows.max())} at row stride {stride} ({t.numel()} elements)")


def _block_preconditions(k: str, a: Mapping[str, Any]) -> None:
    at_least(k, "vocab_size", a["vocab_size"], 0)
    power_of_two(k, "BLOCK_SIZE", a["BLOCK_SIZE"])
    require(a["BLOCK_SIZE"] <= MAX_BLOCK, k, "BLOCK_SIZE", f"must be at most {MAX_BLOCK} (C29: exact tile sums)")
    # Column indices are int32 in every tile (vLLM's are too): the last tile's must not wrap.
    require(a["vocab_size"] <= (1 << 31) - a["BLOCK_SIZE"], k, "vocab_size",
            f"must be at most 2^31 - BLOCK_SIZE = {(1 << 31) - a['BLOCK_SIZE']} (columns are indexed in int32)")


def _temperatures(k: str, a: Mapping[str, Any], slots: torch.Tensor, slots_name: str = "expanded_idx_mapping_ptr") -> torch.Tensor:
    """The float32 temperatures at ``slots`` (read from ``slots_name``), each 0 or finite and > 0."""
    temp = a["temp_ptr"]
    if slots.numel():
        require(int(slots.min()) >= 0 and int(slots.max()) < temp.numel(), k, slots_name,
                f"must hold state slots in [0, {temp.numel()}) (temp_ptr's length)")
    t = temp[slots].to(F32) if slots.numel() else torch.zeros(0, dtype=F32)
    require(bool(((t == 0) | ((t > 0) & torch.isfinite(t))).all()), k, "temp_ptr",
            "must hold temperatures that are 0 (greedy) or finite and > 0 at the rows' slots")
    return t


# -- K13 -------------------------------------------------------------------------------------------
def stats_rows(a: Mapping[str, Any]) -> torch.Tensor:
    """The rows K13 computes: every row but the bonus rows."""
    n = a["num_logits"]
    return (~is_bonus(a["expanded_local_pos_ptr"], n)).nonzero().flatten()


def _stats_preconditions(a: Mapping[str, Any]) -> None:
    k, n, v = K13, a["num_logits"], a["vocab_size"]
    at_least(k, "num_logits", n, 0)
    _block_preconditions(k, a)
    for name in ("expanded_idx_mapping_ptr", "expanded_local_pos_ptr"):
        require_length(k, name, a[name], n)
    rows = stats_rows(a)
    if rows.numel() == 0 or v == 0:
        return
    nb = cdiv(v, a["BLOCK_SIZE"])
    slots = a["expanded_idx_mapping_ptr"][rows].to(I64)
    t = _temperatures(k, a, slots)
    outputs = ("target_local_argmax", "target_local_max", "target_local_sumexp")
    for name in outputs + (("draft_local_max", "draft_local_sumexp") if a["HAS_DRAFT_LOGITS"] else ()):
        at_least(k, f"{name}_stride", a[f"{name}_stride"], 0)
        _need_cells(k, f"{name}_ptr", a[f"{name}_ptr"], rows, a[f"{name}_stride"], nb, written=True)
    at_least(k, "target_logits_stride", a["target_logits_stride"], 0)
    _float_cells(k, "target_logits_ptr", a["target_logits_ptr"], [i * a["target_logits_stride"] for i in rows.tolist()], v)
    if a["HAS_DRAFT_LOGITS"]:
        steps = a["expanded_local_pos_ptr"][rows].to(I64)
        require(int(steps.min()) >= 0, k, "expanded_local_pos_ptr", "must hold local positions >= 0")
        random = t > 0
        places = [(s, st, 0) for s, st, rand in zip(slots.tolist(), steps.tolist(), random.tolist()) if rand]
        _need_draft_cells(k, a, places, t[random], v)


def _explain_stats(a: Mapping[str, Any], output: str, index: int) -> str:
    stride = a[output.removesuffix("_ptr") + "_stride"] or 1
    i, b = divmod(index, stride)
    if i >= a["num_logits"]:
        return f"cell {index} lies past every row: it must stay untouched"
    s = item(a["expanded_idx_mapping_ptr"], i)
    return (f"row {i} (step {item(a['expanded_local_pos_ptr'], i)}, slot {s}, temperature {item(a['temp_ptr'], s)}), "
            f"tile {b} of {a['BLOCK_SIZE']} columns")


def _stats_rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    return "C29 exact tile sum" if "sumexp" in output else "MRV2 tile max"


def _row_stats(name: str, out: str, doc: str) -> tuple[Any, ...]:
    return (ptr(f"{name}_ptr", (F32,) if out == "f" else INT, F32 if out == "f" else I64, doc, role=Role.OUT, ndim=(1, 2)),
            scalar(f"{name}_stride", "row stride"))


def _target_logits() -> tuple[Any, ...]:
    return (ptr("target_logits_ptr", LOGITS, F32, "[NL, V_t] target logits (finite or -inf, C30)", ndim=(2,)),
            scalar("target_logits_stride", "row stride of target_logits"))


def _draft_logits(optional: bool) -> tuple[Any, ...]:
    return (ptr("draft_logits_ptr", LOGITS, F32, "[max_num_reqs, K, V_d] pre-temperature draft logits"
                + (", or None" if optional else ""), optional=optional, ndim=(3,)),
            scalar("draft_logits_stride_0", "slot stride (0 without draft logits)"),
            scalar("draft_logits_stride_1", "step stride (0 without draft logits)"))


# vLLM 0.32.0's parameter lists of K13, K15 and K16 (v1/worker/gpu/spec_decode/rejection_sampler_utils.py):
# 0.33.0 bounds the rows by num_logits instead of num_speculative_steps, and K16 gained FLy's entropy gate.
_ROWS_BY_STEPS = "the rows were bounded by num_speculative_steps; 0.33.0 passes num_logits"
_EARLIER_K13 = (Earlier("0.32.0", ('target_local_argmax_ptr', 'target_local_argmax_stride', 'target_local_max_ptr', 'target_local_max_stride', 'target_local_sumexp_ptr', 'target_local_sumexp_stride', 'draft_local_max_ptr', 'draft_local_max_stride', 'draft_local_sumexp_ptr', 'draft_local_sumexp_stride', 'target_logits_ptr', 'target_logits_stride', 'draft_logits_ptr', 'draft_logits_stride_0', 'draft_logits_stride_1', 'expanded_idx_mapping_ptr', 'expanded_local_pos_ptr', 'temp_ptr', 'vocab_size', 'num_speculative_steps', 'BLOCK_SIZE', 'HAS_DRAFT_LOGITS',), _ROWS_BY_STEPS),)
_EARLIER_K15 = (Earlier("0.32.0", ('local_residual_mass_ptr', 'local_residual_mass_stride', 'cumulative_log_p_ptr', 'target_logits_ptr', 'target_logits_stride', 'target_local_max_ptr', 'target_local_max_stride', 'target_local_sumexp_ptr', 'target_local_sumexp_stride', 'draft_logits_ptr', 'draft_logits_stride_0', 'draft_logits_stride_1', 'draft_local_max_ptr', 'draft_local_max_stride', 'draft_local_sumexp_ptr', 'draft_local_sumexp_stride', 'draft_sampled_ptr', 'expanded_idx_mapping_ptr', 'expanded_local_pos_ptr', 'temp_ptr', 'vocab_size', 'num_speculative_steps', 'vocab_num_blocks', 'BLOCK_SIZE', 'PADDED_VOCAB_NUM_BLOCKS',), _ROWS_BY_STEPS),)
_FLY = ("fly_entropy_ptr", "fly_entropy_threshold", "FLY_WINDOW_SIZE")


def _bind_k16_0_32(a: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM 0.32.0's launch of K16: the contract's arguments without FLy's, which it does not take."""
    return {k: v for k, v in a.items() if k not in _FLY}


def _k16_predates_0_32(a: Mapping[str, Any]) -> str | None:
    """0.33.0 added FLy's window, and block verification's uniform per draft step (spec_step_seed of
    the request's seed and the step; 0.32.0 draws every step from the request's seed)."""
    if a["FLY_WINDOW_SIZE"] > 0:
        return "C33's FLy window (FLY_WINDOW_SIZE > 0)"
    if a["USE_BLOCK_VERIFICATION"] and any(not q.greedy and q.drafts for q in requests(a)):
        return "block verification's uniform per draft step (spec_step_seed)"
    return None


_EARLIER_K16 = (Earlier("0.32.0", ('sampled_ptr', 'sampled_stride', 'rejected_steps_ptr', 'target_rejected_logsumexp_ptr', 'draft_rejected_logsumexp_ptr', 'target_logits_ptr', 'target_logits_stride', 'target_local_argmax_ptr', 'target_local_argmax_stride', 'target_local_max_ptr', 'target_local_max_stride', 'target_local_sumexp_ptr', 'target_local_sumexp_stride', 'draft_sampled_ptr', 'draft_logits_ptr', 'draft_logits_stride_0', 'draft_logits_stride_1', 'draft_local_max_ptr', 'draft_local_max_stride', 'draft_local_sumexp_ptr', 'draft_local_sumexp_stride', 'cu_num_logits_ptr', 'idx_mapping_ptr', 'temp_ptr', 'seed_ptr', 'pos_ptr', 'synthetic_conditional_rates_ptr', 'cumulative_log_p_ptr', 'local_residual_mass_ptr', 'local_residual_mass_stride', 'vocab_num_blocks', 'PADDED_VOCAB_NUM_BLOCKS', 'HAS_DRAFT_LOGITS', 'SYNTHETIC_MODE', 'USE_BLOCK_VERIFICATION',),
                        "no FLy entropy gate (fly_entropy_ptr, fly_entropy_threshold, FLY_WINDOW_SIZE came in 0.33.0)",
                        _bind_k16_0_32, _k16_predates_0_32),)


LOGITS_STATS = KernelSpec(
    name=K13,
    family="mrv2",
    earlier=_EARLIER_K13,
    qualname=f"{_UTILS}.{K13}",
    params=(
        *_row_stats("target_local_argmax", "i", "[NL, NB] greedy rows: the first index of each tile's maximum"),
        *_row_stats("target_local_max", "f", "[NL, NB] each tile's maximum target logit"),
        *_row_stats("target_local_sumexp", "f", "[NL, NB] random rows: sum of exp(x - tile max) (C29)"),
        *_row_stats("draft_local_max", "f", "[NL, NB] random rows with draft logits: the tile's maximum of draft / t"),
        *_row_stats("draft_local_sumexp", "f", "[NL, NB] ... and its sum of exponentials"),
        *_target_logits(),
        *_draft_logits(optional=True),
        ptr("expanded_idx_mapping_ptr", INT, I64, "[NL] the state slot of each row"),
        ptr("expanded_local_pos_ptr", INT, I32, "[NL] the row's step inside its request"),
        ptr("temp_ptr", (F32,), F32, "[max_num_reqs] temperature per slot; 0 is greedy"),
        scalar("vocab_size", "V = min(V_t, V_d): the columns read"),
        scalar("num_logits", "NL"),
        constexpr("BLOCK_SIZE", "tile width (8192 at the call site)"),
        constexpr("HAS_DRAFT_LOGITS", "draft_logits_ptr is a tensor"),
    ),
    grid=lambda a: (a["num_logits"], cdiv(a["vocab_size"], a["BLOCK_SIZE"])),
    preconditions=_stats_preconditions,
    flags=(Flag("HAS_DRAFT_LOGITS", "draft_logits_ptr", lambda x: x is not None, "draft_logits_ptr is a tensor"),),
    explain=_explain_stats,
    rule=_stats_rule,
    doc="MRV2: per row and vocabulary tile, the target (and draft) maximum, argmax for greedy rows, and sum of exponentials",
)

# -- log-probabilities from tile statistics (K14–K17) ------------------------------------------------
def _padded_blocks(k: str, a: Mapping[str, Any]) -> int:
    nb, padded = a["vocab_num_blocks"], a["PADDED_VOCAB_NUM_BLOCKS"]
    at_least(k, "vocab_num_blocks", nb, 1)
    power_of_two(k, "PADDED_VOCAB_NUM_BLOCKS", padded)
    require(padded >= nb, k, "PADDED_VOCAB_NUM_BLOCKS", f"must be at least vocab_num_blocks={nb}")
    return nb


def _need_stats(k: str, a: Mapping[str, Any], side: str, rows: torch.Tensor, nb: int) -> None:
    """Rows' tile statistics (``side`` target or draft) exist, hold no NaN, sums >= 0 and finite,
    and each row has a tile above -inf: its log-sum-exp is a number (C30)."""
    if rows.numel() == 0:
        return
    for stat in ("max", "sumexp"):
        name = f"{side}_local_{stat}"
        at_least(k, f"{name}_stride", a[f"{name}_stride"], 0)
        _need_cells(k, f"{name}_ptr", a[f"{name}_ptr"], rows, a[f"{name}_stride"], nb)
    cols = torch.arange(nb)
    m = a[f"{side}_local_max_ptr"].reshape(-1)[rows[:, None] * a[f"{side}_local_max_stride"] + cols]
    se = a[f"{side}_local_sumexp_ptr"].reshape(-1)[rows[:, None] * a[f"{side}_local_sumexp_stride"] + cols]
    require(not bool((m.isnan() | (m == float("inf"))).any()), k, f"{side}_local_max_ptr",
            "must hold finite maxima or -inf in the rows read (C30)")
    require(bool(((se >= 0) & torch.isfinite(se)).all()), k, f"{side}_local_sumexp_ptr",
            "must hold finite sums >= 0 in the rows read (C30)")
    require(bool((m > float("-inf")).any(1).all()), k, f"{side}_local_max_ptr",
            "must have a tile above -inf in every row read (a log-sum-exp of nothing is not a number)")


def row_logsumexp(a: Mapping[str, Any], side: str, row: int, nb: int) -> torch.Tensor:
    """The C29 log-sum-exp of logits row ``row`` from its ``side`` (target or draft) tile statistics."""
    m = a[f"{side}_local_max_ptr"].reshape(-1)[row * a[f"{side}_local_max_stride"] :][:nb]
    se = a[f"{side}_local_sumexp_ptr"].reshape(-1)[row * a[f"{side}_local_sumexp_stride"] :][:nb]
    return logsumexp(m, se)


def _need_log_probs(k: str, a: Mapping[str, Any], side: str, rows: list[int], vals: torch.Tensor, nb: int) -> None:
    """Each row's logits read (``vals``, one row each, already divided by the temperature for the
    draft) lie at or below the row's log-sum-exp: statistics of these logits (K13's) guarantee it,
    and every probability the kernel forms then lies in [0, 1]."""
    for j, row in enumerate(rows):
        lse = row_logsumexp(a, side, row, nb)
        if bool((vals[j] > lse).any()):
            raise ValueError(f"{k}: '{side}_local_max_ptr' and '{side}_local_sumexp_ptr' must be the statistics of the "
                             f"{side} logits read: row {row}'s log-sum-exp {float(lse)} lies below its logit "
                             f"{float(vals[j].max())}")


# -- K14 -------------------------------------------------------------------------------------------
def cumulative_steps(a: Mapping[str, Any]) -> list[tuple[int, int, int, int]]:
    """(request, slot, row, draft token) of every step K14 walks: the draft rows of random requests."""
    cu = a["cu_num_logits_ptr"].to(I64).tolist()
    slots = a["idx_mapping_ptr"].to(I64).tolist()
    drafts = a["draft_sampled_ptr"].reshape(-1)
    out = []
    for r in range(len(cu) - 1):
        if float(a["temp_ptr"][slots[r]]) == 0.0:
            continue
        for i in range(cu[r], cu[r + 1] - 1):
            out.append((r, slots[r], i, int(drafts[i + 1])))
    return out


def _cumulative_preconditions(a: Mapping[str, Any]) -> None:
    k = K14
    cu = _bonus_offsets(k, a)
    r = len(cu) - 1
    require_length(k, "idx_mapping_ptr", a["idx_mapping_ptr"], r)
    nb = _padded_blocks(k, a)
    if r == 0:
        return
    _temperatures(k, a, a["idx_mapping_ptr"][:r].to(I64), "idx_mapping_ptr")
    require_length(k, "draft_sampled_ptr", a["draft_sampled_ptr"], cu[-1])
    require_length(k, "cumulative_log_p_ptr", a["cumulative_log_p_ptr"], cu[-1])
    steps = [(s, i, d) for _, s, i, d in cumulative_steps(a) if d >= 0]
    if not steps:
        return
    rows = torch.tensor([i for _, i, _ in steps], dtype=I64)
    _need_stats(k, a, "target", rows, nb)
    at_least(k, "target_logits_stride", a["target_logits_stride"], 0)
    stride = a["target_logits_stride"]
    _float_cells(k, "target_logits_ptr", a["target_logits_ptr"], [i * stride + d for _, i, d in steps], 1)
    if a["HAS_DRAFT_LOGITS"]:
        _need_stats(k, a, "draft", rows, nb)
        places = [(s, i - cu[r], d) for r, s, i, d in cumulative_steps(a) if d >= 0]
        t = a["temp_ptr"][torch.tensor([s for s, _, _ in places], dtype=I64)].to(F32)
        _need_draft_cells(k, a, places, t, 1)


def _stats_params(side: str) -> tuple[Any, ...]:
    return (ptr(f"{side}_local_max_ptr", (F32,), F32, f"[NL, NB] {side} tile maxima (K13)", ndim=(1, 2)),
            scalar(f"{side}_local_max_stride"),
            ptr(f"{side}_local_sumexp_ptr", (F32,), F32, f"[NL, NB] {side} tile sums of exponentials (K13)", ndim=(1, 2)),
            scalar(f"{side}_local_sumexp_stride"))


CUMULATIVE_LOG_P = KernelSpec(
    name=K14,
    family="mrv2",
    qualname=f"{_UTILS}.{K14}",
    params=(
        ptr("cumulative_log_p_ptr", (F32,), F32, "[NL] out: min(0, running sum of log p - log q) at each draft row",
            role=Role.OUT),
        *_target_logits(),
        *_stats_params("target")[:4],
        ptr("draft_sampled_ptr", INT, I32, "[NL] row i + 1 holds draft i; -1 is a placeholder"),
        *_draft_logits(optional=True),
        *_stats_params("draft"),
        ptr("cu_num_logits_ptr", INT, I32, "[R+1] exclusive row offsets"),
        ptr("idx_mapping_ptr", INT, I64, "[R] the state slot of each request"),
        ptr("temp_ptr", (F32,), F32, "[max_num_reqs] temperature per slot; 0 is greedy (skipped)"),
        scalar("vocab_num_blocks", "NB"),
        constexpr("PADDED_VOCAB_NUM_BLOCKS", "next power of two of NB"),
        constexpr("HAS_DRAFT_LOGITS", "draft_logits_ptr is a tensor"),
    ),
    grid=lambda a: (max(a["cu_num_logits_ptr"].numel() - 1, 0),),
    preconditions=_cumulative_preconditions,
    flags=(Flag("HAS_DRAFT_LOGITS", "draft_logits_ptr", lambda x: x is not None, "draft_logits_ptr is a tensor"),),
    doc="MRV2 block verification: each random request's running min(0, sum of log p(d) - log q(d)) over its drafts",
)


# -- K15 -------------------------------------------------------------------------------------------
def residual_rows(a: Mapping[str, Any]) -> list[int]:
    """The rows K15 fills: draft rows past a request's first (block verification looks one step
    ahead), not bonus rows, whose own draft is not a placeholder, of random requests."""
    n = a["num_logits"]
    local = a["expanded_local_pos_ptr"][:n].to(I64)
    bonus = is_bonus(local, n)
    drafts = a["draft_sampled_ptr"].reshape(-1)
    temp, slots = a["temp_ptr"], a["expanded_idx_mapping_ptr"]
    return [i for i in range(n) if int(local[i]) != 0 and not bool(bonus[i]) and int(drafts[i + 1]) >= 0
            and float(temp[int(slots[i])]) != 0.0]


def _vocab_blocks(k: str, a: Mapping[str, Any]) -> int:
    """The tiling of a vocabulary-wide kernel: ``vocab_num_blocks`` tiles of ``BLOCK_SIZE`` over ``vocab_size``."""
    at_least(k, "vocab_size", a["vocab_size"], 1)
    _block_preconditions(k, a)
    nb = _padded_blocks(k, a)
    require(nb == cdiv(a["vocab_size"], a["BLOCK_SIZE"]), k, "vocab_num_blocks",
            f"must be cdiv(vocab_size, BLOCK_SIZE) = {cdiv(a['vocab_size'], a['BLOCK_SIZE'])}")
    return nb


def _residual_preconditions(a: Mapping[str, Any]) -> None:
    k, n = K15, a["num_logits"]
    at_least(k, "num_logits", n, 0)
    nb = _vocab_blocks(k, a)
    v = a["vocab_size"]
    for name in ("expanded_idx_mapping_ptr", "expanded_local_pos_ptr", "draft_sampled_ptr"):
        require_length(k, name, a[name], n)
    if n == 0:
        return
    local = a["expanded_local_pos_ptr"][:n].to(I64)
    require(int(local.min()) >= 0, k, "expanded_local_pos_ptr", "must hold local positions >= 0")
    candidates = [i for i in range(n) if int(local[i]) != 0 and not bool(is_bonus(local, n)[i])
                  and int(a["draft_sampled_ptr"][i + 1]) >= 0]
    _temperatures(k, a, a["expanded_idx_mapping_ptr"][candidates].to(I64))
    rows = residual_rows(a)
    if not rows:
        return
    rows_t = torch.tensor(rows, dtype=I64)
    # A later step reads the row before it (K14's log-ratio): row 0 has none (a Python index of -1
    # would read the last row; the engine's kernel reads before the buffer).
    require(min(rows) >= 1, k, "expanded_local_pos_ptr", "must be 0 at row 0 when row 0 is read: a later step reads the row before it")
    at_least(k, "local_residual_mass_stride", a["local_residual_mass_stride"], 0)
    _need_cells(k, "local_residual_mass_ptr", a["local_residual_mass_ptr"], rows_t, a["local_residual_mass_stride"], nb, written=True)
    require_length(k, "cumulative_log_p_ptr", a["cumulative_log_p_ptr"], max(rows))
    prefix = a["cumulative_log_p_ptr"][rows_t - 1]
    require(bool((prefix <= 0).all()), k, "cumulative_log_p_ptr",
            "must hold log-ratios <= 0 (K14's running min(., 0)), no NaN, at the rows before those read")
    for side in ("target", "draft"):
        _need_stats(k, a, side, rows_t, nb)
    at_least(k, "target_logits_stride", a["target_logits_stride"], 0)
    target = _float_cells(k, "target_logits_ptr", a["target_logits_ptr"], [i * a["target_logits_stride"] for i in rows], v)
    slots = a["expanded_idx_mapping_ptr"][rows_t].to(I64)
    places = [(int(s), int(local[i]), 0) for s, i in zip(slots.tolist(), rows)]
    draft = _need_draft_cells(k, a, places, a["temp_ptr"][slots].to(F32), v)
    _need_log_probs(k, a, "target", rows, target, nb)
    _need_log_probs(k, a, "draft", rows, draft, nb)


LOCAL_RESIDUAL_MASS = KernelSpec(
    name=K15,
    family="mrv2",
    earlier=_EARLIER_K15,
    qualname=f"{_UTILS}.{K15}",
    params=(
        *_row_stats("local_residual_mass", "f", "[NL, NB] out: each tile's sum of max(p_prev * p(x) - q(x), 0) (C29)"),
        ptr("cumulative_log_p_ptr", (F32,), F32, "[NL] K14's running log-ratio; row i reads row i - 1"),
        *_target_logits(),
        *_stats_params("target"),
        *_draft_logits(optional=False),
        *_stats_params("draft"),
        ptr("draft_sampled_ptr", INT, I32, "[NL] row i + 1 holds draft i; -1 is a placeholder"),
        ptr("expanded_idx_mapping_ptr", INT, I64, "[NL] the state slot of each row"),
        ptr("expanded_local_pos_ptr", INT, I32, "[NL] the row's step inside its request"),
        ptr("temp_ptr", (F32,), F32, "[max_num_reqs] temperature per slot; 0 is greedy (skipped)"),
        scalar("vocab_size", "V = min(V_t, V_d)"),
        scalar("num_logits", "NL"),
        scalar("vocab_num_blocks", "NB = cdiv(V, BLOCK_SIZE)"),
        constexpr("BLOCK_SIZE", "tile width (8192 at the call site)"),
        constexpr("PADDED_VOCAB_NUM_BLOCKS", "next power of two of NB"),
    ),
    grid=lambda a: (a["num_logits"], a["vocab_num_blocks"]),
    preconditions=_residual_preconditions,
    rule=lambda a, output, index, kind: "C29 exact tile sum",
    doc="MRV2 block verification with draft logits: per row and tile, the residual mass max(p_prev * p - q, 0)",
)


# -- K16 -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    """One request as K16 and K17 walk it: logits rows ``start .. start + drafts`` (the last its
    bonus row), state slot ``slot``, temperature ``temp`` (float32; 0 is greedy)."""

    index: int
    slot: int
    start: int
    drafts: int
    temp: float

    @property
    def greedy(self) -> bool:
        return self.temp == 0.0


def requests(a: Mapping[str, Any]) -> list[Request]:
    cu = a["cu_num_logits_ptr"].to(I64).tolist()
    slots = a["idx_mapping_ptr"].to(I64).tolist()
    temp = a["temp_ptr"]
    return [Request(r, slots[r], cu[r], cu[r + 1] - cu[r] - 1, float(temp[slots[r]])) for r in range(len(cu) - 1)]


def _rejection_preconditions(a: Mapping[str, Any]) -> None:
    k = K16
    fly, synthetic, block = a["FLY_WINDOW_SIZE"], a["SYNTHETIC_MODE"], a["USE_BLOCK_VERIFICATION"]
    at_least(k, "FLY_WINDOW_SIZE", fly, 0)
    require(not (synthetic and block), k, "USE_BLOCK_VERIFICATION",
            "excludes SYNTHETIC_MODE (rejection_sample asserts it)")
    require(not (fly and (synthetic or block)), k, "FLY_WINDOW_SIZE",
            "must be 0 with SYNTHETIC_MODE or USE_BLOCK_VERIFICATION (rejection_sample asserts it)")
    has_draft = a["HAS_DRAFT_LOGITS"]
    residual = a["local_residual_mass_ptr"] is not None
    require(residual == (block and has_draft), k, "local_residual_mass_ptr",
            "must be a tensor exactly with USE_BLOCK_VERIFICATION and draft logits (K15's output), else None")
    cu = _bonus_offsets(k, a)
    nr = len(cu) - 1
    require_length(k, "idx_mapping_ptr", a["idx_mapping_ptr"], nr)
    nb = _padded_blocks(k, a)
    for name in ("rejected_steps_ptr", "target_rejected_logsumexp_ptr", "draft_rejected_logsumexp_ptr"):
        require_length(k, name, a[name], nr)
    if nr == 0:
        return
    slots = a["idx_mapping_ptr"][:nr].to(I64)
    _temperatures(k, a, slots, "idx_mapping_ptr")
    require(int(slots.max()) < a["seed_ptr"].numel(), k, "idx_mapping_ptr",
            f"must hold state slots in [0, {a['seed_ptr'].numel()}) (seed_ptr's length)")
    nl = cu[-1]
    for name in ("draft_sampled_ptr", "pos_ptr"):
        require_length(k, name, a[name], nl)
    reqs = requests(a)
    widest = max(q.drafts for q in reqs)
    if widest == 0:
        return
    at_least(k, "sampled_stride", a["sampled_stride"], widest)  # requests write disjoint cells
    last = max(q.index * a["sampled_stride"] + q.drafts - 1 for q in reqs if q.drafts)
    require(last < a["sampled_ptr"].numel(), k, "sampled_ptr",
            f"must hold flat index {last} (row stride {a['sampled_stride']}): every request's drafts")
    if synthetic:
        require_length(k, "synthetic_conditional_rates_ptr", a["synthetic_conditional_rates_ptr"], widest)
    if fly:
        require_length(k, "fly_entropy_ptr", a["fly_entropy_ptr"], nl)
    tokens = a["draft_sampled_ptr"][:nl].to(I64)
    sampled = a["sampled_ptr"]
    for v in (int(tokens.min()), int(tokens.max())):
        if v >= 0:
            require_fits(k, "draft_sampled_ptr", v, "sampled_ptr", sampled)
    greedy_rows = [q.start + i for q in reqs if q.greedy for i in range(q.drafts)]
    if greedy_rows:
        rows_t = torch.tensor(greedy_rows, dtype=I64)
        for stat in ("max", "argmax"):
            at_least(k, f"target_local_{stat}_stride", a[f"target_local_{stat}_stride"], 0)
            _need_cells(k, f"target_local_{stat}_ptr", a[f"target_local_{stat}_ptr"], rows_t,
                        a[f"target_local_{stat}_stride"], nb)
        cols = torch.arange(nb)
        argmax = a["target_local_argmax_ptr"].reshape(-1)[rows_t[:, None] * a["target_local_argmax_stride"] + cols]
        for v in (int(argmax.min()), int(argmax.max())):
            require_fits(k, "target_local_argmax_ptr", v, "sampled_ptr", sampled)
    # What the random requests may read, whichever steps their draws verify.
    random = [q for q in reqs if not q.greedy and q.drafts]
    rows = [q.start + i for q in random for i in range(q.drafts)]
    if rows:
        rows_t = torch.tensor(rows, dtype=I64)
        _need_stats(k, a, "target", rows_t, nb)
        if has_draft:
            _need_stats(k, a, "draft", rows_t, nb)
    # Tokens whose logits are read (flat: row * stride + token, C4): every valid draft of a random
    # request (its step's log-ratio, or the next step's one-hot residual mass), and of a greedy one
    # under FLy (can it defer?).
    read = [(q, i, int(tokens[q.start + i + 1])) for q in reqs if not q.greedy or fly for i in range(q.drafts)]
    read = [(q, i, d) for q, i, d in read if d >= 0]
    if read:
        at_least(k, "target_logits_stride", a["target_logits_stride"], 0)
        _float_cells(k, "target_logits_ptr", a["target_logits_ptr"],
                     [(q.start + i) * a["target_logits_stride"] + d for q, i, d in read], 1)
        places = [(q.slot, i, d) for q, i, d in read if not q.greedy and not block]
        if has_draft and places:
            t = torch.tensor([q.temp for q, _, _ in read if not q.greedy and not block], dtype=F32)
            _need_draft_cells(k, a, places, t, 1)
    if block and random:
        require_length(k, "cumulative_log_p_ptr", a["cumulative_log_p_ptr"], nl)
        ratio = a["cumulative_log_p_ptr"][rows_t]
        require(bool((ratio <= 0).all()), k, "cumulative_log_p_ptr",
                "must hold log-ratios <= 0 (K14's running min(., 0)), no NaN, at the random requests' draft rows")
        if has_draft:
            # The next step's masses, read where that step's draft is no placeholder (K15 fills those rows only).
            ahead = torch.tensor([q.start + i for q in random for i in range(1, q.drafts) if int(tokens[q.start + i + 1]) >= 0],
                                 dtype=I64)
            at_least(k, "local_residual_mass_stride", a["local_residual_mass_stride"], 0)
            _need_cells(k, "local_residual_mass_ptr", a["local_residual_mass_ptr"], ahead, a["local_residual_mass_stride"], nb)
            if ahead.numel():
                mass = a["local_residual_mass_ptr"].reshape(-1)[ahead[:, None] * a["local_residual_mass_stride"] + torch.arange(nb)]
                require(bool(((mass >= 0) & torch.isfinite(mass)).all()), k, "local_residual_mass_ptr",
                        "must hold finite masses >= 0 (K15's) at the rows read")


def _rejection_rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    if a["USE_BLOCK_VERIFICATION"]:
        return "MRV2 block verification"
    if a["FLY_WINDOW_SIZE"]:
        return "MRV2 FLy window"
    return "MRV2 synthetic acceptance" if a["SYNTHETIC_MODE"] else "MRV2 acceptance test"


def _explain_rejection(a: Mapping[str, Any], output: str, index: int) -> str:
    r = index // (a["sampled_stride"] or 1) if output == "sampled_ptr" else index
    reqs = requests(a)
    if r >= len(reqs):
        return f"cell {index} lies past every request: it must stay untouched"
    q = reqs[r]
    tokens = a["draft_sampled_ptr"].reshape(-1)[q.start + 1 : q.start + q.drafts + 1].tolist()
    return (f"request {r}: slot {q.slot}, temperature {q.temp}, seed {item(a['seed_ptr'], q.slot)}, rows {q.start}.."
            f"{q.start + q.drafts}, drafts {tokens}")


def _optional_f32(name: str, doc: str) -> Any:
    return ptr(name, (F32,), F32, doc, optional=True)


REJECTION = KernelSpec(
    name=K16,
    family="mrv2",
    earlier=_EARLIER_K16,
    qualname=f"{_UTILS}.{K16}",
    params=(
        ptr("sampled_ptr", INT, I64, "[R, K+1] out: each verified step's token (greedy: the target argmax at a "
            "rejection)", role=Role.OUT, ndim=(1, 2)),
        scalar("sampled_stride", "row stride of sampled"),
        ptr("rejected_steps_ptr", INT, I32, "[R] out: the accepted drafts (the step resampled next)", role=Role.OUT),
        ptr("target_rejected_logsumexp_ptr", (F32,), F32, "[R] out: the target log-sum-exp K17 resamples with",
            role=Role.OUT),
        ptr("draft_rejected_logsumexp_ptr", (F32,), F32, "[R] out: the draft log-sum-exp (0 for one-hot drafts)",
            role=Role.OUT),
        *_target_logits(),
        ptr("target_local_argmax_ptr", INT, I64, "[NL, NB] greedy rows: each tile's argmax (K13)", ndim=(1, 2)),
        scalar("target_local_argmax_stride"),
        *_stats_params("target"),
        ptr("draft_sampled_ptr", INT, I32, "[NL] row i + 1 holds draft i; -1 is a placeholder"),
        *_draft_logits(optional=True),
        *_stats_params("draft"),
        ptr("cu_num_logits_ptr", INT, I32, "[R+1] exclusive row offsets"),
        ptr("idx_mapping_ptr", INT, I64, "[R] the state slot of each request"),
        ptr("temp_ptr", (F32,), F32, "[max_num_reqs] temperature per slot; 0 is greedy"),
        ptr("seed_ptr", (I64,), I64, "[max_num_reqs] seed per slot"),
        ptr("pos_ptr", INT, I64, "[NL] the row's position: the uniform's Philox offset"),
        _optional_f32("synthetic_conditional_rates_ptr", "[K] SYNTHETIC_MODE: the acceptance rate per step, or None"),
        _optional_f32("cumulative_log_p_ptr", "[NL] block verification: K14's running log-ratio, or None"),
        ptr("local_residual_mass_ptr", (F32,), F32, "[NL, NB] block verification with draft logits: K15's output",
            optional=True, ndim=(1, 2)),
        scalar("local_residual_mass_stride"),
        _optional_f32("fly_entropy_ptr", "[NL] FLy: the target's entropy per row, or None"),
        real("fly_entropy_threshold", "FLy defers a rejection only at an entropy at least this (float32)"),
        scalar("vocab_num_blocks", "NB"),
        constexpr("PADDED_VOCAB_NUM_BLOCKS", "next power of two of NB"),
        constexpr("HAS_DRAFT_LOGITS", "draft_logits_ptr is a tensor"),
        constexpr("SYNTHETIC_MODE", "accept with the synthetic rates instead of the test"),
        constexpr("USE_BLOCK_VERIFICATION", "block verification (Sun et al., 2024)"),
        constexpr("FLY_WINDOW_SIZE", "FLy: accepted drafts that confirm a deferred rejection (0: off)"),
    ),
    grid=lambda a: (max(a["cu_num_logits_ptr"].numel() - 1, 0),),
    preconditions=_rejection_preconditions,
    flags=(
        Flag("HAS_DRAFT_LOGITS", "draft_logits_ptr", lambda x: x is not None, "draft_logits_ptr is a tensor"),
        Flag("SYNTHETIC_MODE", "synthetic_conditional_rates_ptr", lambda x: x is not None,
             "synthetic_conditional_rates_ptr is a tensor"),
        Flag("USE_BLOCK_VERIFICATION", "cumulative_log_p_ptr", lambda x: x is not None, "cumulative_log_p_ptr is a tensor"),
        Flag("FLY_WINDOW_SIZE", "fly_entropy_ptr", lambda x: x is not None, "positive exactly when fly_entropy_ptr is a tensor"),
    ),
    explain=_explain_rejection,
    rule=_rejection_rule,
    doc="MRV2: verify each request's drafts (greedy, the strict log-ratio test, synthetic rates, block verification "
        "or FLy) and keep what the resample needs",
)


# -- K17 -------------------------------------------------------------------------------------------
# C29: float64 noise is each platform's float64 log twice (libdevice on an H100 was 14 ulps from
# PyTorch); 64 ulps of the largest noise (about 37.4, below 64) is 2^-40.
NOISE64_RTOL = 2.0**-40


@dataclass(frozen=True)
class Resample:
    """What K17 resamples for one request: logits row ``row`` (step ``step`` of its drafts, its
    bonus row when ``bonus``), slot ``slot``, temperature ``temp``, the rejected draft ``rejected``
    (-1 for a placeholder; 0 at the bonus row) and whether it writes (greedy rows rejected at a
    draft keep K16's argmax)."""

    index: int
    row: int
    step: int
    slot: int
    temp: float
    bonus: bool
    rejected: int

    @property
    def writes(self) -> bool:
        return self.temp != 0.0 or self.bonus

    @property
    def residual(self) -> bool:
        """The draft's distribution is taken out of the target's (else: the target's itself)."""
        return self.temp != 0.0 and not self.bonus and self.rejected >= 0


def resamples(a: Mapping[str, Any]) -> list[Resample]:
    cu = a["cu_num_logits_ptr"].to(I64).tolist()
    steps = a["rejected_step_ptr"].to(I64).tolist()
    out = []
    for r in range(len(cu) - 1):
        row = cu[r] + steps[r]
        slot = int(a["expanded_idx_mapping_ptr"][row])
        bonus = row == cu[r + 1] - 1
        rejected = 0 if bonus else int(a["draft_sampled_ptr"][row + 1])
        out.append(Resample(r, row, steps[r], slot, float(a["temp_ptr"][slot]), bonus, rejected))
    return out


def _resample_preconditions(a: Mapping[str, Any]) -> None:
    k = K17
    require(not a["WATERMARK"] and not a["DEDUPLICATE_CONTEXTS"], k, "WATERMARK",
            "must be False: the watermark branch is not specified yet (docs/mrv2.md)")
    for name in ("contexts_ptr", "watermarking_ptr", "watermarking_skip_mask_ptr"):
        require(a[name] is None, k, name, "must be None without WATERMARK")
    at_least(k, "CONTEXT_WIDTH", a["CONTEXT_WIDTH"], 1)
    at_least(k, "vocab_size", a["vocab_size"], 1)
    _block_preconditions(k, a)
    v, nb = a["vocab_size"], cdiv(a["vocab_size"], a["BLOCK_SIZE"])
    cu = _bonus_offsets(k, a)
    nr = len(cu) - 1
    require_length(k, "rejected_step_ptr", a["rejected_step_ptr"], nr)
    if nr == 0:
        return
    steps = a["rejected_step_ptr"][:nr].to(I64)
    room = torch.tensor(cu[1:], dtype=I64) - torch.tensor(cu[:-1], dtype=I64) - 1
    bad = ((steps < 0) | (steps > room)).nonzero()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"{k}: 'rejected_step_ptr' must hold accepted counts in [0, drafts]; request {i} has "
                         f"{int(steps[i])} for {int(room[i])} drafts")
    nl = cu[-1]
    for name in ("expanded_idx_mapping_ptr", "draft_sampled_ptr", "pos_ptr"):
        require_length(k, name, a[name], nl)
    rows = torch.tensor(cu[:-1], dtype=I64) + steps
    slots = a["expanded_idx_mapping_ptr"][rows].to(I64)
    _temperatures(k, a, slots)
    require(int(slots.max()) < a["seed_ptr"].numel(), k, "expanded_idx_mapping_ptr",
            f"must hold state slots in [0, {a['seed_ptr'].numel()}) (seed_ptr's length)")
    writers = [q for q in resamples(a) if q.writes]
    if not writers:
        return
    require_fits(k, "vocab_size", v - 1, "resampled_local_argmax_ptr", a["resampled_local_argmax_ptr"])
    reqs = torch.tensor([q.index for q in writers], dtype=I64)
    for name in ("resampled_local_argmax", "resampled_local_max"):
        at_least(k, f"{name}_stride", a[f"{name}_stride"], 0)
        _need_cells(k, f"{name}_ptr", a[f"{name}_ptr"], reqs, a[f"{name}_stride"], nb, written=True)
    at_least(k, "target_logits_stride", a["target_logits_stride"], 0)
    _float_cells(k, "target_logits_ptr", a["target_logits_ptr"], [q.row * a["target_logits_stride"] for q in writers], v)
    residual = [q for q in writers if q.residual and a["HAS_DRAFT_LOGITS"]]
    if not residual:
        return
    for name in ("target_rejected_logsumexp_ptr", "draft_rejected_logsumexp_ptr"):
        require_length(k, name, a[name], nr)
        lse = a[name][torch.tensor([q.index for q in residual], dtype=I64)]
        require(bool(torch.isfinite(lse).all()), k, name, "must hold finite log-sum-exps (K16's) for the requests resampled")
    _need_draft_cells(k, a, [(q.slot, q.step, 0) for q in residual], torch.tensor([q.temp for q in residual], dtype=F32), v)
    if a["USE_BLOCK_VERIFICATION"]:
        prefix = [q.row - 1 for q in residual if q.step > 0]
        if prefix:
            require_length(k, "cumulative_log_p_ptr", a["cumulative_log_p_ptr"], max(prefix) + 1)
            require(bool((a["cumulative_log_p_ptr"][torch.tensor(prefix, dtype=I64)] <= 0).all()), k, "cumulative_log_p_ptr",
                    "must hold log-ratios <= 0 (K14's running min(., 0)), no NaN, at the rows before those resampled")


def _resample_rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    return "C29 float64 noise" if a["USE_FP64"] else "MRV2 resample"


RESAMPLE = KernelSpec(
    name=K17,
    family="mrv2",
    qualname=f"{_UTILS}.{K17}",
    params=(
        ptr("resampled_local_argmax_ptr", INT, I64, "[R, NBr] out: each tile's winning token", role=Role.OUT, ndim=(1, 2)),
        scalar("resampled_local_argmax_stride", "row stride"),
        ptr("resampled_local_max_ptr", (F32, torch.float64), F32, "[R, NBr] out: each tile's winning score (float64 "
            "with USE_FP64)", role=Role.OUT, ndim=(1, 2), float64_rtol=NOISE64_RTOL),
        scalar("resampled_local_max_stride", "row stride"),
        *_target_logits(),
        ptr("target_rejected_logsumexp_ptr", (F32,), F32, "[R] K16's target log-sum-exp at the resampled row"),
        *_draft_logits(optional=True),
        ptr("draft_rejected_logsumexp_ptr", (F32,), F32, "[R] K16's draft log-sum-exp"),
        ptr("rejected_step_ptr", INT, I32, "[R] K16's accepted drafts: the step resampled"),
        ptr("cu_num_logits_ptr", INT, I32, "[R+1] exclusive row offsets"),
        ptr("expanded_idx_mapping_ptr", INT, I64, "[NL] the state slot of each row"),
        ptr("draft_sampled_ptr", INT, I32, "[NL] row i + 1 holds draft i; -1 is a placeholder"),
        ptr("temp_ptr", (F32,), F32, "[max_num_reqs] temperature per slot; 0 is greedy"),
        ptr("seed_ptr", (I64,), I64, "[max_num_reqs] seed per slot: the noise's murmur3 key"),
        ptr("pos_ptr", INT, I64, "[NL] the row's position (its low word keys the noise)"),
        _optional_f32("cumulative_log_p_ptr", "[NL] block verification: K14's running log-ratio, or None"),
        ptr("contexts_ptr", INT, I64, "[NL, CONTEXT_WIDTH] watermark contexts (deferred: None)", optional=True, ndim=(2,)),
        scalar("contexts_stride"),
        ptr("watermarking_ptr", (torch.uint8,), torch.uint8, "[max_num_reqs] watermark flags (deferred: None)", optional=True),
        ptr("watermarking_skip_mask_ptr", (torch.uint8,), torch.uint8, "[NL] (deferred: None)", optional=True),
        scalar("watermark_key_0"),
        scalar("watermark_key_1"),
        scalar("vocab_size", "V = min(V_t, V_d)"),
        constexpr("BLOCK_SIZE", "tile width (1024 at the call site)"),
        constexpr("HAS_DRAFT_LOGITS", "draft_logits_ptr is a tensor"),
        constexpr("USE_FP64", "float64 noise and scores"),
        constexpr("USE_BLOCK_VERIFICATION", "scale the target by the joint ratio before the rejection"),
        constexpr("CONTEXT_WIDTH", "watermark context width (1 without)"),
        constexpr("WATERMARK", "the watermark branch (deferred: False)"),
        constexpr("DEDUPLICATE_CONTEXTS", "watermark deduplication (deferred: False)"),
    ),
    grid=lambda a: (max(a["cu_num_logits_ptr"].numel() - 1, 0), cdiv(a["vocab_size"], a["BLOCK_SIZE"])),
    preconditions=_resample_preconditions,
    flags=(
        Flag("HAS_DRAFT_LOGITS", "draft_logits_ptr", lambda x: x is not None, "draft_logits_ptr is a tensor"),
        Flag("USE_FP64", "resampled_local_max_ptr", lambda x: x is not None and x.dtype == torch.float64,
             "resampled_local_max_ptr is float64"),
        Flag("USE_BLOCK_VERIFICATION", "cumulative_log_p_ptr", lambda x: x is not None, "cumulative_log_p_ptr is a tensor"),
    ),
    rule=_resample_rule,
    doc="MRV2: per request and vocabulary tile, the Gumbel-max of the residual (target minus draft) at the rejected "
        "step, or of the target at the bonus row",
)


# 0.30.0 drew its noise from Philox (tl.randint of seed and position, then tl.rand), not murmur3:
# another stream, so its kernel is declared (drift), not bound.
RESAMPLE.earlier = (Earlier("0.30.0", tuple(n for n in RESAMPLE.arg_names if n not in ("watermarking_skip_mask_ptr", "DEDUPLICATE_CONTEXTS")),
                            "Philox Gumbel noise, every watermarked row watermarked (no skip mask, no DEDUPLICATE_CONTEXTS)"),)


# -- K18 -------------------------------------------------------------------------------------------
def insert_rows(a: Mapping[str, Any]) -> list[tuple[int, int, bool]]:
    """(request, accepted count k, writes) per request: K18 inserts at column k unless the request
    is greedy and its row k is not the bonus row (the argmax is already there)."""
    cu = a["cu_num_logits_ptr"].to(I64).tolist()
    ns = a["num_sampled_ptr"].to(I64).tolist()
    slots = a["expanded_idx_mapping_ptr"].to(I64)
    out = []
    for r in range(len(cu) - 1):
        row = cu[r] + ns[r]
        greedy = float(a["temp_ptr"][int(slots[row])]) == 0.0
        out.append((r, ns[r], not greedy or row == cu[r + 1] - 1))
    return out


def _insert_preconditions(a: Mapping[str, Any]) -> None:
    k = K18
    cu = _request_offsets(k, a)
    r = len(cu) - 1
    require_length(k, "num_sampled_ptr", a["num_sampled_ptr"], r)
    nb, padded = a["resample_num_blocks"], a["PADDED_RESAMPLE_NUM_BLOCKS"]
    at_least(k, "resample_num_blocks", nb, 1)
    power_of_two(k, "PADDED_RESAMPLE_NUM_BLOCKS", padded)
    require(padded >= nb, k, "PADDED_RESAMPLE_NUM_BLOCKS", f"must be at least resample_num_blocks={nb}")
    if r == 0:
        return
    ns = a["num_sampled_ptr"][:r].to(I64)
    room = torch.tensor(cu[1:], dtype=I64) - torch.tensor(cu[:-1], dtype=I64) - 1
    bad = ((ns < 0) | (ns > room)).nonzero()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"{k}: 'num_sampled_ptr' must hold accepted counts in [0, drafts]; request {i} has "
                         f"{int(ns[i])} for {int(room[i])} drafts")
    require_fits(k, "num_sampled_ptr", int(ns.max()) + 1, "num_sampled_ptr", a["num_sampled_ptr"])
    rows = torch.tensor(cu[:-1], dtype=I64) + ns
    require(int(rows.max()) < a["expanded_idx_mapping_ptr"].numel(), k, "expanded_idx_mapping_ptr",
            f"must hold the slot of row {int(rows.max())}")
    _temperatures(k, a, a["expanded_idx_mapping_ptr"][rows].to(I64))
    writes = [(req, n) for req, n, w in insert_rows(a) if w]
    if not writes:
        return
    reqs = torch.tensor([req for req, _ in writes], dtype=I64)
    for name in ("resampled_local_max", "resampled_local_argmax"):
        at_least(k, f"{name}_stride", a[f"{name}_stride"], 0)
    _need_cells(k, "resampled_local_max_ptr", a["resampled_local_max_ptr"], reqs, a["resampled_local_max_stride"], nb)
    _need_cells(k, "resampled_local_argmax_ptr", a["resampled_local_argmax_ptr"], reqs, a["resampled_local_argmax_stride"], nb)
    at_least(k, "sampled_stride", a["sampled_stride"], 0)
    last = max(req * a["sampled_stride"] + n for req, n in writes)
    require(last < a["sampled_ptr"].numel(), k, "sampled_ptr", f"must hold flat index {last} (row stride {a['sampled_stride']})")
    argmax = a["resampled_local_argmax_ptr"].reshape(-1)
    for req, _ in writes:
        at = req * a["resampled_local_argmax_stride"]
        vals = argmax[at : at + nb].to(I64)
        for v in (int(vals.min()), int(vals.max())):
            require_fits(k, "resampled_local_argmax_ptr", v, "sampled_ptr", a["sampled_ptr"])


INSERT_RESAMPLED = KernelSpec(
    name=K18,
    family="mrv2",
    qualname=f"{_UTILS}.{K18}",
    params=(
        ptr("sampled_ptr", INT, I64, "[R, K+1] out: the resampled token lands at column num_sampled[r]",
            role=Role.INOUT, ndim=(1, 2)),
        scalar("sampled_stride", "row stride of sampled"),
        ptr("num_sampled_ptr", INT, I32, "[R] in: accepted drafts; out: + 1 (the resampled or bonus token)", role=Role.INOUT),
        ptr("resampled_local_argmax_ptr", INT, I64, "[R, NBr] each tile's winning token", ndim=(1, 2)),
        scalar("resampled_local_argmax_stride", "row stride"),
        ptr("resampled_local_max_ptr", (F32, torch.float64), F32, "[R, NBr] each tile's winning score (NaN: never wins)",
            ndim=(1, 2)),
        scalar("resampled_local_max_stride", "row stride"),
        scalar("resample_num_blocks", "NBr = cdiv(V, 1024)"),
        ptr("cu_num_logits_ptr", INT, I32, "[R+1] exclusive row offsets"),
        ptr("expanded_idx_mapping_ptr", INT, I64, "[NL] the state slot of each row"),
        ptr("temp_ptr", (F32,), F32, "[max_num_reqs] temperature per slot; 0 is greedy"),
        constexpr("PADDED_RESAMPLE_NUM_BLOCKS", "next power of two of resample_num_blocks"),
    ),
    grid=lambda a: (max(a["cu_num_logits_ptr"].numel() - 1, 0),),
    preconditions=_insert_preconditions,
    doc="MRV2: insert each request's resampled (or bonus) token: the winning tile's argmax; count it",
)

SPECS = (GATHER_DRAFT_SAMPLED, FLATTEN_SAMPLED, LOGITS_STATS, CUMULATIVE_LOG_P, LOCAL_RESIDUAL_MASS, REJECTION, RESAMPLE, INSERT_RESAMPLED)
