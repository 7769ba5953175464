"""Contract of vLLM 0.33.0's top-k/top-p mask (docs/topk_topp.md, C35;
``vllm/v1/sample/ops/topk_topp_triton.py``).

``_topk_topp_kernel`` masks, in place, every logit of a row that top-k and then top-p do not keep.
It is persistent: grid ``(programs,)``, program ``pid`` takes rows ``pid, pid + programs, ...``,
each with its own row of the ``BUFFER`` workspace. vLLM's body finds its cut-offs by a pivot
search with an absolute tolerance of 1e-9 and an 18-round cap; specdiff states the cut-offs
exactly (C35), so the result depends on no tile size and no search.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from conformance.contract import (
    Flag,
    KernelSpec,
    Role,
    at_least,
    constexpr,
    power_of_two,
    ptr,
    require,
    require_length,
    scalar,
)
from conformance.kernels._checks import flat_view, item, require_rows

F32, I32, I64 = torch.float32, torch.int32, torch.int64
KERNEL = "_topk_topp_kernel"
_MODULE = "vllm.v1.sample.ops.topk_topp_triton"
TABLE = 200  # vLLM's pivot tables: 200 float32 entries each
MAX_BLOCK = 1 << 16
# C35: a row's mass is an exact integer below 2**53 (V weights of at most 2**32 each).
MAX_VOCAB = 1 << 21


def row_values(a: Mapping[str, Any], r: int) -> torch.Tensor:
    """Row ``r``'s ``VOCAB_SIZE`` logits, as the kernel addresses them (a view)."""
    v, s = a["VOCAB_SIZE"], a["LOGITS_STRIDE_0"]
    return flat_view(a["LOGITS"])[r * s : r * s + v]


def row_steps(a: Mapping[str, Any], r: int) -> tuple[int | None, float | None]:
    """Row ``r``'s k and p; None where its flag leaves K or P unread."""
    return (int(a["K"][r]) if a["TOPK_ENABLED"] else None, float(a["P"][r]) if a["TOPP_ENABLED"] else None)


def stand_in_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """Stand-ins for vLLM's two 200-entry pivot tables (C35 reads neither): the standard normal
    quantiles of their upper percentiles, clamped to the tables' last entry."""
    q = torch.special.ndtri(1.0 - torch.arange(1, TABLE + 1, dtype=torch.float64) / TABLE).clamp(-3.813, 3.813).to(F32)
    return q.clone(), q.clone()


def launch_args(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None, *, programs: int, block: int = 256,
                trunc: int = 128, mask_value: float = float("-inf"), split: bool = False) -> dict[str, Any]:
    """A launch over ``logits`` ([B, V], unit inner stride) as vLLM's ``apply_top_k_top_p_triton``
    makes it: k and p cast to int32 and float32, a workspace row per program, the stand-in tables
    on the logits' device (defaults: vLLM's CPU tiles)."""
    b, v = logits.shape
    pct, cdf = (t.to(logits.device) for t in stand_in_tables())
    return dict(LOGITS=logits, LOGITS_STRIDE_0=logits.stride(0), BUFFER=logits.new_empty(programs, v),
                PERCENTILE_TO_STD_TABLE=pct, NORMAL_CDF_TO_SIGMA_TABLE=cdf, K=None if k is None else k.to(I32),
                P=None if p is None else p.to(F32), BATCH_SIZE=b, VOCAB_SIZE=v, MASK_VALUE=mask_value, BLOCK_SIZE=block,
                BLOCK_SIZE_TRUNC=trunc, TOPK_ENABLED=k is not None, TOPP_ENABLED=p is not None, SPLIT_COVERS_PONLY=split)


def check_buffer(a: Mapping[str, Any]) -> None:
    """The workspace has a row of VOCAB_SIZE per program (when any row is masked)."""
    v, buffer = a["VOCAB_SIZE"], a["BUFFER"]
    if a["BATCH_SIZE"] > 0:
        require(buffer.shape[0] >= 1 and buffer.shape[1] == v, KERNEL, "BUFFER",
                f"must have shape [programs >= 1, VOCAB_SIZE={v}], got {tuple(buffer.shape)}")


def _preconditions(a: Mapping[str, Any]) -> None:
    k = KERNEL
    b, v, s = a["BATCH_SIZE"], a["VOCAB_SIZE"], a["LOGITS_STRIDE_0"]
    at_least(k, "BATCH_SIZE", b, 0)
    at_least(k, "VOCAB_SIZE", v, 1)
    require(v <= MAX_VOCAB, k, "VOCAB_SIZE", f"must be at most {MAX_VOCAB} (C35: a row's mass is exact in float64)")
    for name in ("BLOCK_SIZE", "BLOCK_SIZE_TRUNC"):
        power_of_two(k, name, a[name])
        require(a[name] <= MAX_BLOCK, k, name, f"must be at most {MAX_BLOCK}")
    for name in ("PERCENTILE_TO_STD_TABLE", "NORMAL_CDF_TO_SIGMA_TABLE"):
        require(a[name].numel() == TABLE, k, name, f"must hold vLLM's {TABLE} entries, has {a[name].numel()}")
    if b == 0:
        return
    check_buffer(a)
    # Rows are written: they may not overlap (C31 within one buffer).
    if b > 1:
        require(s >= v, k, "LOGITS_STRIDE_0", f"must be >= VOCAB_SIZE={v} (rows written may not overlap), got {s}")
    require_rows(k, "LOGITS", a["LOGITS"], b, s, v)
    rows = torch.stack([row_values(a, r) for r in range(b)])
    bad = torch.isnan(rows) | (rows == float("inf"))
    if bool(bad.any()):
        r, c = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"{k}: 'LOGITS' must hold finite values or -inf (C30); row {r}, column {c} holds {float(rows[r, c])}")
    if a["TOPK_ENABLED"]:
        require_length(k, "K", a["K"], b)
        top = a["K"][:b]
        require(bool((top >= 1).all()), k, "K", f"must hold k >= 1 in its first BATCH_SIZE={b} entries, got {int(top.min())}")
    if a["TOPP_ENABLED"]:
        require_length(k, "P", a["P"], b)
        p = a["P"][:b]
        require(bool((p > 0).all()), k, "P", "must hold p > 0 (and no NaN) in its first BATCH_SIZE entries")


def _grid(a: Mapping[str, Any]) -> tuple[int, ...]:
    # vLLM launches min(num_sm, B) programs over a BUFFER of that many rows (apply_top_k_top_p_triton).
    return (min(a["BATCH_SIZE"], a["BUFFER"].shape[0]),)


def _explain(a: Mapping[str, Any], output: str, index: int) -> str:
    s, v = a["LOGITS_STRIDE_0"], a["VOCAB_SIZE"]
    r, c = divmod(index, s) if s else (0, index)
    if r >= a["BATCH_SIZE"] or c >= v:
        return f"flat index {index} lies outside every row's {v} columns: it must stay untouched"
    from reference.topk_topp import cutoffs  # the oracle states the cut-offs; imported late (it imports this module)

    x = row_values(a, r)
    k, p = row_steps(a, r)
    finite = int((x > float("-inf")).sum())
    lines = [f"row {r}, column {c}: logit {item(a['LOGITS'], index)!r}; k={k} p={p!r} V={v} finite={finite} "
             f"SPLIT_COVERS_PONLY={a['SPLIT_COVERS_PONLY']}"]
    for stage, (pivot, ties, kept) in cutoffs(x, k, p, bool(a["SPLIT_COVERS_PONLY"])).items():
        lines.append(f"  {stage}: values > {pivot!r} kept, and the first {ties} equal to it in index order ({kept} kept)")
    return "\n".join(lines)


def _rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    return "C35 top-p mass" if a["TOPP_ENABLED"] else "C35 top-k"


def _bytes(a: Mapping[str, Any]) -> int:
    # Every row is read at least once and, when masked, written once.
    return 2 * a["BATCH_SIZE"] * a["VOCAB_SIZE"] * 4


TOPK_TOPP = KernelSpec(
    name=KERNEL,
    family="topk_topp",
    qualname=f"{_MODULE}.{KERNEL}",
    params=(
        ptr("LOGITS", (F32,), F32, "[B, V] float32 logits (finite or -inf), rows LOGITS_STRIDE_0 apart; masked in place",
            role=Role.INOUT, ndim=(2,), contiguous=False),
        scalar("LOGITS_STRIDE_0", "row stride of LOGITS"),
        ptr("BUFFER", (F32,), F32, "[programs, V] workspace, a row per program", role=Role.SCRATCH, ndim=(2,)),
        ptr("PERCENTILE_TO_STD_TABLE", (F32,), F32, "[200] vLLM's top-k outlier table (its pivot heuristic; C35 reads none)"),
        ptr("NORMAL_CDF_TO_SIGMA_TABLE", (F32,), F32, "[200] vLLM's top-p outlier table (its pivot heuristic; C35 reads none)"),
        ptr("K", (I32,), I32, "[B] k >= 1 per row; unread (vLLM passes LOGITS) unless TOPK_ENABLED", optional=True,
            unread_unless="TOPK_ENABLED"),
        ptr("P", (F32,), F32, "[B] p > 0 per row; unread (vLLM passes LOGITS) unless TOPP_ENABLED", optional=True,
            unread_unless="TOPP_ENABLED"),
        scalar("BATCH_SIZE", "B, the rows masked"),
        constexpr("VOCAB_SIZE", "V, the columns of a row"),
        constexpr("MASK_VALUE", "what a masked logit becomes (float32)", dtypes=(F32,)),
        constexpr("BLOCK_SIZE", "tile width over a row (a power of two; the result does not depend on it)"),
        constexpr("BLOCK_SIZE_TRUNC", "vLLM's tile width over its workspace (a power of two; C35 reads none)"),
        constexpr("TOPK_ENABLED", "K is given"),
        constexpr("TOPP_ENABLED", "P is given"),
        constexpr("SPLIT_COVERS_PONLY", "the split top-p kernels mask rows with k >= V: with TOPK_ENABLED, leave them"),
    ),
    grid=_grid,
    preconditions=_preconditions,
    flags=(Flag("TOPK_ENABLED", "K", lambda x: x is not None, "True exactly when K is a tensor"),
           Flag("TOPP_ENABLED", "P", lambda x: x is not None, "True exactly when P is a tensor")),
    explain=_explain,
    rule=_rule,
    bytes_moved=_bytes,
)

SPECS = (TOPK_TOPP,)
