"""The PyTorch oracle of the FLy pre-pass (docs/fly.md, C33): the readable specification.

A position t of a request with n drafts (local position ``pos``) is *deferred* when the kernel
would reject it, its target finds it plausible, the target is uncertain there (entropy at least
the threshold), and the W drafts after it are all accepted natively. Deferring rewrites the one
input its V1 kernel decides by, so that the unchanged kernel accepts it. Every test reads the
values the launch started with: a program writes only the position it decides, and windows look
forward.
"""

from __future__ import annotations

import torch

from contracts.spec import counts, starts


def _positions(cu: torch.Tensor, rows: list[bool] | None) -> list[tuple[int, int]]:
    """(start, n) of every request the kernel processes."""
    spans = list(zip(starts(cu).tolist(), counts(cu).tolist()))
    return [span for r, span in enumerate(spans) if rows is None or rows[r]]


def _deferred(spans: list[tuple[int, int]], window: int, defers: list[bool], native: list[bool]) -> list[int]:
    """Positions t with ``defers[t]``, ``pos + W < n`` and ``native`` at every t + 1 .. t + W."""
    out = []
    for s, n in spans:
        for pos in range(n - window):  # pos + W < n
            t = s + pos
            if defers[t] and all(native[t + 1 : t + window + 1]):
                out.append(t)
    return out


def apply_fly_greedy_acceptance_kernel(
    cu_num_draft_tokens_ptr: torch.Tensor,
    draft_token_ids_ptr: torch.Tensor,
    target_argmax_ptr: torch.Tensor,
    target_logits_ptr: torch.Tensor,
    fly_entropy_ptr: torch.Tensor,
    is_greedy_ptr: torch.Tensor | None,
    vocab_size: int,
    fly_entropy_threshold: float,
    FLY_WINDOW_SIZE: int,
) -> None:
    cu = cu_num_draft_tokens_ptr
    t_all = int(cu[-1]) if cu.numel() else 0
    v = vocab_size
    draft = draft_token_ids_ptr[:t_all].to(torch.int64)
    argmax = target_argmax_ptr[:t_all].to(torch.int64)
    valid = (draft >= 0) & (draft < v)
    # The draft's own target logit, read only where the id is a column; -inf (never defers) elsewhere.
    rows = torch.arange(t_all)
    logit = torch.full((t_all,), float("-inf"))
    logit[valid] = target_logits_ptr[rows[valid], draft[valid]]
    threshold = torch.tensor(fly_entropy_threshold, dtype=torch.float32)  # passed as float32
    # Rejected (the draft is not the argmax) yet plausible and uncertain; NaN entropy or logit never defers.
    defers = (draft != argmax) & valid & (fly_entropy_ptr[:t_all] >= threshold) & (logit > float("-inf"))
    greedy = None if is_greedy_ptr is None else is_greedy_ptr.tolist()
    spans = _positions(cu, greedy)
    for t in _deferred(spans, FLY_WINDOW_SIZE, defers.tolist(), (draft == argmax).tolist()):
        target_argmax_ptr[t] = int(draft[t])


def apply_fly_random_acceptance_kernel(
    cu_num_draft_tokens_ptr: torch.Tensor,
    draft_token_ids_ptr: torch.Tensor,
    draft_probs_ptr: torch.Tensor | None,
    target_probs_ptr: torch.Tensor,
    uniform_probs_ptr: torch.Tensor,
    fly_entropy_ptr: torch.Tensor,
    is_greedy_ptr: torch.Tensor,
    vocab_size: int,
    fly_entropy_threshold: float,
    NO_DRAFT_PROBS: bool,
    FLY_WINDOW_SIZE: int,
) -> None:
    cu = cu_num_draft_tokens_ptr
    t_all = int(cu[-1]) if cu.numel() else 0
    draft = draft_token_ids_ptr[:t_all].to(torch.int64)
    valid = (draft >= 0) & (draft < vocab_size)
    rows, col = torch.arange(t_all)[valid], draft[valid]
    # p and q at the draft; an id outside [0, V) reads nothing and counts as p = q = 0.
    p = torch.zeros(t_all)
    p[valid] = target_probs_ptr[rows, col]
    q = torch.ones(t_all)
    if not NO_DRAFT_PROBS:
        q.zero_()
        q[valid] = draft_probs_ptr[rows, col]
    u = uniform_probs_ptr[:t_all]
    # K2's test: the float32 quotient (C6), widened exactly, against the float64 uniform (C7); q > 0 (C9).
    native = valid & (q > 0) & ((p / q).to(torch.float64) >= u)
    threshold = torch.tensor(fly_entropy_threshold, dtype=torch.float32)
    defers = ~native & valid & (q > 0) & (p > 0) & (fly_entropy_ptr[:t_all] >= threshold)
    spans = _positions(cu, [not g for g in is_greedy_ptr.tolist()])
    for t in _deferred(spans, FLY_WINDOW_SIZE, defers.tolist(), native.tolist()):
        uniform_probs_ptr[t] = 0.0  # K2 then accepts: p/q >= 0 (unless p = q = inf: NaN)
