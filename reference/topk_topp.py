"""The PyTorch oracle of the top-k/top-p mask (docs/topk_topp.md, C35): the readable specification.

A row's tokens are ranked by logit, largest first, equal logits (-0.0 equal to +0.0) by column,
lowest first. Top-k keeps the first k of that order; top-p then keeps the shortest prefix of what
remains whose mass reaches p. Mass is exact: a token's weight is ``floor(exp32(x - max) * 2**32)``,
an integer (C29's float32 exp), a set's mass the integer sum of its weights, and a prefix
reaches p when its mass is at least ``p * Z`` (float64, one rounding), Z the mass of everything
top-k kept. Every other cell of the row becomes MASK_VALUE; a row neither step applies to, or
whose logits are all -inf, is untouched.
"""

from __future__ import annotations

import torch

from conformance.kernels import topk_topp as contracts
from reference.gumbel import exp32

F32, F64, I64 = torch.float32, torch.float64, torch.int64


def weights(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Each logit's integer weight against the row maximum ``m``: ``floor(exp32(x - m) * 2**32)``."""
    return (exp32(x - m) * 4294967296.0).to(I64)  # the float32 product is exact; the cast floors


def applies(x: torch.Tensor, k: int | None, p: float | None, split: bool) -> tuple[bool, bool]:
    """(top-k, top-p) for a row: top-k when k < V and more than k logits are finite; top-p when
    p < 1, unless the split kernels own the row (SPLIT_COVERS_PONLY with K given and k >= V)."""
    v, finite = x.numel(), int((x > float("-inf")).sum())
    topk = k is not None and k < v and finite > k
    topp = p is not None and p < 1.0 and finite > 0 and not (split and k is not None and k >= v)
    return topk, topp


def stages(x: torch.Tensor, k: int | None, p: float | None, split: bool) -> dict[str, torch.Tensor]:
    """The columns each applying step keeps, in rank order: {"top-k": ..., "top-p": ...}."""
    topk, topp = applies(x, k, p, split)
    out: dict[str, torch.Tensor] = {}
    if not (topk or topp):
        return out
    order = torch.sort(x, descending=True, stable=True).indices  # ties: lowest column first
    kept = order[:k] if topk else order
    if topk:
        out["top-k"] = kept
    if topp:
        u = weights(x[kept], x.max())
        z = int(u.sum())
        need = float(torch.tensor(p, dtype=F32).to(F64)) * float(z)  # one float64 rounding
        before = (torch.cumsum(u, 0) - u).to(F64)  # exact: every mass is below 2**53
        kept = kept[before < need]
        out["top-p"] = kept
    return out


def cutoffs(x: torch.Tensor, k: int | None, p: float | None, split: bool) -> dict[str, tuple[float, int, int]]:
    """Per applying step: (the last kept logit v, how many kept equal v, how many kept)."""
    out = {}
    for stage, kept in stages(x, k, p, split).items():
        last = x[kept[-1]]
        out[stage] = (float(last), int((x[kept] == last).sum()), kept.numel())
    return out


def _topk_topp_kernel(
    LOGITS: torch.Tensor,
    LOGITS_STRIDE_0: int,
    BUFFER: torch.Tensor,
    PERCENTILE_TO_STD_TABLE: torch.Tensor,
    NORMAL_CDF_TO_SIGMA_TABLE: torch.Tensor,
    K: torch.Tensor | None,
    P: torch.Tensor | None,
    BATCH_SIZE: int,
    VOCAB_SIZE: int,
    MASK_VALUE: float,
    BLOCK_SIZE: int,
    BLOCK_SIZE_TRUNC: int,
    TOPK_ENABLED: bool,
    TOPP_ENABLED: bool,
    SPLIT_COVERS_PONLY: bool,
) -> None:
    a = contracts.TOPK_TOPP.bind((), locals())
    contracts.TOPK_TOPP.check(a)
    mask = torch.tensor(MASK_VALUE, dtype=F32)  # a constexpr float, rounded to float32
    for r in range(BATCH_SIZE):
        x = contracts.row_values(a, r)  # a view: written in place
        k, p = contracts.row_steps(a, r)
        kept = list(stages(x, k, p, bool(SPLIT_COVERS_PONLY)).values())
        if kept:
            drop = torch.ones(VOCAB_SIZE, dtype=torch.bool)
            drop[kept[-1]] = False
            x[drop] = mask
