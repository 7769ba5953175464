"""Coverage of the speculative-decoding state space: which state classes the cases reached.

A conformance run is only as good as the states its cases visit. Each kernel's cases are
classified here — from the arguments and from the oracle's outputs, where the state is a result
(a row whose drafts were all accepted shows as a written bonus cell) — into the classes of
:data:`CLASSES`. The runner reports each class as a Hypothesis ``event()`` (``pytest
--hypothesis-show-statistics`` lists them), steers generation with ``target()`` toward long
accepted chains, and tallies them per kernel; under the ``ci`` and ``nightly`` profiles a
*required* class that no case reached fails the run.

Classes are data: add a :class:`StateClass` with the kernels it applies to and a function that
counts its occurrences in one case.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from conformance.runner import poison_value
from contracts import fly, mrv2, rejection, topk_topp
from contracts._checks import flat_view
from contracts.eagle import K5, K6, K7
from contracts.slot_mapping import K10
from contracts.spec import counts

Args = Mapping[str, Any]
Outputs = Mapping[str, torch.Tensor]

K1, K2, K3, K4 = (s.name for s in (rejection.REJECTION_GREEDY, rejection.REJECTION_RANDOM, rejection.EXPAND, rejection.SAMPLE_RECOVERED))


@dataclass(frozen=True)
class StateClass:
    name: str
    kernels: tuple[str, ...]
    # Occurrences in one case (rows, cells or 1/0), from the arguments and the oracle's outputs.
    count: Callable[[str, Args, Outputs], int]
    doc: str = ""
    required: bool = True  # the ci and nightly profiles fail when no case reached it
    # A contract rule that follows vLLM 0.33.0 into a hazard: never required, never a failure, but
    # counted and listed apart ("hazards" in the report), so a maintainer sees how often it decides.
    hazard: bool = False


# -- the rejection rows (K1, K2) --------------------------------------------------------------------
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


# -- the other kernels --------------------------------------------------------------------------------
def _zero_draft_requests(kernel: str, a: Args, out: Outputs) -> int:
    cu = a["cu_num_draft_tokens_ptr"]
    if kernel == K6:
        cu = cu[: a["num_reqs"]]
    return int((counts(cu) == 0).sum()) if cu.numel() else 0


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


def _padding_rows(kernel: str, a: Args, out: Outputs) -> int:
    """K5: rows past batch_size are CUDA-graph padding (C21); K10: the tail [num_tokens, max_num_tokens) (C22)."""
    if kernel == K5:
        return max(0, a["out_slot_mapping_ptr"].numel() - a["batch_size"])
    return max(0, a["max_num_tokens"] - a["num_tokens"])


def _discarded(kernel: str, a: Args, out: Outputs) -> int:
    return int(a["discard_request_mask_ptr"][: a["num_reqs"]].sum())


def _placeholder_samples(kernel: str, a: Args, out: Outputs) -> int:
    n, w, stride = a["num_reqs"], a["num_sampled_tokens_per_req"], a["stride_sampled_token_ids"]
    flat = flat_view(a["sampled_token_ids_ptr"]).tolist()
    return sum(1 for r in range(n) for j in range(w) if r * stride + j < len(flat) and flat[r * stride + j] == -1)


# -- MRV2 (K16, K17) ---------------------------------------------------------------------------------
def _verdicts(a: Args, out: Outputs) -> list[tuple[mrv2.Request, int]]:
    """(request, accepted drafts) of every K16 request with drafts."""
    steps = out.get("rejected_steps_ptr")
    if steps is None:
        return []
    return [(q, int(steps[q.index])) for q in mrv2.requests(a) if q.drafts]


def _mrv2_all_accepted(kernel: str, a: Args, out: Outputs) -> int:
    return sum(k == q.drafts for q, k in _verdicts(a, out))


def _mrv2_first_rejected(kernel: str, a: Args, out: Outputs) -> int:
    return sum(k == 0 for q, k in _verdicts(a, out))


def _mrv2_rejected_later(kernel: str, a: Args, out: Outputs) -> int:
    return sum(0 < k < q.drafts for q, k in _verdicts(a, out))


def _mrv2_block_random(kernel: str, a: Args, out: Outputs) -> int:
    return sum(not q.greedy for q, _ in _verdicts(a, out)) if a["USE_BLOCK_VERIFICATION"] else 0


def _mrv2_fly_random(kernel: str, a: Args, out: Outputs) -> int:
    return sum(not q.greedy for q, _ in _verdicts(a, out)) if a["FLY_WINDOW_SIZE"] else 0


def _resampled(kernel: str, a: Args, kind: str) -> int:
    reqs = [q for q in mrv2.resamples(a) if q.writes]
    if kind == "bonus":
        return sum(q.bonus for q in reqs)
    if kind == "placeholder":
        return sum(not q.bonus and q.rejected < 0 for q in reqs)
    draft = kind == "draft logits"
    return sum(q.residual for q in reqs) if bool(a["HAS_DRAFT_LOGITS"]) == draft else 0


# -- the FLy pre-pass (K19, K20) ----------------------------------------------------------------------
def _fly_rewritten(kernel: str) -> str:
    """The one input a FLy kernel rewrites (its contract's only output)."""
    (p,) = (fly.APPLY_FLY_GREEDY if kernel == fly.K19 else fly.APPLY_FLY_RANDOM).outputs
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


# -- the top-k/top-p mask ------------------------------------------------------------------------------
def _topk_rows(a: Args) -> list[tuple[torch.Tensor, dict[str, tuple[float, int, int]]]]:
    """Each row's logits and the oracle's cut-offs, by step (reference/topk_topp.cutoffs)."""
    from reference.topk_topp import cutoffs

    out = []
    for r in range(a["BATCH_SIZE"]):
        x = topk_topp.row_values(a, r)
        out.append((x, cutoffs(x, *topk_topp.row_steps(a, r), bool(a["SPLIT_COVERS_PONLY"]))))
    return out


def _ties_split(stage: str) -> Callable[[str, Args, Outputs], int]:
    """Rows whose ``stage`` keeps some, not all, of the logits equal to its last kept one."""
    def count(kernel: str, a: Args, out: Outputs) -> int:
        return sum(stage in cut and cut[stage][1] < int((x == cut[stage][0]).sum()) for x, cut in _topk_rows(a))
    return count


def _topp_after_topk(kernel: str, a: Args, out: Outputs) -> int:
    return sum("top-k" in cut and "top-p" in cut and cut["top-p"][2] < cut["top-k"][2] for _, cut in _topk_rows(a))


def _untouched(kernel: str, a: Args, out: Outputs) -> int:
    return sum(not cut for _, cut in _topk_rows(a))


def _split_searches(kernel: str, a: Args) -> list[str]:
    """The status of each owned row's search when this launch starts reading the workspace's
    records ("search" after every round the launch replays: it searches itself or reads the
    finishing record)."""
    from reference.topk_topp import replay

    rounds = a["ROUND"] if kernel == topk_topp.STEP_KERNEL else a["NUM_ROUNDS"] - 1
    out = []
    for r in range(topk_topp.split_rows(a)):
        if topk_topp.owned(a, r):
            state = replay(a, r, 0, rounds)
            out.append("no finite logit" if state is None else state.status)
    return out


def _split_status(status: str, last: bool) -> Callable[[str, Args, Outputs], int]:
    def count(kernel: str, a: Args, out: Outputs) -> int:
        if kernel == topk_topp.STEP_KERNEL and last != (a["ROUND"] == a["NUM_ROUNDS"] - 1):
            return 0
        return _split_searches(kernel, a).count(status)
    return count


def _split_ties(kernel: str, a: Args, out: Outputs) -> int:
    from reference.topk_topp import cutoffs

    n = 0
    for r in range(topk_topp.split_rows(a)):
        if topk_topp.owned(a, r):
            x = topk_topp.row_values(a, r)
            cut = cutoffs(x, None, topk_topp.split_steps(a, r)[1], False).get("top-p")
            n += cut is not None and cut[1] < int((x == cut[0]).sum())
    return n


def _split_foreign(kernel: str, a: Args, out: Outputs) -> int:
    return sum(not topk_topp.owned(a, r) for r in range(topk_topp.split_rows(a)))


_SPLIT = (topk_topp.STATS_KERNEL, topk_topp.STEP_KERNEL, topk_topp.MASK_KERNEL)

CLASSES: tuple[StateClass, ...] = (
    StateClass("all accepted", (K1, K2), _all_accepted, "a row with drafts whose every draft is accepted: the bonus is written"),
    StateClass("first draft rejected", (K1, K2), _first_rejected, "a row with drafts rejected at position 0"),
    StateClass("rejected after an accepted draft", (K1, K2), _rejected_later, "a row accepted at position 0 and rejected before its bonus"),
    StateClass("zero drafts", (K1, K2, K4), _zero_draft_rows, "a processed row without drafts: only the bonus (K1, K2), nothing (K4)"),
    StateClass("zero drafts", (K6,), _zero_draft_requests, "a request without drafts: 0 rejected tokens (C19)"),
    StateClass("synthetic rows", (K1, K2), _synthetic_rows, "rows decided by u < rate (SYNTHETIC_MODE)"),
    StateClass("mixed greedy and random", (K1, K2), _mixed, "a batch with greedy and random rows (C14)"),
    StateClass("placeholder drafts", (K1, K2, K4), _placeholder_drafts, "-1 draft tokens (C10, C16)"),
    StateClass("padding rows", (K5, K10), _padding_rows, "CUDA-graph padding rows (K5) or the padded tail of the slot mapping (K10)"),
    StateClass("capped at MAX_NUM_TOKENS", (K3,), _capped, "a request with more tokens than MAX_NUM_TOKENS (C18)"),
    StateClass("exactly MAX_NUM_TOKENS", (K3,), _at_cap, "a request of MAX_NUM_TOKENS tokens: all written, none cut"),
    StateClass("one below MAX_NUM_TOKENS", (K3,), _below_cap, "a request of MAX_NUM_TOKENS - 1 tokens (MAX_NUM_TOKENS > 1)"),
    StateClass("u == p without draft probabilities", (K2,), _no_draft_on_p, "NO_DRAFT_PROBS: a draft tested with u exactly p > 0 (accepted: non-strict)"),
    StateClass("u == p == 0 without draft probabilities", (K2,), _no_draft_zero, "NO_DRAFT_PROBS: a zero-probability draft tested with u = 0 (accepted)"),
    StateClass("discarded requests", (K7,), _discarded, "a discarded request gets the backup token (C20)"),
    StateClass("placeholder drafts", (K7,), _placeholder_samples, "-1 (rejected) sampled tokens (C20)"),
    StateClass("all accepted", (mrv2.K16,), _mrv2_all_accepted, "a request with drafts accepts them all"),
    StateClass("first draft rejected", (mrv2.K16,), _mrv2_first_rejected, "a request with drafts accepts none"),
    StateClass("rejected after an accepted draft", (mrv2.K16,), _mrv2_rejected_later, "a request accepts some of its drafts"),
    StateClass("block verification", (mrv2.K16,), _mrv2_block_random, "a random request under block verification"),
    StateClass("FLy window", (mrv2.K16,), _mrv2_fly_random, "a random request under FLy"),
    StateClass("bonus resample", (mrv2.K17,), lambda k, a, o: _resampled(k, a, "bonus"), "every draft accepted: the target's own draw"),
    StateClass("placeholder resample", (mrv2.K17,), lambda k, a, o: _resampled(k, a, "placeholder"),
               "rejected at a -1 placeholder: the target's own draw"),
    StateClass("residual with draft logits", (mrv2.K17,), lambda k, a, o: _resampled(k, a, "draft logits"),
               "p minus q, in the log domain"),
    StateClass("one-hot residual", (mrv2.K17,), lambda k, a, o: _resampled(k, a, "one-hot"),
               "the target without the rejected draft"),
    StateClass("deferred", (fly.K19, fly.K20), _fly_deferred, "a rejection deferred: its input rewritten (C33)"),
    StateClass("deferred at the threshold", (fly.K19, fly.K20), _fly_on_threshold,
               "a deferral whose entropy is exactly the float32 threshold (non-strict, C33)"),
    StateClass("blocked by the window", (fly.K19, fly.K20), _fly_blocked_by_window,
               "a position that would defer but for a rejected draft in its window (C33)"),
    StateClass("ties split by top-k", (topk_topp.KERNEL,), _ties_split("top-k"),
               "top-k keeps some of the logits equal to the k-th, lowest columns first (C35)"),
    StateClass("ties split by top-p", (topk_topp.KERNEL,), _ties_split("top-p"),
               "top-p's prefix ends inside a run of equal logits (C35)"),
    StateClass("top-p after top-k", (topk_topp.KERNEL,), _topp_after_topk, "top-p drops part of what top-k kept"),
    StateClass("row untouched", (topk_topp.KERNEL,), _untouched,
               "neither step applies (k >= V, at most k finite logits, p >= 1, split rows, all -inf): no write"),
    StateClass("a round ends the search", (topk_topp.STEP_KERNEL, topk_topp.MASK_KERNEL), _split_status("found", False),
               "a row's cut-off found by the records of an earlier round (C36): nothing left to weigh"),
    StateClass("the last round finishes", (topk_topp.STEP_KERNEL,), _split_status("search", True),
               "a row still searching at the last round: each program searches the whole row (C36)"),
    StateClass("the finishing record read", (topk_topp.MASK_KERNEL,), _split_status("search", False),
               "a row the rounds left searching: the mask reads its slice's finishing record (C36)"),
    StateClass("ties split by the split pipeline", (topk_topp.MASK_KERNEL,), _split_ties,
               "top-p's prefix ends inside a run of equal logits, kept lowest columns first across slices (C35)"),
    StateClass("rows not the split's", _SPLIT, _split_foreign, "p >= 1, or k < V with HAS_K: every word and logit untouched"),
)

# -- hazards: rules the contract keeps because the engine behaves so ---------------------------------
def _slots_past_row(kernel: str, a: Args, out: Outputs) -> int:
    """K10 local tokens whose virtual block index runs past their block-table row into the next (C22)."""
    from contracts.slot_mapping import local_slots, scheduled_tokens

    table = a["block_table_ptr"]
    _, tokens = scheduled_tokens(a)
    if not tokens.numel() or table.dim() != 2:
        return 0
    vbi, _, local = local_slots(a, a["positions_ptr"][tokens].to(torch.int64))
    return int(((vbi >= table.shape[1]) & local).sum())


def residual_without_winner(kernel: str, a: Args, out: Outputs) -> int:
    """K4 drafts whose residual has no positive, non-NaN score: the recovered token is index 0 (C16)."""
    t = a["draft_token_ids_ptr"].numel()
    if not t:
        return 0
    v = a["vocab_size"]
    p = a["target_probs_ptr"].reshape(-1)[: t * v].reshape(t, v)
    score = p if a["NO_DRAFT_PROBS"] else p - a["draft_probs_ptr"].reshape(-1)[: t * v].reshape(t, v)
    return int((~(score > 0).any(dim=1)).sum())


def earlier_request_position(kernel: str, a: Args, out: Outputs) -> int:
    """K9 requests whose last context position is read from an earlier request's tokens (C23)."""
    qsl = a["query_start_loc_ptr"].to(torch.int64).tolist()
    b = len(qsl) - 1
    rej = a["num_rejected_tokens_ptr"].to(torch.int64).tolist() if a["HAS_NUM_REJECTED"] else [0] * b
    return sum(1 for r in range(b) if qsl[r + 1] - rej[r] - 1 < qsl[r])


HAZARDS: tuple[StateClass, ...] = (
    StateClass("slot read from the next block-table row", (K10,), _slots_past_row,
               "a local token's virtual block index is past its row: vLLM reads the next request's row (C22)", required=False, hazard=True),
    StateClass("residual with no winner: token 0", (K4,), residual_without_winner,
               "every residual score is <= 0 or NaN: vLLM's argmax returns index 0, a token nobody proposed (C16)", required=False, hazard=True),
    StateClass("last position read from an earlier request", ("copy_and_expand_dflash_inputs_kernel",), earlier_request_position,
               "more rejected tokens than the request has: vLLM reads an earlier request's position (C23)", required=False, hazard=True),
)
CLASSES = CLASSES + HAZARDS

# Hypothesis target() per kernel: (label, function); maximised during generation.
TARGETS: dict[str, tuple[str, Callable[[str, Args, Outputs], int]]] = {
    K1: ("longest accepted chain", _longest_accepted_chain),
    K2: ("longest accepted chain", _longest_accepted_chain),
}


def classes_for(kernel: str) -> list[StateClass]:
    return [c for c in CLASSES if kernel in c.kernels]


def required(kernel: str) -> list[str]:
    return [c.name for c in classes_for(kernel) if c.required]


def classify(kernel: str, args: Args, outputs: Outputs) -> Counter[str]:
    """Occurrences of every class of ``kernel`` in one case (classes absent from it are omitted)."""
    found: Counter[str] = Counter()
    for c in classes_for(kernel):
        n = c.count(kernel, args, outputs)
        if n:
            found[c.name] += n
    return found


def observe(kernel: str, args: Args, outputs: Outputs) -> Counter[str]:
    """Classifies one case and reports it to Hypothesis: an ``event()`` per class, and the kernel's
    ``target()``. Call from inside a Hypothesis test; returns the classification."""
    from hypothesis import event, target

    found = classify(kernel, args, outputs)
    for name in sorted(found):
        event(f"state: {name}")
    if kernel in TARGETS:
        label, fn = TARGETS[kernel]
        target(float(fn(kernel, args, outputs)), label=label)
    return found


def missing(kernel: str, seen: Iterable[str]) -> list[str]:
    """Required classes of ``kernel`` that no case reached."""
    seen = set(seen)
    return [n for n in dict.fromkeys(required(kernel)) if n not in seen]
