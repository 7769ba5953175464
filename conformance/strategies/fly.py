"""Batches of the FLy pre-pass: the rejection sampler's batches, with entropies at and around the
threshold, windows that fit and do not fit, drafts outside the vocabulary, and acceptance runs
planted so that deferrals happen."""

from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.strategies import cases_for, generator
from conformance.strategies.rejection import ROW_KINDS, Batch, batches, draft_ratio, prob_rows, row_kinds, uniforms
from contracts import fly as contract
from contracts.spec import counts

# The config's default 0.3, its bounds, a value float32 rounds (0.1), a negative one and infinity
# (FLy off, except for an infinite entropy); then any float32 in [0, 4].
THRESHOLDS = st.one_of(st.sampled_from([0.3, 0.0, 0.1, 1.0, -1.0, float("inf")]), st.floats(0.0, 4.0, width=32))
# vLLM's default is min(6, K - 1); 0 examines no window; a window as long as the row never fits.
WINDOWS = st.sampled_from([1, 2, 0, 3, 6, 1000])


@st.composite
def _entropy(draw: st.DrawFn, g: torch.Generator, t: int, threshold: float, hot: list[int]) -> torch.Tensor:
    """float32 entropies in [0, 3), the ``hot`` cells at least the threshold; drawn cells sit on the
    float32 threshold, one float32 step below it (where >= and > part), or are NaN or infinite."""
    e = torch.rand(t, generator=g) * 3
    thr = torch.tensor(threshold, dtype=torch.float32)
    # Hot cells meet the threshold: exactly on it (the test is >=), or above.
    e[hot] = thr if draw(st.booleans()) else torch.maximum(e[hot], thr)
    for i, how in draw(st.lists(st.tuples(st.integers(0, max(t - 1, 0)), st.sampled_from(["on", "below", "nan", "inf"])),
                                max_size=3 if t else 0)):
        if how == "on":
            e[i] = thr
        elif how == "below":
            e[i] = torch.nextafter(thr, torch.tensor(float("-inf")))
        else:
            e[i] = float(how)
    return e


def _plant_runs(draw: st.DrawFn, bt: Batch, greedy: bool, window: int, reject: torch.Tensor, accept: torch.Tensor) -> list[int]:
    """At drawn positions that could defer (a row the kernel processes, ``pos + W < n``), a rejected
    position followed by ``window`` accepted ones, marked in ``reject`` and ``accept`` for the caller
    to apply; returns the rejected positions."""
    eligible, start = [], 0
    for n, row_greedy in zip(bt.n, bt.greedy):
        if row_greedy == greedy:
            eligible += range(start, start + n - window)
        start += n
    cells = draw(st.lists(st.sampled_from(eligible), min_size=1, max_size=3)) if eligible else []
    for i in cells:
        reject[i] = True
        accept[i + 1 : i + 1 + window] = True
    # Chains: the position before a planted one rejected and uncertain too. Its window holds the
    # planted rejection, so it must not defer, unless the planted one's own deferral is (wrongly) seen.
    chained = [i - 1 for i in cells if i - 1 in eligible and draw(st.booleans())]
    for i in chained:
        reject[i], accept[i] = True, False
    return cells + chained


def _step(draw: st.DrawFn) -> tuple[Batch, torch.Generator, int, float]:
    """A rejection-sampler batch (a quarter of them with drafts outside the vocabulary, which FLy
    neither defers nor reads), its bulk generator, the window and the threshold."""
    bt = draw(batches(out_of_vocab=draw(st.integers(0, 3)) == 0))
    return bt, generator(bt.seed + 1), draw(WINDOWS), draw(THRESHOLDS)


def _is_greedy(draw: st.DrawFn, greedy: list[bool], optional: bool) -> torch.Tensor | None:
    if optional and all(greedy) and draw(st.booleans()):
        return None
    return torch.tensor(greedy, dtype=torch.bool)


def _greedy_row(draw: st.DrawFn, bt: Batch, window: int) -> bool:
    """Makes one request whose drafts outnumber the window greedy (so that runs can be planted in
    it); False where none does."""
    fits = [r for r, n in enumerate(bt.n) if n > window]
    if not fits:
        return False
    bt.greedy[draw(st.sampled_from(fits))] = True
    return True


def _overflowing_window(draw: st.DrawFn, bt: Batch, window: int, reject: torch.Tensor, accept: torch.Tensor) -> list[int]:
    """A rejection at the first position whose window does not fit (pos + W == n) of a request
    followed by another draft, the request made greedy, the rest of it and that next draft accepted
    (marked in ``reject`` and ``accept``): a window run one past the request's end would defer it.
    Planted runs stop where windows fit: a port off by one there survived a seed of the ci profile.
    Returns the rejected position, or none where no request is that long or none follows."""
    ends, start = [], 0
    for r, n in enumerate(bt.n):
        if window >= 1 and n >= window and start + n < bt.t:
            ends.append((r, start + n - window))
        start += n
    if not ends:
        return []
    r, i = draw(st.sampled_from(ends))
    bt.greedy[r] = True
    reject[i], accept[i] = True, False
    reject[i + 1 : i + 1 + window], accept[i + 1 : i + 1 + window] = False, True
    return [i]


def _mask_a_deferral(draw: st.DrawFn, args: dict[str, object]) -> None:
    """A position the oracle defers gets a -inf draft logit (masked by top-k: the target could
    never emit it), which must then keep it rejected. The drawn -inf cells rarely met a deferral:
    a kernel that skips the logit's test survived 5 of 10 seeds of the ci profile."""
    from reference import fly as oracle

    probe = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    oracle.apply_fly_greedy_acceptance_kernel(**probe)
    argmax, logits = args["target_argmax_ptr"], args["target_logits_ptr"]
    deferred = (probe["target_argmax_ptr"] != argmax).nonzero().flatten().tolist()
    if deferred:
        i = draw(st.sampled_from(deferred))
        logits[i, int(args["draft_token_ids_ptr"][i])] = float("-inf")
        event("a deferral's draft logit -inf")


@cases_for("apply_fly_greedy_acceptance_kernel")
def greedy_cases() -> st.SearchStrategy[Case]:
    return _greedy_cases()


@st.composite
def _greedy_cases(draw: st.DrawFn) -> Case:
    bt, g, window, threshold = _step(draw)
    t, v = bt.t, bt.vocab
    aim = draw(st.booleans()) and _greedy_row(draw, bt, window)
    col = bt.draft.to(torch.int64).clamp(0, v - 1)
    # Most argmaxes equal the draft, so that windows confirm; planted runs make deferrals likely.
    same = torch.rand(t, generator=g) < 0.7
    differ = torch.zeros(t, dtype=torch.bool)
    hot = _plant_runs(draw, bt, True, window, differ, same)
    if draw(st.booleans()):
        hot += _overflowing_window(draw, bt, window, differ, same)
    argmax = torch.where(same & ~differ, col, (col + 1 + torch.randint(0, max(v - 1, 1), (t,), generator=g)) % v)
    logits = torch.randn(t + draw(st.integers(0, 1)), v, generator=g)
    # The draft's own logit at -inf never defers; NaN neither.
    for i, value in draw(st.lists(st.tuples(st.integers(0, max(t - 1, 0)), st.sampled_from([float("-inf"), float("nan")])),
                                  max_size=2 if t else 0)):
        logits[i, col[i]] = value
    if window > 0 and t:
        event(f"window {window}")
    args = dict(
        cu_num_draft_tokens_ptr=bt.cu,
        draft_token_ids_ptr=bt.draft,
        target_argmax_ptr=argmax.to(draw(st.sampled_from([torch.int64, torch.int32]))),
        target_logits_ptr=logits,
        fly_entropy_ptr=draw(_entropy(g, t, threshold, hot)),
        is_greedy_ptr=_is_greedy(draw, bt.greedy, optional=True),
        vocab_size=v,
        fly_entropy_threshold=threshold,
        FLY_WINDOW_SIZE=window,
    )
    if aim:
        _mask_a_deferral(draw, args)
    return Case("apply_fly_greedy_acceptance_kernel", args)


@cases_for("apply_fly_random_acceptance_kernel")
def random_cases() -> st.SearchStrategy[Case]:
    return _random_cases()


@st.composite
def _random_cases(draw: st.DrawFn) -> Case:
    bt, g, window, threshold = _step(draw)
    t, v = bt.t, bt.vocab
    no_draft_probs = draw(st.booleans())
    target = prob_rows(g, row_kinds(draw, t, ROW_KINDS[:-1]), v, bt.draft)
    draft_probs = None if no_draft_probs else prob_rows(g, row_kinds(draw, t, ROW_KINDS), v, bt.draft, like=target)
    # Uniforms on and one ulp above the float32 ratio, where >= and > part (C7).
    ratio = draft_ratio(target, draft_probs, bt.draft, v)
    u = draw(uniforms(g, t, ratio))
    # Planted runs: 1.0 rejects whenever p < q, and 0.0 accepts whenever q > 0.
    reject, accept = torch.zeros(t, dtype=torch.bool), torch.zeros(t, dtype=torch.bool)
    hot = _plant_runs(draw, bt, False, window, reject, accept)
    u[accept] = 0.0
    rejected = reject & ~accept
    u[rejected] = float(torch.nextafter(torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)))
    # Or a float64 ulp above the ratio: rejected by the exact test, accepted by a ratio an ulp too high.
    above = torch.nextafter(ratio, torch.tensor(2.0, dtype=torch.float64))
    edge = rejected & (ratio > 0) & (ratio < 1) & torch.tensor([draw(st.booleans()) for _ in range(t)] if t else [], dtype=torch.bool)
    u[edge] = above[edge]
    args = dict(
        cu_num_draft_tokens_ptr=bt.cu,
        draft_token_ids_ptr=bt.draft,
        draft_probs_ptr=draft_probs,
        target_probs_ptr=target,
        uniform_probs_ptr=u,
        fly_entropy_ptr=draw(_entropy(g, t, threshold, hot)),
        is_greedy_ptr=_is_greedy(draw, bt.greedy, optional=False),
        vocab_size=v,
        fly_entropy_threshold=threshold,
        NO_DRAFT_PROBS=no_draft_probs,
        FLY_WINDOW_SIZE=window,
    )
    return Case("apply_fly_random_acceptance_kernel", args)


# -- state classes: what the cases must reach (conformance/coverage.py) --------------------------
def _fly_rewritten(kernel: str) -> str:
    """The one input a FLy kernel rewrites (its contract's only output)."""
    (p,) = (contract.APPLY_FLY_GREEDY if kernel == contract.K19 else contract.APPLY_FLY_RANDOM).outputs
    return p.name


def _fly_written(kernel: str, a: Args, out: Outputs) -> torch.Tensor:
    """Draft positions the oracle deferred: the cells of the rewritten input that changed."""
    name = _fly_rewritten(kernel)
    before, after = a[name], out.get(name)
    if after is None or not before.numel():
        return torch.zeros(0, dtype=torch.bool)
    return after != before


def _fly_deferred(kernel: str, a: Args, out: Outputs) -> int:
    return int(_fly_written(kernel, a, out).sum())


def _fly_on_threshold(kernel: str, a: Args, out: Outputs) -> int:
    """Deferred positions whose entropy is exactly the float32 threshold (the test is >=)."""
    written = _fly_written(kernel, a, out)
    threshold = torch.tensor(a["fly_entropy_threshold"], dtype=torch.float32)
    return int((written & (a["fly_entropy_ptr"][: written.numel()] == threshold)).sum())


def _fly_blocked_by_window(kernel: str, a: Args, out: Outputs) -> int:
    """Positions with room for a window (pos + W < n) that defer without one (the oracle at W = 0)
    but not with it: a draft in the window was rejected."""
    import reference.fly

    w = a["FLY_WINDOW_SIZE"]
    if w == 0:
        return 0
    name = _fly_rewritten(kernel)
    bare = dict(a, FLY_WINDOW_SIZE=0, **{name: a[name].clone()})
    getattr(reference.fly, kernel)(**bare)
    without = bare[name] != a[name]
    cu = a["cu_num_draft_tokens_ptr"]
    n = counts(cu)
    room = torch.repeat_interleave(n, n)  # each position's row length
    pos = torch.arange(int(n.sum())) - torch.repeat_interleave(torch.cumsum(n, 0) - n, n)
    return int((without[: pos.numel()] & ~_fly_written(kernel, a, out)[: pos.numel()] & (pos + w < room)).sum())


CLASSES: tuple[StateClass, ...] = (
    StateClass("deferred", (contract.K19, contract.K20), _fly_deferred, "a rejection deferred: its input rewritten (C33)"),
    StateClass("deferred at the threshold", (contract.K19, contract.K20), _fly_on_threshold,
               "a deferral whose entropy is exactly the float32 threshold (non-strict, C33)"),
    StateClass("blocked by the window", (contract.K19, contract.K20), _fly_blocked_by_window,
               "a position that would defer but for a rejected draft in its window (C33)"),
)
