"""Contracts of the FLy pre-pass (docs/fly.md, vllm/v1/spec_decode/fly.py).

FLy ("defer a high-entropy rejection when the next W drafts would be accepted") rewrites the inputs
of the unchanged V1 kernels: the greedy pre-pass (K19) replaces a target argmax by the draft, the
random pre-pass (K20) sets a uniform to 0.0 so that K2 accepts. Both are grid ``(B,)``, one program
per request, launched only by V1's ``rejection_sample`` just before K1 and K2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from contracts.rejection import vocab_rows
from contracts.spec import (
    INT,
    Flag,
    KernelSpec,
    Role,
    at_least,
    check_cumulative,
    constexpr,
    counts,
    in_int64,
    ptr,
    real,
    require,
    require_length,
    scalar,
    starts,
)

F32, F64, BOOL = torch.float32, torch.float64, torch.bool
I32, I64 = torch.int32, torch.int64
K19 = "apply_fly_greedy_acceptance_kernel"
K20 = "apply_fly_random_acceptance_kernel"
_MODULE = "vllm.v1.spec_decode.fly"


def _rows(kernel: str, a: Mapping[str, Any]) -> tuple[int, int]:
    """Checks shared by K19 and K20; returns (B, T)."""
    cu = a["cu_num_draft_tokens_ptr"]
    check_cumulative(kernel, "cu_num_draft_tokens_ptr", cu)
    b = cu.numel()
    t = int(cu[-1]) if b else 0
    v = a["vocab_size"]
    at_least(kernel, "vocab_size", v, 1)
    w = a["FLY_WINDOW_SIZE"]
    at_least(kernel, "FLY_WINDOW_SIZE", w, 0)
    in_int64(kernel, "FLY_WINDOW_SIZE", t + w, "a position plus the window")
    require_length(kernel, "draft_token_ids_ptr", a["draft_token_ids_ptr"], t)
    require_length(kernel, "fly_entropy_ptr", a["fly_entropy_ptr"], t)
    require_length(kernel, "is_greedy_ptr", a["is_greedy_ptr"], b)
    return b, t


def _greedy_preconditions(a: Mapping[str, Any]) -> None:
    _, t = _rows(K19, a)
    argmax = a["target_argmax_ptr"]
    require_length(K19, "target_argmax_ptr", argmax, t)
    vocab_rows(K19, a, "target_logits_ptr", t, a["vocab_size"])
    # A deferred position stores its draft (0 <= d < V) into the argmax buffer.
    top = torch.iinfo(argmax.dtype).max
    require(a["vocab_size"] - 1 <= top, K19, "vocab_size",
            f"must be <= {top + 1}: a deferred draft id is stored into target_argmax_ptr's {str(argmax.dtype).removeprefix('torch.')}")


def _random_preconditions(a: Mapping[str, Any]) -> None:
    _, t = _rows(K20, a)
    require_length(K20, "uniform_probs_ptr", a["uniform_probs_ptr"], t)
    vocab_rows(K20, a, "target_probs_ptr", t, a["vocab_size"])
    vocab_rows(K20, a, "draft_probs_ptr", t, a["vocab_size"])


# -- what decided a cell ---------------------------------------------------------------------------
def request_of(a: Mapping[str, Any], t: int) -> tuple[int, int, int]:
    """(request, start, n) of draft token ``t``."""
    cu = a["cu_num_draft_tokens_ptr"]
    r = int(torch.searchsorted(cu.to(torch.int64), t, right=True))
    return r, int(starts(cu)[r]), int(counts(cu)[r])


def _item(t: torch.Tensor | None, i: int) -> Any:
    return None if t is None else t.reshape(-1)[i].item()


def _explain(a: Mapping[str, Any], output: str, index: int) -> str:
    r, s, n = request_of(a, index)
    w, v = a["FLY_WINDOW_SIZE"], a["vocab_size"]
    greedy = a["is_greedy_ptr"]
    lines = [f"request {r}, draft position {index - s} (n={n}, start={s}, W={w}, V={v}, "
             f"is_greedy={'None' if greedy is None else bool(greedy[r])}, threshold={a['fly_entropy_threshold']!r} "
             f"(float32 {float(torch.tensor(a['fly_entropy_threshold'], dtype=F32))!r}))"]
    for t in range(index, min(index + w, s + n - 1) + 1):
        d = _item(a["draft_token_ids_ptr"], t)
        row = f"  pos {t - s}: draft={d} entropy={_item(a['fly_entropy_ptr'], t)!r}"
        if output == "target_argmax_ptr":
            row += f" target_argmax={_item(a['target_argmax_ptr'], t)}"
            if 0 <= d < v:
                row += f" target_logit[draft]={_item(a['target_logits_ptr'], t * v + d)!r}"
        else:
            row += f" u={_item(a['uniform_probs_ptr'], t)!r}"
            if 0 <= d < v:
                q = 1.0 if a["draft_probs_ptr"] is None else _item(a["draft_probs_ptr"], t * v + d)
                p = _item(a["target_probs_ptr"], t * v + d)
                ratio = (torch.tensor(p, dtype=F32) / torch.tensor(q, dtype=F32)).item() if q else math.nan
                row += f" p={p!r} q={q!r} p/q={ratio!r} (float32)"
        lines.append(row)
    return "\n".join(lines)


def _rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    return "C33 FLy greedy deferral" if output == "target_argmax_ptr" else "C33 FLy random deferral (C6 ratio)"


# -- bytes moved ---------------------------------------------------------------------------------------
def _bytes(a: Mapping[str, Any]) -> int:
    # Every processed position reads its draft, entropy and argmax (or uniform) and, at most, one
    # logit (or p and q); the window re-reads what its positions read anyway.
    cu = a["cu_num_draft_tokens_ptr"]
    n, g = counts(cu), a["is_greedy_ptr"]
    if g is not None:
        n = n[g[: cu.numel()]] if "target_argmax_ptr" in a else n[~g[: cu.numel()]]
    t = int(n.sum())
    size = lambda name: a[name].element_size() if isinstance(a.get(name), torch.Tensor) else 0  # noqa: E731
    per = size("draft_token_ids_ptr") + size("fly_entropy_ptr")
    if "target_argmax_ptr" in a:
        per += size("target_argmax_ptr") + size("target_logits_ptr")
    else:
        per += size("uniform_probs_ptr") + size("target_probs_ptr") + size("draft_probs_ptr")
    return cu.numel() * (cu.element_size() + size("is_greedy_ptr")) + t * per


_COMMON_HEAD = (
    ptr("cu_num_draft_tokens_ptr", INT, I32, "[B] inclusive cumulative draft counts"),
    ptr("draft_token_ids_ptr", INT, I32, "[T] draft tokens; ids outside [0, V) never defer and are never looked up"),
)
_COMMON_TAIL = (
    scalar("vocab_size", "V, the row stride of the [T, V] tensors"),
    real("fly_entropy_threshold", "a rejection is deferred only at an entropy at least this (float32)"),
)

APPLY_FLY_GREEDY = KernelSpec(
    name=K19,
    family="fly",
    qualname=f"{_MODULE}.{K19}",
    params=(
        *_COMMON_HEAD,
        ptr("target_argmax_ptr", INT, I64, "[T] target argmax; a deferred position gets its draft", role=Role.INOUT),
        ptr("target_logits_ptr", (F32,), F32, "[T, V] target logits; the draft's must be > -inf to defer", ndim=(2,)),
        ptr("fly_entropy_ptr", (F32,), F32, "[T] top-k entropy of the target"),
        ptr("is_greedy_ptr", (BOOL,), BOOL, "[B] rows this kernel handles; None = all", optional=True),
        *_COMMON_TAIL,
        constexpr("FLY_WINDOW_SIZE", "W: natively accepted drafts that must follow a deferred one"),
    ),
    grid=lambda a: (a["cu_num_draft_tokens_ptr"].numel(),),
    preconditions=_greedy_preconditions,
    explain=_explain,
    rule=_rule,
    bytes_moved=_bytes,
)

APPLY_FLY_RANDOM = KernelSpec(
    name=K20,
    family="fly",
    qualname=f"{_MODULE}.{K20}",
    params=(
        *_COMMON_HEAD,
        ptr("draft_probs_ptr", (F32,), F32, "[T, V] q, or None for one-hot drafts (q = 1)", optional=True, ndim=(2,)),
        ptr("target_probs_ptr", (F32,), F32, "[T, V] p", ndim=(2,)),
        ptr("uniform_probs_ptr", (F64,), F64, "[T] uniforms; a deferred position gets 0.0", role=Role.INOUT),
        ptr("fly_entropy_ptr", (F32,), F32, "[T] top-k entropy of the target"),
        ptr("is_greedy_ptr", (BOOL,), BOOL, "[B] rows this kernel skips"),
        *_COMMON_TAIL,
        constexpr("NO_DRAFT_PROBS", "drafts are one-hot: q = 1"),
        constexpr("FLY_WINDOW_SIZE", "W: natively accepted drafts that must follow a deferred one"),
    ),
    grid=lambda a: (a["cu_num_draft_tokens_ptr"].numel(),),
    preconditions=_random_preconditions,
    flags=(Flag("NO_DRAFT_PROBS", "draft_probs_ptr", lambda x: x is None, "draft_probs_ptr is None"),),
    explain=_explain,
    rule=_rule,
    bytes_moved=_bytes,
)

SPECS = (APPLY_FLY_GREEDY, APPLY_FLY_RANDOM)
