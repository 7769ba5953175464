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

from contracts._checks import flat_view, require_rows
from contracts.spec import (
    Earlier,
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


def _check_rows(k: str, a: Mapping[str, Any], b: int) -> None:
    """B rows of VOCAB_SIZE logits inside LOGITS, not overlapping (C31: they are written), each
    cell finite or -inf (C30)."""
    v, s = a["VOCAB_SIZE"], a["LOGITS_STRIDE_0"]
    if b > 1:
        require(s >= v, k, "LOGITS_STRIDE_0", f"must be >= VOCAB_SIZE={v} (rows written may not overlap), got {s}")
    require_rows(k, "LOGITS", a["LOGITS"], b, s, v)
    rows = torch.stack([row_values(a, r) for r in range(b)])
    bad = torch.isnan(rows) | (rows == float("inf"))
    if bool(bad.any()):
        r, c = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"{k}: 'LOGITS' must hold finite values or -inf (C30); row {r}, column {c} holds {float(rows[r, c])}")


def _preconditions(a: Mapping[str, Any]) -> None:
    k = KERNEL
    b, v = a["BATCH_SIZE"], a["VOCAB_SIZE"]
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
    _check_rows(k, a, b)
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
    explain="reference.topk_topp:explain_cell",  # the oracle states the cut-offs
    rule=_rule,
    bytes_moved=_bytes,
)


# The split top-p pipeline (C36): _topp_sb_stats_kernel, then _topp_sb_step_kernel for ROUND = 0 ..
# NUM_ROUNDS - 1, then _topp_sb_mask_kernel, each over grid (B * S,), program pid taking slice
# pid % S of row pid // S. Together they mask, in place, what C35's top-p drops from each row they
# own (p < 1 and, with HAS_K, k >= V); what they leave in STATS and PARTS is stated word for word
# (reference/topk_topp.py), so that any backend's kernel can take over from any other's.
STATS_KERNEL, STEP_KERNEL, MASK_KERNEL = "_topp_sb_stats_kernel", "_topp_sb_step_kernel", "_topp_sb_mask_kernel"
SPLIT_KERNELS = (STATS_KERNEL, STEP_KERNEL, MASK_KERNEL)
MAX_SPLITS = 64  # a round's masses, summed over slices and bins, stay below 2**63
FANOUTS = (4, 8)  # a slice's round record holds 3F/4 bins of four words
MAX_ROUNDS = 16
STATS_WORDS = 4


def split_rows(a: Mapping[str, Any]) -> int:
    """B: the split kernels take every row of LOGITS (vLLM's grid is logits.shape[0] * S)."""
    return int(a["LOGITS"].shape[0])


def split_steps(a: Mapping[str, Any], r: int) -> tuple[int | None, float]:
    """Row ``r``'s k (None without HAS_K) and p."""
    return (int(a["K"][r]) if a["HAS_K"] else None, float(a["P"][r]))


def owned(a: Mapping[str, Any], r: int) -> bool:
    """The split kernels mask row ``r``: p < 1 and, with HAS_K, k >= V (a row top-k leaves whole)."""
    k, p = split_steps(a, r)
    return p < 1.0 and (k is None or k >= a["VOCAB_SIZE"])


def split_count(batch: int, vocab: int, num_sm: int) -> int:
    """vLLM's slices per row (``_topp_split_count``): doubled up to 32 while the doubled grid fits
    the SMs or slices stay at least 7168 logits long."""
    splits = 1
    while splits < 32 and (splits * 2 * batch <= num_sm or splits * 2 * 7168 <= vocab):
        splits *= 2
    return splits


def split_workspace(device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's workspace of the split pipeline (``_apply_topp_split``): STATS [64 * 32, 4] and PARTS
    [64, 5, 32, 8, 3], float32, sized for its largest launch."""
    return torch.empty(64 * 32, STATS_WORDS, device=device), torch.empty(64, 5, 32, 8, 3, device=device)


def split_launches(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor, *, slices: int,
                   workspace: tuple[torch.Tensor, torch.Tensor], mask_value: float = float("-inf"), rounds: int = 5,
                   blocks: tuple[int, int, int] = (8192, 2048, 8192)) -> list[tuple[str, tuple[int, ...], dict[str, Any]]]:
    """The split pipeline's launches over ``logits`` ([B, V], unit inner stride), as vLLM's
    ``_apply_topp_split`` makes them (topk_topp_triton.py:1572-1615): (kernel, grid, arguments) of
    the stats kernel, each round of the step kernel and the mask, F = 8, tiles ``blocks`` (vLLM's
    CUDA tiles by default). K, when None, is vLLM's placeholder (LOGITS, unread)."""
    b, v = logits.shape
    stats, parts = workspace
    grid = (b * slices,)
    common = dict(LOGITS=logits, LOGITS_STRIDE_0=logits.stride(0), STATS=stats, K=logits if k is None else k, P=p,
                  HAS_K=k is not None, VOCAB_SIZE=v, S=slices)
    step = dict(common, PARTS=parts, F=8, NUM_ROUNDS=rounds)
    return [(STATS_KERNEL, grid, dict(common, BLOCK=blocks[0])),
            *[(STEP_KERNEL, grid, dict(step, ROUND=j, BLOCK=blocks[1])) for j in range(rounds)],
            (MASK_KERNEL, grid, dict(step, MASK_VALUE=mask_value, BLOCK=blocks[2]))]


def _split_preconditions(name: str, a: Mapping[str, Any]) -> None:
    b, v, s = split_rows(a), a["VOCAB_SIZE"], a["S"]
    at_least(name, "VOCAB_SIZE", v, 1)
    require(v <= MAX_VOCAB, name, "VOCAB_SIZE", f"must be at most {MAX_VOCAB} (C35: a row's mass is exact in float64)")
    power_of_two(name, "S", s)
    require(s <= MAX_SPLITS, name, "S", f"must be at most {MAX_SPLITS}")
    power_of_two(name, "BLOCK", a["BLOCK"])
    require(a["BLOCK"] <= MAX_BLOCK, name, "BLOCK", f"must be at most {MAX_BLOCK}")
    words = b * s * STATS_WORDS
    require(a["STATS"].numel() >= words, name, "STATS",
            f"must hold B * S * {STATS_WORDS} = {words} elements, has {a['STATS'].numel()}")
    if "F" in a:
        require(a["F"] in FANOUTS, name, "F", f"must be one of {FANOUTS}, got {a['F']}")
        at_least(name, "NUM_ROUNDS", a["NUM_ROUNDS"], 1)
        require(a["NUM_ROUNDS"] <= MAX_ROUNDS, name, "NUM_ROUNDS", f"must be at most {MAX_ROUNDS}")
        words = b * a["NUM_ROUNDS"] * s * a["F"] * 3
        require(a["PARTS"].numel() >= words, name, "PARTS",
                f"must hold B * NUM_ROUNDS * S * F * 3 = {words} elements, has {a['PARTS'].numel()}")
    if "ROUND" in a:
        require(0 <= a["ROUND"] < a["NUM_ROUNDS"], name, "ROUND", f"must be in [0, NUM_ROUNDS={a['NUM_ROUNDS']}), got {a['ROUND']}")
    if b == 0:
        return
    _check_rows(name, a, b)
    if a["HAS_K"]:
        require_length(name, "K", a["K"], b)
    require_length(name, "P", a["P"], b)
    require(bool((a["P"][:b] > 0).all()), name, "P", "must hold p > 0 (and no NaN) in its first B entries")


def _split_grid(a: Mapping[str, Any]) -> tuple[int, ...]:
    return (split_rows(a) * a["S"],)


def _split_bytes(a: Mapping[str, Any]) -> int:
    return 2 * split_rows(a) * a["VOCAB_SIZE"] * 4


def _split_params(logits_role: Role = Role.IN, stats_role: Role = Role.IN) -> tuple[Any, ...]:
    return (
        ptr("LOGITS", (F32,), F32, "[B, V] float32 logits (finite or -inf), rows LOGITS_STRIDE_0 apart",
            role=logits_role, ndim=(2,), contiguous=False),
        scalar("LOGITS_STRIDE_0", "row stride of LOGITS"),
        ptr("STATS", (F32,), F32, "[>= B * S, 4] float32 words: per slice its largest and smallest key (C36)",
            role=stats_role, ndim=(1, 2)),
    )


def _split_spec(name: str, params: tuple[Any, ...]) -> KernelSpec:
    return KernelSpec(
        name=name,
        family="topk_topp",
        qualname=f"{_MODULE}.{name}",
        params=params,
        grid=_split_grid,
        preconditions=lambda a: _split_preconditions(name, a),
        flags=(Flag("HAS_K", "K", lambda x: x is not None, "True exactly when K is a tensor"),),
        explain="reference.topk_topp:describe_split",
        rule=lambda a, output, index, kind: "C36 split top-p",
        bytes_moved=_split_bytes,
        engine_apart="vLLM 0.33.0's split kernels keep float32 softmax partials of a probability-pivot search in STATS "
                     "and PARTS, not C36's words; tests/test_topk_topp.py compares its pipeline's logits",
    )


def _k_p() -> tuple[Any, ...]:
    return (
        ptr("K", (I32,), I32, "[B] k per row; unread (vLLM passes LOGITS) unless HAS_K", optional=True, unread_unless="HAS_K"),
        ptr("P", (F32,), F32, "[B] p > 0 per row; rows with p >= 1 are left alone"),
    )


def _parts(role: Role) -> Any:
    return ptr("PARTS", (F32,), F32, "float32 words, NUM_ROUNDS * S * F * 3 per row: each slice's record of each "
               "round (vLLM: [64, 5, 32, 8, 3])", role=role, ndim=(1, 5))


_HAS_K = constexpr("HAS_K", "K is given: rows with k < V are top-k's (the monolithic kernel masks them)")
_VOCAB = constexpr("VOCAB_SIZE", "V, the columns of a row")
_S = constexpr("S", "slices per row (a power of two, at most 64)")
_F = constexpr("F", "vLLM's pivot fan-out (4 or 8): a round's record is F * 3 words, 3F/4 key bins")
_ROUNDS = constexpr("NUM_ROUNDS", "launches of the step kernel (vLLM: 5); the last finishes the search")
_BLOCK = constexpr("BLOCK", "tile width over a slice (a power of two; the result does not depend on it)")

TOPP_STATS = _split_spec(STATS_KERNEL, (
    *_split_params(stats_role=Role.OUT), *_k_p(), _HAS_K, _VOCAB, _S, _BLOCK))
TOPP_STEP = _split_spec(STEP_KERNEL, (
    *_split_params(), _parts(Role.INOUT), *_k_p(), scalar("ROUND", "which round this launch runs, 0 .. NUM_ROUNDS - 1"),
    _HAS_K, _S, _F, _ROUNDS, _VOCAB, _BLOCK))
TOPP_MASK = _split_spec(MASK_KERNEL, (
    *_split_params(logits_role=Role.INOUT), _parts(Role.IN), *_k_p(), _HAS_K,
    constexpr("MASK_VALUE", "what a masked logit becomes (float32)", dtypes=(F32,)), _S, _F, _ROUNDS, _VOCAB, _BLOCK))



def _bind_0_21(a: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM 0.20.0-0.21.0's launch of K19: contiguous rows, no split pipeline beside it."""
    return {k: v for k, v in a.items() if k not in ("LOGITS_STRIDE_0", "SPLIT_COVERS_PONLY")}


def _predates_0_21(a: Mapping[str, Any]) -> str | None:
    if a["LOGITS_STRIDE_0"] != a["VOCAB_SIZE"]:
        return "strided logits rows (LOGITS_STRIDE_0, 0.30.0)"
    return "C36's split pipeline owning top-p of rows with k >= V (0.30.0)" if a["SPLIT_COVERS_PONLY"] else None


TOPK_TOPP.earlier = (Earlier("0.21.0", tuple(n for n in TOPK_TOPP.arg_names if n not in ("LOGITS_STRIDE_0", "SPLIT_COVERS_PONLY")),
                             "contiguous rows only, and no split top-p pipeline", _bind_0_21, _predates_0_21),)

SPECS = (TOPK_TOPP, TOPP_STATS, TOPP_STEP, TOPP_MASK)
