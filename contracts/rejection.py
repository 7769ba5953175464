"""Contracts of the rejection-sampler family (docs/spec.md §2.1–§2.4, vllm/v1/sample/rejection_sampler.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from contracts.spec import (
    INT,
    Earlier,
    Flag,
    KernelSpec,
    Role,
    at_least,
    check_cumulative,
    constexpr,
    counts,
    power_of_two,
    ptr,
    require,
    require_fits,
    require_length,
    scalar,
    starts,
)

F32, F64, BOOL = torch.float32, torch.float64, torch.bool
I32, I64 = torch.int32, torch.int64
_MODULE = "vllm.v1.sample.rejection_sampler"


def _is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def residual_weight(diff: torch.Tensor) -> torch.Tensor:
    """C16's residual weight of one float32 difference ``p - q``: ``max(diff, 0)``, a NaN difference
    giving 0. K4's, and SGLang's verifiers' (C46c, C48d: docs/sglang_verify.md)."""
    return torch.where(diff > 0, diff, torch.zeros_like(diff))


def _rows_and_drafts(kernel: str, a: Mapping[str, Any], processed: torch.Tensor | None) -> tuple[int, int, torch.Tensor]:
    """Shared checks of cu / output layout; returns (B, T, n) with n masked to processed rows."""
    cu = a["cu_num_draft_tokens_ptr"]
    check_cumulative(kernel, "cu_num_draft_tokens_ptr", cu)
    b = cu.numel()
    t = int(cu[-1]) if b else 0
    n = counts(cu)
    s = a["max_spec_len"]
    at_least(kernel, "max_spec_len", s, 0)
    # The row stride max_spec_len + 1 is an int64 in the kernel, whatever the batch size.
    require(s < 2**63 - 1, kernel, "max_spec_len", "must be < 2**63 - 1 (the row stride is max_spec_len + 1)")
    out = a["output_token_ids_ptr"]
    require_length(kernel, "output_token_ids_ptr", out, b * (s + 1))
    require_length(kernel, "draft_token_ids_ptr", a["draft_token_ids_ptr"], t)
    require_length(kernel, "bonus_token_ids_ptr", a["bonus_token_ids_ptr"], b)
    _ids_fit(kernel, a, "draft_token_ids_ptr", t)
    _ids_fit(kernel, a, "bonus_token_ids_ptr", b)
    if processed is not None:
        n = n[processed[:b]]
    if n.numel():
        require(int(n.max()) <= s, kernel, "max_spec_len", f"must be >= every processed row's draft count ({int(n.max())})")
    return b, t, n


def _ids_fit(kernel: str, a: Mapping[str, Any], name: str, n: int) -> None:
    """The first ``n`` ids of ``name`` fit the output's dtype: the kernel copies them into it (C5)."""
    x, out = a[name], a["output_token_ids_ptr"]
    if n > 0 and torch.iinfo(x.dtype).bits > torch.iinfo(out.dtype).bits:
        ids = x.reshape(-1)[:n]
        for v in (int(ids.min()), int(ids.max())):
            require_fits(kernel, name, v, "output_token_ids_ptr", out)


def _synthetic(kernel: str, a: Mapping[str, Any], t: int, n: torch.Tensor) -> None:
    if a["SYNTHETIC_MODE"]:
        u = a["uniform_probs_ptr"]
        require(u is not None, kernel, "uniform_probs_ptr", "is required in synthetic mode")
        require_length(kernel, "uniform_probs_ptr", u, t)
        need = int(n.max()) if n.numel() else 0
        require_length(kernel, "synthetic_conditional_rates_ptr", a["synthetic_conditional_rates_ptr"], need)


def _greedy_preconditions(a: Mapping[str, Any]) -> None:
    k = "rejection_greedy_sample_kernel"
    g = a["is_greedy_ptr"]
    b = a["cu_num_draft_tokens_ptr"].numel()
    require_length(k, "is_greedy_ptr", g, b)
    _, t, n = _rows_and_drafts(k, a, None if g is None else g)
    require_length(k, "target_argmax_ptr", a["target_argmax_ptr"], t)
    _synthetic(k, a, t, n)


def _random_preconditions(a: Mapping[str, Any]) -> None:
    k = "rejection_random_sample_kernel"
    g = a["is_greedy_ptr"]
    b = a["cu_num_draft_tokens_ptr"].numel()
    require_length(k, "is_greedy_ptr", g, b)
    _, t, n = _rows_and_drafts(k, a, ~g)
    require_length(k, "uniform_probs_ptr", a["uniform_probs_ptr"], t)
    require_length(k, "recovered_token_ids_ptr", a["recovered_token_ids_ptr"], t)
    _ids_fit(k, a, "recovered_token_ids_ptr", t)
    v = a["vocab_size"]
    at_least(k, "vocab_size", v, 1)
    vocab_rows(k, a, "target_probs_ptr", t, v)
    vocab_rows(k, a, "draft_probs_ptr", t, v)
    if a["SYNTHETIC_MODE"]:
        _synthetic(k, a, t, n)
    elif t:
        # An id >= V would read another row's probability (C11); checked over processed rows.
        cu = a["cu_num_draft_tokens_ptr"]
        rows = torch.repeat_interleave(torch.arange(b), counts(cu))
        d = a["draft_token_ids_ptr"][:t][~g[:b][rows]]
        require(not d.numel() or int(d.max()) < v, k, "draft_token_ids_ptr", f"must hold ids < vocab_size ({v}) outside synthetic mode")


def vocab_rows(k: str, a: Mapping[str, Any], name: str, rows: int, v: int) -> None:
    """``name`` is ``[>= rows, v]`` (or None): kernels address it as ``t * vocab_size + d``."""
    x = a[name]
    if x is None:
        return
    require(x.dim() == 2 and x.shape[1] == v, k, name, f"must have shape [>= {rows}, vocab_size={v}], got {tuple(x.shape)}")
    require(x.shape[0] >= rows, k, name, f"must have at least {rows} rows, has {x.shape[0]}")


def _expand_preconditions(a: Mapping[str, Any]) -> None:
    k = "expand_kernel"
    x, out, cu = a["input_ptr"], a["output_ptr"], a["cu_num_tokens_ptr"]
    require(out.dtype == x.dtype, k, "output_ptr", f"must have the input's dtype {x.dtype}, got {out.dtype}")
    require(cu.numel() == x.numel(), k, "cu_num_tokens_ptr", f"must have one entry per input value ({x.numel()}), has {cu.numel()}")
    check_cumulative(k, "cu_num_tokens_ptr", cu)
    require_length(k, "output_ptr", out, int(cu[-1]) if cu.numel() else 0)
    for name in ("replace_from", "replace_to"):
        require(-(2**31) <= a[name] < 2**31, k, name, "must be representable in int32")
    m = a["MAX_NUM_TOKENS"]
    power_of_two(k, "MAX_NUM_TOKENS", m)


def _recovered_preconditions(a: Mapping[str, Any]) -> None:
    k = "sample_recovered_tokens_kernel"
    cu = a["cu_num_draft_tokens_ptr"]
    check_cumulative(k, "cu_num_draft_tokens_ptr", cu)
    b = cu.numel()
    t = int(cu[-1]) if b else 0
    v = a["vocab_size"]
    at_least(k, "vocab_size", v, 1)
    require_length(k, "output_token_ids_ptr", a["output_token_ids_ptr"], t)
    require_length(k, "draft_token_ids_ptr", a["draft_token_ids_ptr"], t)
    vocab_rows(k, a, "target_probs_ptr", t, v)
    vocab_rows(k, a, "draft_probs_ptr", t, v)
    vocab_rows(k, a, "inv_q_ptr", b, v)
    bs = a["BLOCK_SIZE"]
    power_of_two(k, "BLOCK_SIZE", bs)


# -- failure explanations ------------------------------------------------------------------------
def _cell(a: Mapping[str, Any], index: int) -> tuple[int, int, int, int]:
    s = a["max_spec_len"]
    r, j = divmod(index, s + 1)
    cu = a["cu_num_draft_tokens_ptr"]
    return r, j, int(starts(cu)[r]), int(counts(cu)[r])


def _get(t: torch.Tensor | None, i: int) -> Any:
    if t is None or not isinstance(t, torch.Tensor):
        return None
    if t.dim() == 2:
        return t.reshape(-1)[i].item()
    return t[i].item()


def _explain_greedy(a: Mapping[str, Any], output: str, index: int) -> str:
    r, j, s, n = _cell(a, index)
    lines = [f"request {r}, draft position {j} (n={n}, start={s}, bonus={_get(a['bonus_token_ids_ptr'], r)})"]
    g = a["is_greedy_ptr"]
    lines.append(f"is_greedy[{r}]={'None' if g is None else bool(g[r])}")
    for pos in range(min(j + 1, n)):
        t = s + pos
        row = f"  pos {pos}: draft={_get(a['draft_token_ids_ptr'], t)} target_argmax={_get(a['target_argmax_ptr'], t)}"
        if a["SYNTHETIC_MODE"]:
            row += f" u={_get(a['uniform_probs_ptr'], t)!r} rate={_get(a['synthetic_conditional_rates_ptr'], pos)!r}"
        lines.append(row)
    return "\n".join(lines)


def _explain_random(a: Mapping[str, Any], output: str, index: int) -> str:
    r, j, s, n = _cell(a, index)
    v = a["vocab_size"]
    lines = [
        f"request {r}, draft position {j} (n={n}, start={s}, bonus={_get(a['bonus_token_ids_ptr'], r)}, "
        f"is_greedy={bool(a['is_greedy_ptr'][r])})"
    ]
    for pos in range(min(j + 1, n)):
        t = s + pos
        d = _get(a["draft_token_ids_ptr"], t)
        row = f"  pos {pos}: draft={d} u={_get(a['uniform_probs_ptr'], t)!r} recovered={_get(a['recovered_token_ids_ptr'], t)}"
        if a["SYNTHETIC_MODE"]:
            row += f" rate={_get(a['synthetic_conditional_rates_ptr'], pos)!r}"
        elif 0 <= d < v:
            q = 1.0 if a["draft_probs_ptr"] is None else _get(a["draft_probs_ptr"], t * v + d)
            p = _get(a["target_probs_ptr"], t * v + d)
            ratio = (torch.tensor(p, dtype=torch.float32) / torch.tensor(q, dtype=torch.float32)).item()
            u32 = torch.tensor(_get(a["uniform_probs_ptr"], t), dtype=torch.float64).float().item()
            row += f" p={p!r} q={q!r} p/q={ratio!r} (float32) float32(u)={u32!r}"
        lines.append(row)
    return "\n".join(lines)


def _decisive(a: Mapping[str, Any], index: int, kind: str) -> tuple[int, int, int, int]:
    """(request, position, start, n) of the decision behind a K1/K2 cell: a cell one side wrote and
    the other left (or a bonus one wrote) follows from the decision at the position before it."""
    r, j, s, n = _cell(a, index)
    if kind in ("unwritten", "stray write") and j > 0:
        j -= 1
    return r, j, s, n


def _rule_greedy(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    r, j, s, n = _decisive(a, index, kind)
    if j >= n:
        return "C2 bonus"
    if a["SYNTHETIC_MODE"]:
        return "C13 synthetic rate"
    return "C10 negative draft" if _get(a["draft_token_ids_ptr"], s + j) < 0 else "K1 argmax match"


def _rule_random(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    r, j, s, n = _decisive(a, index, kind)
    if j >= n:
        return "C2 bonus"
    d = _get(a["draft_token_ids_ptr"], s + j)
    if d < 0:
        return "C10 negative draft"
    if a["SYNTHETIC_MODE"]:
        return "C13 synthetic rate"
    v = a["vocab_size"]
    q = 1.0 if a["draft_probs_ptr"] is None else _get(a["draft_probs_ptr"], (s + j) * v + d)
    return "C7 ratio against float64 uniform" if q > 0 else "C9 q = 0"


def _rule_recovered(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    return "C17 fp64 Gumbel" if a["USE_FP64_GUMBEL"] else "C15 argmax"


def _explain_expand(a: Mapping[str, Any], output: str, index: int) -> str:
    cu = a["cu_num_tokens_ptr"]
    r = int(torch.searchsorted(cu.to(torch.int64), index, right=True))
    if r >= cu.numel():
        return f"output slot {index} lies past cu[-1]={int(cu[-1]) if cu.numel() else 0}: it must stay untouched"
    s = int(starts(cu)[r])
    return (
        f"request {r}, token {index - s} (n={int(counts(cu)[r])}, input={_get(a['input_ptr'], r)!r}, "
        f"replace {a['replace_from']} -> {a['replace_to']}, MAX_NUM_TOKENS={a['MAX_NUM_TOKENS']})"
    )


def _explain_recovered(a: Mapping[str, Any], output: str, index: int) -> str:
    cu = a["cu_num_draft_tokens_ptr"]
    r = int(torch.searchsorted(cu.to(torch.int64), index, right=True))
    if r >= cu.numel():
        return f"output slot {index} lies past T={int(cu[-1]) if cu.numel() else 0}: it must stay untouched"
    pos = index - int(starts(cu)[r])
    v = a["vocab_size"]
    p = a["target_probs_ptr"][index]
    q = a["draft_probs_ptr"]
    w = torch.clamp_min(p - q[index], 0).nan_to_num(0.0) if q is not None else p
    top = torch.topk(w.nan_to_num(float("-inf")), min(3, v)).indices.tolist()
    inv_q = a["inv_q_ptr"][r]
    scores = ", ".join(f"[{i}] w={float(w[i])!r} inv_q={float(inv_q[i])!r} (float32 {float(inv_q[i].float())!r})" for i in top)
    return (
        f"request {r}, draft position {pos}, token {index}: draft={_get(a['draft_token_ids_ptr'], index)} "
        f"V={v} NO_DRAFT_PROBS={a['NO_DRAFT_PROBS']} inv_q dtype={str(inv_q.dtype).removeprefix('torch.')}; "
        f"largest residuals: {scores}"
    )


# -- bytes moved (benchmarks' GB/s) ------------------------------------------------------------------
# What a launch must read and write at least, element by element (no cache-line rounding): every
# byte counted is one the semantics need, so a GB/s figure above the machine's bandwidth is a
# harness error, never a win.
def _nbytes(t: Any, n: int) -> int:
    return n * t.element_size() if isinstance(t, torch.Tensor) else 0


def _examined(a: Mapping[str, Any], want_greedy: bool | None) -> tuple[int, int, int, int]:
    """(B, rows processed, draft tokens examined when every position is, longest processed row)."""
    cu = a["cu_num_draft_tokens_ptr"]
    b = cu.numel()
    n = counts(cu)
    g = a["is_greedy_ptr"]
    if g is not None and want_greedy is not None:
        keep = g[:b] if want_greedy else ~g[:b]
        n = n[keep]
    return b, n.numel(), int(n.sum()), int(n.max()) if n.numel() else 0


def _greedy_bytes(a: Mapping[str, Any]) -> int:
    # Upper end of the data-dependent range: every draft position examined (no early rejection).
    b, rows, t, longest = _examined(a, True)
    out = a["output_token_ids_ptr"]
    moved = _nbytes(a["cu_num_draft_tokens_ptr"], b) + _nbytes(a["is_greedy_ptr"], b)
    moved += _nbytes(a["draft_token_ids_ptr"], t) + _nbytes(a["target_argmax_ptr"], t)
    moved += _nbytes(a["bonus_token_ids_ptr"], rows) + _nbytes(out, t + rows)
    if a["SYNTHETIC_MODE"]:
        moved += _nbytes(a["uniform_probs_ptr"], t) + _nbytes(a["synthetic_conditional_rates_ptr"], longest)
    return moved


def _random_bytes(a: Mapping[str, Any]) -> int:
    # Every draft position examined; one target (and draft) probability per position: the
    # kernel gathers single elements from [T, V], it never streams the rows.
    b, rows, t, longest = _examined(a, False)
    out = a["output_token_ids_ptr"]
    moved = _nbytes(a["cu_num_draft_tokens_ptr"], b) + _nbytes(a["is_greedy_ptr"], b)
    moved += _nbytes(a["draft_token_ids_ptr"], t) + _nbytes(a["uniform_probs_ptr"], t)
    moved += _nbytes(a["recovered_token_ids_ptr"], t) + _nbytes(a["bonus_token_ids_ptr"], rows)
    moved += _nbytes(out, t + rows)
    if a["SYNTHETIC_MODE"]:
        moved += _nbytes(a["synthetic_conditional_rates_ptr"], longest)
    else:
        moved += _nbytes(a["target_probs_ptr"], t) + _nbytes(a["draft_probs_ptr"], t)
    return moved


def _expand_bytes(a: Mapping[str, Any]) -> int:
    cu = a["cu_num_tokens_ptr"]
    b = cu.numel()
    written = int(counts(cu).clamp(max=a["MAX_NUM_TOKENS"]).sum())
    return _nbytes(a["input_ptr"], b) + _nbytes(cu, b) + _nbytes(a["output_ptr"], written)


def _recovered_bytes(a: Mapping[str, Any]) -> int:
    # Streams every draft row of p (and q) once, and each request's inv_q row once when the
    # request has drafts (its positions share it); writes one id per draft position.
    cu = a["cu_num_draft_tokens_ptr"]
    n = counts(cu)
    b, t, v = cu.numel(), int(n.sum()), a["vocab_size"]
    requests = int((n > 0).sum())
    moved = _nbytes(cu, b) + _nbytes(a["target_probs_ptr"], t * v) + _nbytes(a["draft_probs_ptr"], t * v)
    moved += _nbytes(a["inv_q_ptr"], requests * v) + _nbytes(a["output_token_ids_ptr"], t)
    if a["NO_DRAFT_PROBS"]:
        moved += _nbytes(a["draft_token_ids_ptr"], t)
    return moved


# -- earlier releases (KernelSpec.earlier), from their source distributions ---------------------
def _negative_draft(a: Mapping[str, Any], greedy_rows: bool) -> bool:
    """Whether a row the kernel processes (greedy or not, by ``is_greedy``) holds a negative draft."""
    cu, g, d = a["cu_num_draft_tokens_ptr"], a["is_greedy_ptr"], a["draft_token_ids_ptr"]
    for r, (s, n) in enumerate(zip(starts(cu).tolist(), counts(cu).tolist())):
        if (g is None or bool(g[r]) == greedy_rows) and n and bool((d[s : s + n] < 0).any()):
            return True
    return False


def _greedy_predates(a: Mapping[str, Any]) -> str | None:
    if a["SYNTHETIC_MODE"] and _negative_draft(a, True):
        return "C13's rejection of a padded (-1) draft in synthetic mode (0.30.0)"
    return None


def _random_predates(a: Mapping[str, Any]) -> str | None:
    return "C10 negative draft (0.30.0)" if _negative_draft(a, False) else None


def _recovered_bind(a: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in a.items() if k != "USE_FP64_GUMBEL"}


def _recovered_predates(a: Mapping[str, Any]) -> str | None:
    return "C17 fp64 Gumbel (0.30.0)" if a["USE_FP64_GUMBEL"] else None


# -- the contracts ---------------------------------------------------------------------------------
_OUT = dict(role=Role.OUT, ndim=(1, 2))

REJECTION_GREEDY = KernelSpec(
    name="rejection_greedy_sample_kernel",
    family="rejection",
    qualname=f"{_MODULE}.rejection_greedy_sample_kernel",
    params=(
        ptr("output_token_ids_ptr", INT, I32, "[B, S+1] rejection output", **_OUT),
        ptr("cu_num_draft_tokens_ptr", INT, I32, "[B] inclusive cumulative draft counts"),
        ptr("draft_token_ids_ptr", INT, I32, "[T] draft tokens, may hold -1"),
        ptr("target_argmax_ptr", INT, I64, "[T] argmax of the target logits"),
        ptr("bonus_token_ids_ptr", INT, I32, "[B, 1] bonus token per request", ndim=(1, 2)),
        ptr("is_greedy_ptr", (BOOL,), BOOL, "[B] rows this kernel handles; None = all", optional=True),
        scalar("max_spec_len", "S; the output row stride is S+1"),
        ptr("uniform_probs_ptr", (F64,), F64, "[T] uniforms, read in synthetic mode", optional=True),
        ptr("synthetic_conditional_rates_ptr", (F32,), F32, "[K] conditional acceptance rates", optional=True),
        constexpr("SYNTHETIC_MODE"),
    ),
    grid=lambda a: (a["cu_num_draft_tokens_ptr"].numel(),),
    preconditions=_greedy_preconditions,
    flags=(Flag("SYNTHETIC_MODE", "synthetic_conditional_rates_ptr", lambda x: x is not None, "rates is not None"),),
    explain=_explain_greedy,
    rule=_rule_greedy,
    bytes_moved=_greedy_bytes,
)

REJECTION_RANDOM = KernelSpec(
    name="rejection_random_sample_kernel",
    family="rejection",
    qualname=f"{_MODULE}.rejection_random_sample_kernel",
    params=(
        ptr("output_token_ids_ptr", INT, I32, "[B, S+1] rejection output", **_OUT),
        ptr("cu_num_draft_tokens_ptr", INT, I32, "[B] inclusive cumulative draft counts"),
        ptr("draft_token_ids_ptr", INT, I32, "[T] draft tokens, may hold -1"),
        ptr("draft_probs_ptr", (F32,), F32, "[T, V] q, or None for one-hot drafts", optional=True, ndim=(2,)),
        ptr("target_probs_ptr", (F32,), F32, "[T, V] p", ndim=(2,)),
        ptr("bonus_token_ids_ptr", INT, I32, "[B, 1] bonus token per request", ndim=(1, 2)),
        ptr("recovered_token_ids_ptr", INT, I32, "[T] token emitted on rejection"),
        ptr("uniform_probs_ptr", (F64,), F64, "[T] one uniform per draft token"),
        ptr("is_greedy_ptr", (BOOL,), BOOL, "[B] rows this kernel skips"),
        scalar("max_spec_len", "S"),
        scalar("vocab_size", "V, row stride of the probability tensors"),
        ptr("synthetic_conditional_rates_ptr", (F32,), F32, "[K] conditional acceptance rates", optional=True),
        constexpr("NO_DRAFT_PROBS"),
        constexpr("SYNTHETIC_MODE"),
    ),
    grid=lambda a: (a["cu_num_draft_tokens_ptr"].numel(),),
    preconditions=_random_preconditions,
    flags=(
        Flag("NO_DRAFT_PROBS", "draft_probs_ptr", lambda x: x is None, "draft_probs_ptr is None"),
        Flag("SYNTHETIC_MODE", "synthetic_conditional_rates_ptr", lambda x: x is not None, "rates is not None"),
    ),
    explain=_explain_random,
    rule=_rule_random,
    bytes_moved=_random_bytes,
)

EXPAND = KernelSpec(
    name="expand_kernel",
    family="rejection",
    qualname=f"{_MODULE}.expand_kernel",
    params=(
        ptr("output_ptr", (F32, I32, I64), F32, "[T] per-token values, input's dtype", role=Role.OUT),
        ptr("input_ptr", (F32, I32, I64), F32, "[B] per-request values"),
        ptr("cu_num_tokens_ptr", INT, I32, "[B] inclusive cumulative token counts"),
        scalar("replace_from", "value to replace (an int)"),
        scalar("replace_to", "replacement (an int)"),
        constexpr("MAX_NUM_TOKENS", "most tokens written per request (128 at the call site)"),
    ),
    grid=lambda a: (a["input_ptr"].numel(),),
    preconditions=_expand_preconditions,
    explain=_explain_expand,
    rule=lambda a, output, index, kind: "C18 expansion",
    bytes_moved=_expand_bytes,
)

SAMPLE_RECOVERED = KernelSpec(
    name="sample_recovered_tokens_kernel",
    family="rejection",
    qualname=f"{_MODULE}.sample_recovered_tokens_kernel",
    params=(
        ptr("output_token_ids_ptr", INT, I32, "[T] recovered token per draft position", role=Role.OUT),
        ptr("cu_num_draft_tokens_ptr", INT, I32, "[B] inclusive cumulative draft counts"),
        ptr("draft_token_ids_ptr", INT, I32, "[T] read only when NO_DRAFT_PROBS"),
        ptr("draft_probs_ptr", (F32,), F32, "[T, V] q, or None", optional=True, ndim=(2,)),
        ptr("target_probs_ptr", (F32,), F32, "[T, V] p", ndim=(2,)),
        ptr("inv_q_ptr", (F32, F64), F32, "[B, V] 1/Exp(1) noise, one row per request", ndim=(2,)),
        scalar("vocab_size", "V"),
        constexpr("BLOCK_SIZE", "vocabulary tile width (8192 at the call site)"),
        constexpr("NO_DRAFT_PROBS"),
        constexpr("USE_FP64_GUMBEL"),
    ),
    tuning=("SCAN_BLOCK", "SCAN_STAGES"),  # triton_impl/rejection.py: the scan's step and pipelining
    # The dispatcher's max_spec_len is not a kernel parameter; max n(r) covers all work (§1.11).
    grid=lambda a: (a["cu_num_draft_tokens_ptr"].numel(), int(counts(a["cu_num_draft_tokens_ptr"]).max()) if a["cu_num_draft_tokens_ptr"].numel() else 0),
    preconditions=_recovered_preconditions,
    flags=(
        Flag("NO_DRAFT_PROBS", "draft_probs_ptr", lambda x: x is None, "draft_probs_ptr is None"),
        Flag("USE_FP64_GUMBEL", "inv_q_ptr", lambda x: _is_tensor(x) and x.dtype == torch.float64, "inv_q_ptr is float64"),
    ),
    explain=_explain_recovered,
    rule=_rule_recovered,
    bytes_moved=_recovered_bytes,
)

# Through 0.21.0 the same parameters held rules that came later (a padded draft was judged like any
# token), and K4 had no fp64 Gumbel switch.
REJECTION_GREEDY.earlier = (Earlier("0.21.0", REJECTION_GREEDY.arg_names, "synthetic mode accepts a padded (-1) draft",
                                    dict, _greedy_predates),)
REJECTION_RANDOM.earlier = (Earlier("0.21.0", REJECTION_RANDOM.arg_names, "a negative draft is judged like any token",
                                    dict, _random_predates),)
SAMPLE_RECOVERED.earlier = (Earlier("0.21.0", tuple(n for n in SAMPLE_RECOVERED.arg_names if n != "USE_FP64_GUMBEL"),
                                    "float32 Gumbel only (no USE_FP64_GUMBEL)", _recovered_bind, _recovered_predates),)

SPECS = (REJECTION_GREEDY, REJECTION_RANDOM, EXPAND, SAMPLE_RECOVERED)
