"""Batches of the rejection sampler: ragged drafts, greedy / random / mixed rows, synthetic
mode, one-hot and tied probability rows, -1 padded drafts and boundary uniforms."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.runner import poison_value
from conformance.strategies import cases_for, generator, inclusive_cumsum, int_dtypes, ragged_counts, seeds
from conformance.strategies.metadata import padding
from contracts import rejection as contract
from contracts.spec import cdiv, counts

# Tiny, power-of-two and awkward vocabularies; the C++ chunk (4096) and Triton tiles see edges.
VOCABS = st.sampled_from([8, 1, 2, 3, 5, 16, 17, 31, 100, 257, 4099])
ROW_KINDS = ("random", "one_hot", "zeros", "ties", "sparse", "same_as_target")


@dataclass
class Batch:
    """One speculative-decoding step's shape and draft tokens, shared by K1, K2 and K4."""

    n: list[int]  # drafts per request
    max_spec_len: int
    vocab: int
    cu: torch.Tensor
    draft: torch.Tensor
    greedy: list[bool]  # temperature == 0 rows
    rows: str  # "greedy", "random" or "mixed"
    seed: int

    @property
    def b(self) -> int:
        return len(self.n)

    @property
    def t(self) -> int:
        return sum(self.n)


@st.composite
def batches(draw: st.DrawFn, max_requests: int = 8, max_len: int = 6, out_of_vocab: bool = False) -> Batch:
    """A ragged batch: 0..max_requests requests of 0..max_len drafts, drafts in [-1, V)
    (or up to 2V in synthetic mode, whose out-of-vocabulary drafts are written verbatim)."""
    # An empty batch is valid and worth a few examples, but not Hypothesis' usual quarter of them.
    n = draw(ragged_counts(max_requests, max_len, min_requests=1 if draw(st.integers(0, 9)) else 0))
    s = max(n, default=0) + draw(st.integers(0, 2))  # S >= every n(r); sometimes wider rows
    v = draw(VOCABS)
    rows = draw(st.sampled_from(["mixed", "greedy", "random"]))
    if rows == "mixed":
        greedy = draw(st.lists(st.booleans(), min_size=len(n), max_size=len(n)))
    else:
        greedy = [rows == "greedy"] * len(n)
    seed = draw(seeds)
    g = generator(seed)
    t = sum(n)
    hi = 2 * v if out_of_vocab else v
    draft = torch.randint(0, hi, (t,), generator=g)
    # -1 padding at drawn places (C10)
    for i in draw(st.lists(st.integers(0, max(t - 1, 0)), max_size=3 if t else 0)):
        draft[i] = -1
    cu = inclusive_cumsum(n, draw(int_dtypes))
    event(f"rows: {rows}")
    if t == 0:
        event("no drafts in the batch")
    return Batch(n, s, v, cu, draft.to(draw(int_dtypes)), greedy, rows, seed)


def prob_rows(g: torch.Generator, kinds: list[str], v: int, draft: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
    """float32 probability rows of the named kinds: random, one-hot (at the draft), all zero,
    few tied values, mostly exact zeros, or a copy of ``like`` (residual zero, ratio one)."""
    out = torch.empty(len(kinds), v, dtype=torch.float32)
    for i, kind in enumerate(kinds):
        if kind == "one_hot":
            row = torch.zeros(v)
            d = int(draft[i]) if 0 <= int(draft[i]) < v else int(torch.randint(0, v, (1,), generator=g))
            row[d] = 1.0
        elif kind == "zeros":
            row = torch.zeros(v)
        elif kind == "ties":
            row = torch.randint(0, 3, (v,), generator=g).float()
            row = row / row.sum() if row.sum() > 0 else row
        elif kind == "sparse":
            row = torch.rand(v, generator=g) * (torch.rand(v, generator=g) < 0.2)
            row = row / row.sum() if row.sum() > 0 else row
        elif kind == "same_as_target" and like is not None:
            row = like[i]
        else:
            row = torch.empty(v).exponential_(generator=g)
            row = row / row.sum()
        out[i] = row
    return out


def draft_ratio(target: torch.Tensor, draft_probs: torch.Tensor | None, draft: torch.Tensor, v: int) -> torch.Tensor:
    """K2's float32 ratio p/q at each token's draft (q = 1 without draft probabilities; an id
    outside [0, V) reads column 0 or V - 1), widened to float64: where >= and > part."""
    t = draft.numel()
    col = draft.to(torch.int64).clamp(0, v - 1)
    p = target[torch.arange(t), col]
    q = torch.ones_like(p) if draft_probs is None else draft_probs[torch.arange(t), col]
    return (p / q).to(torch.float64)


def row_kinds(draw: st.DrawFn, t: int, allowed: tuple[str, ...]) -> list[str]:
    """Mostly random rows, with drawn exceptions (shrinks toward all random)."""
    kinds = ["random"] * t
    for i, kind in draw(st.lists(st.tuples(st.integers(0, max(t - 1, 0)), st.sampled_from(allowed)), max_size=4 if t else 0)):
        kinds[i] = kind
    return kinds


def prefilled_output(b: int, s: int, dtype: torch.dtype) -> torch.Tensor:
    """The output token ids, pre-filled with -1 as the caller does (the runner then poisons it, §1.13)."""
    return torch.full((b, s + 1), -1, dtype=dtype)


def _bonus(g: torch.Generator, b: int, v: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randint(0, v, (b, 1), generator=g).to(dtype)


@st.composite
def _synthetic_rates(draw: st.DrawFn, s: int) -> torch.Tensor:
    """Conditional rates for K >= S positions: 0 and 1 and anything between."""
    k = s + draw(st.integers(0, 2))
    rate = st.one_of(st.sampled_from([1.0, 0.0, 0.5]), st.floats(0.0, 1.0, width=32))
    return torch.tensor(draw(st.lists(rate, min_size=k, max_size=k)), dtype=torch.float32)


@st.composite
def uniforms(draw: st.DrawFn, g: torch.Generator, t: int, boundary: torch.Tensor | None = None) -> torch.Tensor:
    """float64 uniforms in [0, 1); drawn cells are 0.0 or sit exactly on ``boundary`` (the float32
    ratio or rate, widened) or one float64 ulp above it — where >= and > part."""
    u = torch.rand(t, dtype=torch.float64, generator=g)
    for i, how in draw(st.lists(st.tuples(st.integers(0, max(t - 1, 0)), st.sampled_from(["above", "on", "zero"])), max_size=3 if t else 0)):
        if how == "zero" or boundary is None:
            u[i] = 0.0
        else:
            x = float(boundary[i])
            if not 0.0 <= x < 1.0:
                continue
            u[i] = x if how == "on" else float(torch.nextafter(torch.tensor(x, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64)))
    return u


def _rate_on_first(draw: st.DrawFn, u: torch.Tensor, bt: Batch, rates: torch.Tensor) -> int | None:
    """In half the synthetic cases, one request's first uniform sits exactly on the first rate: the
    first test always runs, and there C8's strict u < rate parts from u <= rate. Planted cells alone
    (``uniforms``) reached it too rarely: a non-strict port survived 2 of 10 seeds of 200. One
    request only, so the others keep their acceptance chains (placeholders later in a row). Returns
    the cell it planted, or None."""
    firsts = [s for s, n in zip(itertools.accumulate([0, *bt.n[:-1]]), bt.n) if n]
    if not draw(st.booleans()) or not firsts or not len(rates) or not 0.0 <= float(rates[0]) < 1.0:
        return None
    i = firsts[draw(st.integers(0, len(firsts) - 1))]
    u[i] = float(rates[0])
    return i


def _placeholder_on_first(draw: st.DrawFn, u: torch.Tensor, bt: Batch, rates: torch.Tensor, taken: int | None) -> None:
    """In half the synthetic K1 cases, one request's first draft (not the one ``_rate_on_first``
    planted) is a -1 placeholder whose uniform (0) is below a positive first rate: the rate alone
    would accept it, C10 refuses it. Placeholders drawn anywhere in a row were reached under too few
    of ten seeds for a port that forgot C10."""
    firsts = [s for s, n in zip(itertools.accumulate([0, *bt.n[:-1]]), bt.n) if n and s != taken]
    if not draw(st.booleans()) or not firsts or not len(rates) or (taken is not None and not float(rates[0]) > 0.0):
        return  # a zero first rate the other corner sits on stays zero
    i = firsts[draw(st.integers(0, len(firsts) - 1))]
    bt.draft[i], u[i] = -1, 0.0
    if not float(rates[0]) > 0.0:
        rates[0] = 0.5


@cases_for("rejection_greedy_sample_kernel")
def greedy_cases() -> st.SearchStrategy[Case]:
    return _greedy_cases()


@st.composite
def _greedy_cases(draw: st.DrawFn) -> Case:
    synthetic = draw(st.booleans())
    bt = draw(batches(out_of_vocab=synthetic))
    g = generator(bt.seed + 1)
    # Most argmaxes equal the draft so acceptance chains form; the rest are random tokens.
    argmax = torch.where(
        torch.rand(bt.t, generator=g) < 0.7, bt.draft.to(torch.int64).clamp(0, bt.vocab - 1), torch.randint(0, bt.vocab, (bt.t,), generator=g)
    ).to(draw(st.sampled_from([torch.int64, torch.int32])))
    rates = draw(_synthetic_rates(bt.max_spec_len)) if synthetic else None
    if synthetic:
        pos = torch.cat([torch.arange(k) for k in bt.n]) if bt.t else torch.zeros(0, dtype=torch.int64)
        u = draw(uniforms(g, bt.t, rates[pos].to(torch.float64)))
        _placeholder_on_first(draw, u, bt, rates, _rate_on_first(draw, u, bt, rates))
    else:
        u = draw(st.sampled_from([None, "given"]))
        u = None if u is None else torch.rand(bt.t, dtype=torch.float64, generator=g)
    is_greedy = None if bt.rows == "greedy" and draw(st.booleans()) else torch.tensor(bt.greedy, dtype=torch.bool)
    if synthetic:
        event("synthetic")
    args = dict(
        output_token_ids_ptr=prefilled_output(bt.b, bt.max_spec_len, draw(int_dtypes)),
        cu_num_draft_tokens_ptr=bt.cu,
        draft_token_ids_ptr=bt.draft,
        target_argmax_ptr=argmax,
        bonus_token_ids_ptr=_bonus(g, bt.b, bt.vocab, draw(int_dtypes)),
        is_greedy_ptr=is_greedy,
        max_spec_len=bt.max_spec_len,
        uniform_probs_ptr=u,
        synthetic_conditional_rates_ptr=rates,
        SYNTHETIC_MODE=synthetic,
    )
    return Case("rejection_greedy_sample_kernel", args)


def _corners_on_first(draw: st.DrawFn, u: torch.Tensor, bt: Batch, target: torch.Tensor, draft_probs: torch.Tensor | None) -> None:
    """Aim at the first test of the random rows, which always runs, one corner per row as far as
    they go: u == ratio (accepted: the test is u <= ratio, C7), u one float64 ulp above it (refused,
    but accepted by a port that narrows u to float32), a draft of probability 0 under the uniform
    0 (accepted by a non-strict test without draft probabilities) and, with draft probabilities,
    q == 0 (refused whatever p is, C9). Cells planted anywhere reached them under too few seeds."""
    v = bt.vocab
    starts = torch.cumsum(torch.tensor([0, *bt.n[:-1]], dtype=torch.int64), 0).tolist() if bt.n else []
    firsts = [s for s, n, greedy in zip(starts, bt.n, bt.greedy) if n and not greedy and 0 <= int(bt.draft[s]) < v]
    corners = ["u == ratio", "u above ratio", "p == 0" if draft_probs is None else "q == 0"]
    for i, how in zip(firsts, draw(st.permutations(corners))):
        d = int(bt.draft[i])
        if how == "p == 0":
            target[i, d], u[i] = 0.0, 0.0
            continue
        if how == "q == 0":
            draft_probs[i, d] = 0.0
            if not float(target[i, d]) > 0.0:
                target[i, d] = 0.375  # an infinite ratio, were q == 0 let through
            continue
        if not 0.0 < float(target[i, d]) < 1.0:  # nothing to sit on in [0, 1) (uniforms' range)
            target[i, d] = 0.375  # the kernel reads the one cell; a row need not sum to 1
        if draft_probs is not None and not 0.0 < float(draft_probs[i, d]) <= 1.0:
            draft_probs[i, d] = 0.75
        ratio = float(draft_ratio(target[i:i + 1], None if draft_probs is None else draft_probs[i:i + 1], bt.draft[i:i + 1], v)[0])
        if not 0.0 <= ratio < 1.0:
            continue
        x = torch.tensor(ratio, dtype=torch.float64)
        u[i] = ratio if how == "u == ratio" else float(torch.nextafter(x, torch.tensor(2.0, dtype=torch.float64)))


@cases_for("rejection_random_sample_kernel")
def random_cases() -> st.SearchStrategy[Case]:
    return _random_cases()


@st.composite
def _random_cases(draw: st.DrawFn) -> Case:
    synthetic = draw(st.booleans())
    bt = draw(batches(out_of_vocab=synthetic))
    g = generator(bt.seed + 1)
    t, v = bt.t, bt.vocab
    no_draft_probs = draw(st.booleans())
    target = prob_rows(g, row_kinds(draw, t, ROW_KINDS[:-1]), v, bt.draft)
    draft_probs = None if no_draft_probs else prob_rows(g, row_kinds(draw, t, ROW_KINDS), v, bt.draft, like=target)
    rates = draw(_synthetic_rates(bt.max_spec_len)) if synthetic else None
    if synthetic:
        pos = torch.cat([torch.arange(k) for k in bt.n]) if t else torch.zeros(0, dtype=torch.int64)
        boundary = rates[pos].to(torch.float64)
    else:
        boundary = draft_ratio(target, draft_probs, bt.draft, v)
    u = draw(uniforms(g, t, boundary))
    if synthetic:
        _rate_on_first(draw, u, bt, rates)
    if not synthetic:
        _corners_on_first(draw, u, bt, target, draft_probs)
    if synthetic:
        event("synthetic")
    args = dict(
        output_token_ids_ptr=prefilled_output(bt.b, bt.max_spec_len, draw(int_dtypes)),
        cu_num_draft_tokens_ptr=bt.cu,
        draft_token_ids_ptr=bt.draft,
        draft_probs_ptr=draft_probs,
        target_probs_ptr=target,
        bonus_token_ids_ptr=_bonus(g, bt.b, v, draw(int_dtypes)),
        recovered_token_ids_ptr=torch.randint(0, v, (t,), generator=g).to(draw(int_dtypes)),
        uniform_probs_ptr=u,
        is_greedy_ptr=torch.tensor(bt.greedy, dtype=torch.bool),
        max_spec_len=bt.max_spec_len,
        vocab_size=v,
        synthetic_conditional_rates_ptr=rates,
        NO_DRAFT_PROBS=no_draft_probs,
        SYNTHETIC_MODE=synthetic,
    )
    return Case("rejection_random_sample_kernel", args)


@cases_for("expand_kernel")
def expand_cases() -> st.SearchStrategy[Case]:
    return _expand_cases()


@st.composite
def _expand_cases(draw: st.DrawFn) -> Case:
    dtype = draw(st.sampled_from([torch.float32, torch.int32, torch.int64]))
    max_tokens = draw(st.sampled_from([128, 1, 2, 4]))
    n = draw(ragged_counts(8, 6 if max_tokens == 128 else 2 * max_tokens + 1))
    b = len(n)
    replace_from = draw(st.sampled_from([0, -1, 1]))
    replace_to = draw(st.sampled_from([1, 0, -1, 7]))
    if dtype.is_floating_point:
        special = st.sampled_from([0.0, -0.0, float("nan"), float(replace_from), 0.7, 1.5, float("inf")])
        values = st.one_of(special, st.floats(-1e6, 1e6, width=32))
    else:
        values = st.one_of(st.sampled_from([0, replace_from, 5, 100]), st.integers(-(2**31) + 2, 2**31 - 1))
    x = torch.tensor(draw(st.lists(values, min_size=b, max_size=b)), dtype=dtype) if b else torch.zeros(0, dtype=dtype)
    out = torch.zeros(sum(n) + padding(draw), dtype=dtype)
    args = dict(
        output_ptr=out,
        input_ptr=x,
        cu_num_tokens_ptr=inclusive_cumsum(n, draw(int_dtypes)),
        replace_from=replace_from,
        replace_to=replace_to,
        MAX_NUM_TOKENS=max_tokens,
    )
    return Case("expand_kernel", args)


def _block_size(draw: st.DrawFn, v: int) -> int:
    """The call site's 8192, or a small tile so that ties and maxima cross tile edges; at most
    32 tiles per row, which keeps the interpreted Triton backend quick."""
    bs = draw(st.sampled_from([8192, 2, 4, 16, 64]))
    return bs if cdiv(v, bs) <= 32 else 8192


@cases_for("sample_recovered_tokens_kernel")
def recovered_cases() -> st.SearchStrategy[Case]:
    return _recovered_cases()


@st.composite
def _recovered_cases(draw: st.DrawFn) -> Case:
    bt = draw(batches())
    g = generator(bt.seed + 1)
    t, v = bt.t, bt.vocab
    no_draft_probs = draw(st.booleans())
    fp64 = draw(st.booleans())
    # All-ones noise makes ties decide; float64 noise within 2**-30 of one is all 1.0 in float32, so
    # tied residuals are ranked by noise that a float32 narrowing erases (C17).
    noise = draw(st.sampled_from(["exponential", "ones", "ties below float32"] if fp64 else ["exponential", "ones"]))
    kinds = ["ties"] * t if noise == "ties below float32" else row_kinds(draw, t, ROW_KINDS[:-1])
    target = prob_rows(g, kinds, v, bt.draft)
    draft_probs = None if no_draft_probs else prob_rows(g, ["zeros"] * t if noise == "ties below float32" else row_kinds(draw, t, ROW_KINDS), v, bt.draft, like=target)
    # NaN probabilities: never win with NO_DRAFT_PROBS, give a zero residual otherwise (C15, C16).
    for i, j in draw(st.lists(st.tuples(st.integers(0, max(t - 1, 0)), st.integers(0, v - 1)), max_size=2 if t else 0)):
        target[i, j] = float("nan")
    dtype = torch.float64 if fp64 else torch.float32
    if noise == "ones":
        inv_q = torch.ones(bt.b, v, dtype=dtype)
    elif noise == "ties below float32":
        inv_q = 1.0 + torch.randint(0, 2**10, (bt.b, v), generator=g, dtype=torch.float64) * 2.0**-40
        event("float64 noise tied in float32")
    else:
        inv_q = 1.0 / torch.empty(bt.b, v, dtype=dtype).exponential_(generator=g)
    args = dict(
        output_token_ids_ptr=torch.zeros(t + padding(draw), dtype=draw(int_dtypes)),
        cu_num_draft_tokens_ptr=bt.cu,
        draft_token_ids_ptr=bt.draft,
        draft_probs_ptr=draft_probs,
        target_probs_ptr=target,
        inv_q_ptr=inv_q,
        vocab_size=v,
        BLOCK_SIZE=_block_size(draw, v),
        NO_DRAFT_PROBS=no_draft_probs,
        USE_FP64_GUMBEL=fp64,
    )
    return Case("sample_recovered_tokens_kernel", args)


# -- state classes: what the cases must reach (conformance/coverage.py) --------------------------
K1, K2, K3, K4 = (s.name for s in (contract.REJECTION_GREEDY, contract.REJECTION_RANDOM, contract.EXPAND, contract.SAMPLE_RECOVERED))


def _rows(kernel: str, a: Args, out: Outputs) -> list[tuple[int, int, list[Any]]]:
    """(n, start, written row cells as values or None for untouched) of every row the kernel processes."""
    cu = a["cu_num_draft_tokens_ptr"]
    g = a["is_greedy_ptr"]
    want = kernel == K1
    o = out.get("output_token_ids_ptr")
    if o is None:
        return []
    width = a["max_spec_len"] + 1
    flat = o.reshape(-1).tolist()
    poison = poison_value(o.dtype)
    rows = []
    n_all = counts(cu).tolist()
    start = 0
    for r, n in enumerate(n_all):
        if g is None or bool(g[r]) == want:
            cells = [None if v == poison else v for v in flat[r * width : (r + 1) * width]]
            rows.append((n, start, cells))
        start += n
    return rows


def _all_accepted(kernel: str, a: Args, out: Outputs) -> int:
    return sum(1 for n, _, cells in _rows(kernel, a, out) if n >= 1 and cells[n] is not None)


def _first_rejected(kernel: str, a: Args, out: Outputs) -> int:
    return sum(1 for n, _, cells in _rows(kernel, a, out) if n >= 1 and cells[1] is None)


def _rejected_later(kernel: str, a: Args, out: Outputs) -> int:
    return sum(1 for n, _, cells in _rows(kernel, a, out) if n >= 2 and cells[1] is not None and cells[n] is None)


def _zero_draft_rows(kernel: str, a: Args, out: Outputs) -> int:
    if kernel in (K1, K2):
        return sum(1 for n, _, _ in _rows(kernel, a, out) if n == 0)
    cu = a["cu_num_draft_tokens_ptr"]  # K4 computes every row
    return int((counts(cu) == 0).sum()) if cu.numel() else 0


def _synthetic_rows(kernel: str, a: Args, out: Outputs) -> int:
    return len(_rows(kernel, a, out)) if a["SYNTHETIC_MODE"] else 0


def _mixed(kernel: str, a: Args, out: Outputs) -> int:
    g = a["is_greedy_ptr"]
    b = a["cu_num_draft_tokens_ptr"].numel()
    return int(g is not None and b > 0 and bool(g[:b].any()) and not bool(g[:b].all()))


def _placeholder_drafts(kernel: str, a: Args, out: Outputs) -> int:
    d = a["draft_token_ids_ptr"]
    if kernel in (K1, K2):
        return sum(int((d[s : s + n] == -1).sum()) for n, s, _ in _rows(kernel, a, out))
    t = int(a["cu_num_draft_tokens_ptr"][-1]) if a["cu_num_draft_tokens_ptr"].numel() else 0
    return int((d[:t] == -1).sum())


def _longest_accepted_chain(kernel: str, a: Args, out: Outputs) -> int:
    """Drafts accepted in a row, the longest over the batch: a ``target()`` to maximise."""
    best = 0
    for n, _, cells in _rows(kernel, a, out):
        accepted = n if cells[n] is not None else next((j for j in range(1, n + 1) if cells[j] is None), 1) - 1
        best = max(best, accepted)
    return best


def _cap_counts(a: Args) -> torch.Tensor:
    return counts(a["cu_num_tokens_ptr"]) if a["cu_num_tokens_ptr"].numel() else torch.zeros(0, dtype=torch.int64)


def _at_cap(kernel: str, a: Args, out: Outputs) -> int:
    return int((_cap_counts(a) == a["MAX_NUM_TOKENS"]).sum())


def _below_cap(kernel: str, a: Args, out: Outputs) -> int:
    return int((_cap_counts(a) == a["MAX_NUM_TOKENS"] - 1).sum()) if a["MAX_NUM_TOKENS"] > 1 else 0


def _no_draft_tests(a: Args) -> list[tuple[float, float]]:
    """(p, u) of every draft a NO_DRAFT_PROBS, non-synthetic K2 launch tests, in order, up to each
    row's first rejection (p >= u accepts)."""
    if not a["NO_DRAFT_PROBS"] or a["SYNTHETIC_MODE"]:
        return []
    tests = []
    v, tp, u = a["vocab_size"], a["target_probs_ptr"], a["uniform_probs_ptr"]
    g, draft = a["is_greedy_ptr"], a["draft_token_ids_ptr"]
    start = 0
    for r, n in enumerate(counts(a["cu_num_draft_tokens_ptr"]).tolist()):
        if not bool(g[r]):
            for i in range(start, start + n):
                d = int(draft[i])
                if not 0 <= d < v:
                    break
                p, x = float(tp[i, d]), float(u[i])
                tests.append((p, x))
                if not p >= x:
                    break
        start += n
    return tests


def _no_draft_on_p(kernel: str, a: Args, out: Outputs) -> int:
    return sum(1 for p, x in _no_draft_tests(a) if p == x and p > 0)


def _no_draft_zero(kernel: str, a: Args, out: Outputs) -> int:
    return sum(1 for p, x in _no_draft_tests(a) if p == x == 0)


def _capped(kernel: str, a: Args, out: Outputs) -> int:
    return int((_cap_counts(a) > a["MAX_NUM_TOKENS"]).sum())


def residual_without_winner(kernel: str, a: Args, out: Outputs) -> int:
    """K4 drafts whose residual has no positive, non-NaN score: the recovered token is index 0 (C16)."""
    t = a["draft_token_ids_ptr"].numel()
    if not t:
        return 0
    v = a["vocab_size"]
    p = a["target_probs_ptr"].reshape(-1)[: t * v].reshape(t, v)
    score = p if a["NO_DRAFT_PROBS"] else p - a["draft_probs_ptr"].reshape(-1)[: t * v].reshape(t, v)
    return int((~(score > 0).any(dim=1)).sum())


CLASSES: tuple[StateClass, ...] = (
    StateClass("all accepted", (K1, K2), _all_accepted, "a row with drafts whose every draft is accepted: the bonus is written"),
    StateClass("first draft rejected", (K1, K2), _first_rejected, "a row with drafts rejected at position 0"),
    StateClass("rejected after an accepted draft", (K1, K2), _rejected_later, "a row accepted at position 0 and rejected before its bonus"),
    StateClass("zero drafts", (K1, K2, K4), _zero_draft_rows, "a processed row without drafts: only the bonus (K1, K2), nothing (K4)"),
    StateClass("synthetic rows", (K1, K2), _synthetic_rows, "rows decided by u < rate (SYNTHETIC_MODE)"),
    StateClass("mixed greedy and random", (K1, K2), _mixed, "a batch with greedy and random rows (C14)"),
    StateClass("placeholder drafts", (K1, K2, K4), _placeholder_drafts, "-1 draft tokens (C10, C16)"),
    StateClass("capped at MAX_NUM_TOKENS", (K3,), _capped, "a request with more tokens than MAX_NUM_TOKENS (C18)"),
    StateClass("exactly MAX_NUM_TOKENS", (K3,), _at_cap, "a request of MAX_NUM_TOKENS tokens: all written, none cut"),
    StateClass("one below MAX_NUM_TOKENS", (K3,), _below_cap, "a request of MAX_NUM_TOKENS - 1 tokens (MAX_NUM_TOKENS > 1)"),
    StateClass("u == p without draft probabilities", (K2,), _no_draft_on_p, "NO_DRAFT_PROBS: a draft tested with u exactly p > 0 (accepted: non-strict)"),
    StateClass("u == p == 0 without draft probabilities", (K2,), _no_draft_zero, "NO_DRAFT_PROBS: a zero-probability draft tested with u = 0 (accepted)"),
    StateClass("residual with no winner: token 0", (K4,), residual_without_winner,
               "every residual score is <= 0 or NaN: vLLM's argmax returns index 0, a token nobody proposed (C16)", required=False, hazard=True),
)

# Hypothesis target() per kernel: (label, function); maximised during generation.
TARGETS: dict[str, tuple[str, Callable[[str, Args, Outputs], int]]] = {
    K1: ("longest accepted chain", _longest_accepted_chain),
    K2: ("longest accepted chain", _longest_accepted_chain),
}
