"""Batches of the top-k/top-p mask: rows of Gaussian logits, of few distinct values (ties at every
cut-off), of neighbours closer than vLLM's 1e-9 duplicate test, of -inf cells (grammar masks) and
all -inf rows, of one far outlier (vLLM's standalone top-p overflow), of -0.0 and +0.0; k around
the finite count and the vocabulary, p at its edges; padded and viewed row layouts; persistent
grids of fewer programs than rows."""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.strategies import cases_for, generator, seeds
from contracts import topk_topp as contract

# Few vocabulary sizes: VOCAB_SIZE is a constexpr (each one compiles anew).
VOCABS = [1, 2, 3, 8, 13, 64, 100, 257]
ROWS = ["gaussian", "levels", "neighbours", "masked", "all -inf", "one finite", "equal", "outlier", "zeros", "wide", "exact"]


def logit_row(kind: str, g: torch.Generator, v: int) -> torch.Tensor:
    """One row of ``v`` logits of the named kind (one of ROWS)."""
    x = torch.randn(v, generator=g) * 2
    if kind == "levels":
        x = torch.randint(-2, 3, (v,), generator=g).to(torch.float32)
    elif kind == "neighbours":  # distinct values 1 and 2 ulps apart (about 1e-10): vLLM's |a - b| < 1e-9 merges them
        a = torch.tensor(1e-3, dtype=torch.float32)
        b = torch.nextafter(a, torch.tensor(1.0))
        c = torch.nextafter(b, torch.tensor(1.0))
        x = torch.stack([a, b, c, torch.tensor(0.0), torch.tensor(1.0)])[torch.randint(0, 5, (v,), generator=g)]
    elif kind == "masked":
        x[torch.rand(v, generator=g) < 0.5] = float("-inf")
    elif kind == "all -inf":
        x.fill_(float("-inf"))
    elif kind == "one finite":
        x.fill_(float("-inf"))
        x[int(torch.randint(0, v, (), generator=g))] = 1.0
    elif kind == "equal":  # 2, 4 or 8 equal logits: p = 1/4, 1/2, 3/4 of their mass is exactly a prefix's
        x.fill_(float("-inf"))
        x[torch.randperm(v, generator=g)[: 2 ** int(torch.randint(1, 4, (), generator=g))]] = 1.0
    elif kind == "outlier":  # far above avg + 10 std of the first tile: vLLM's float32 exp overflows
        x[int(torch.randint(0, v, (), generator=g))] = 150.0
    elif kind == "zeros":
        x = torch.where(torch.rand(v, generator=g) < 0.5, torch.tensor(-0.0), torch.tensor(0.0))
    elif kind == "exact":  # up to 8 distinct keys that all weigh 2**32: p = j/8 ends a prefix exactly at a key
        a = torch.tensor(0.1, dtype=torch.float32)  # its ulp is below 2**-25 of it: exp32 of the gaps rounds to 1
        near = [a]
        for _ in range(3):
            near.append(torch.nextafter(near[-1], torch.tensor(0.0)))
        x = torch.full((v,), float("-inf"))
        at = torch.randperm(v, generator=g)[:8]
        x[at] = torch.stack(near)[torch.randint(0, 4, (at.numel(),), generator=g)]
    elif kind == "wide":  # magnitudes where float32 subtraction rounds: weights underflow to 0
        x = x * 1e4
    return x


def _batch(draw: st.DrawFn, g: torch.Generator, b: int, v: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(rows, LOGITS, LOGITS_STRIDE_0): b rows of drawn kinds in a drawn layout: packed rows, rows inside
    a wider buffer (its gaps compared: nothing may touch them), or vLLM's view of such a buffer."""
    kinds = [draw(st.sampled_from(ROWS)) for _ in range(b)]
    for kind in set(kinds):
        event(f"row: {kind}")
    rows = torch.stack([logit_row(kind, g, v) for kind in kinds]) if b else torch.zeros(0, v)
    layout = draw(st.sampled_from(["packed", "padded", "view"]))
    stride = v if layout == "packed" else v + draw(st.integers(1, 5))
    wide = torch.randn(max(b, 1), stride, generator=g)
    wide[:b, :v] = rows
    # "padded": the buffer itself is LOGITS, VOCAB_SIZE covering part of each row.
    return rows, {"packed": rows.clone(), "padded": wide[:b].contiguous(), "view": wide[:b, :v]}[layout], stride


def _ranked_weights(x: torch.Tensor) -> torch.Tensor:
    """C35's integer weights of a row in rank order (the oracle's: prefix masses exactly)."""
    from reference.topk_topp import weights

    return weights(x[torch.sort(x, descending=True, stable=True).indices], x.max())


def _renormalised(draw: st.DrawFn, w: torch.Tensor) -> tuple[int, float]:
    """(k, p) for a row whose ranked weights ``w`` hold at least 3 positive: top-k keeps 2 or more
    of them and leaves mass behind, and p is the largest float32 whose share of what top-k kept
    (Z, C35's renormalisation) ends a shorter prefix of it. Measured against the whole row's mass
    instead, that prefix falls short and top-p keeps more. Drawn k and p rarely made top-p cut
    inside what top-k kept: an oracle that skipped the renormalisation survived the ci profile on
    4 of 10 seeds (only the fuzz check caught it)."""
    k = draw(st.integers(2, int((w > 0).sum()) - 1))
    j = draw(st.integers(1, k - 1))
    z, mass = int(w[:k].sum()), int(w[:j].sum())
    p = torch.tensor(mass / z, dtype=torch.float32)
    while float(p) * z > mass:  # need = p * Z (float64, one rounding) must not pass the prefix's mass
        p = torch.nextafter(p, torch.tensor(0.0))
    return k, float(p)


def _plateau(g: torch.Generator, v: int) -> torch.Tensor:
    """A row of equal logits but its first, 1 above them. With p in [5/16, 1/2] top-p keeps the
    maximum (under 0.3 of the mass for V >= 8) and a prefix of the plateau's ties. A Gaussian guess
    at the cut-off from the first tile, the maximum in it (vLLM's top-p, triton_impl), lands between
    the two levels: the candidates above it hold less than p, and the search must fall back to the
    whole row. Drawn rows reached that rarely: a kernel that kept the candidates survived 2 of 10
    seeds of the ci profile."""
    c = float(torch.randn((), generator=g) * 2)
    x = torch.full((v,), c)
    x[0] = c + 1.0
    return x


@st.composite
def _case(draw: st.DrawFn) -> Case:
    g = generator(draw(seeds))
    topk, topp = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
    # Half the cases of both steps aim top-p inside what top-k kept: a row, and a vocabulary with
    # room for 3 weights (small ones: their launches are the cheap ones, interpreted).
    inside = topk and topp and draw(st.booleans())
    plateau = topp and not topk and draw(st.integers(0, 3)) == 0  # a quarter of the top-p-only cases
    b = draw(st.integers(1 if inside or plateau else 0, 5))
    v = draw(st.sampled_from([8, 13] if inside or plateau else VOCABS))
    rows, logits, stride = _batch(draw, g, b, v)
    if plateau:
        at = draw(st.integers(0, b - 1))
        rows[at] = logits[at, :v] = _plateau(g, v)
        event("top-p on a plateau below the maximum")
    finite = [int((r > float("-inf")).sum()) for r in rows]
    k = p = None
    if topk:
        k = torch.tensor([draw(st.sampled_from([1, 2, max(f - 1, 1), max(f, 1), f + 1, max(v - 1, 1), v, v + 3, 2**31 - 1]))
                          for f in finite], dtype=torch.int32)
    if topp:
        p = torch.tensor([draw(st.one_of(st.sampled_from([0.5, 0.9, 1.0, 0.25, 0.75, 1.5, 1e-8, 0.99999994]), st.floats(0.0078125, 1.0, width=32)))
                          for _ in range(b)], dtype=torch.float32)
    if inside:
        ranked = {r: _ranked_weights(rows[r]) for r, f in enumerate(finite) if f >= 3}  # an all -inf row has no weights
        spread = [r for r, w in ranked.items() if int((w > 0).sum()) >= 3]
        if spread:
            r = draw(st.sampled_from(spread))
            k[r], p[r] = _renormalised(draw, ranked[r])
            event("top-p cuts inside what top-k kept")
    if plateau:
        p[at] = draw(st.floats(0.3125, 0.5, width=32))
    pct, cdf = contract.stand_in_tables()
    block = draw(st.sampled_from([4, 16, 64, 256]))
    programs = draw(st.integers(1, max(b, 1) + 1))
    args = dict(
        LOGITS=logits,
        LOGITS_STRIDE_0=stride,
        BUFFER=torch.empty(programs, v),
        PERCENTILE_TO_STD_TABLE=pct,
        NORMAL_CDF_TO_SIGMA_TABLE=cdf,
        K=k,
        P=p,
        BATCH_SIZE=b,
        VOCAB_SIZE=v,
        MASK_VALUE=draw(st.sampled_from([float("-inf"), -1e9, 0.0, -1e40])),
        BLOCK_SIZE=block,
        BLOCK_SIZE_TRUNC=draw(st.sampled_from([2, block])),
        TOPK_ENABLED=topk,
        TOPP_ENABLED=topp,
        SPLIT_COVERS_PONLY=draw(st.booleans()),
    )
    return Case(contract.KERNEL, args)


@cases_for(contract.KERNEL)
def cases() -> st.SearchStrategy[Case]:
    return _case()


# The split top-p pipeline (C36): a launch of one of its three kernels, its workspace as the
# pipeline's earlier launches left it (run by the oracle), left with stale words from another batch,
# or with some words overwritten by anything (the kernels read them as they are: any word is defined).
SPLITS = [1, 2, 4, 16]  # 16 slices exceed the small vocabularies: empty slices
WORKSPACES = ["as written", "stale", "corrupted"]


def _split_launch(draw: st.DrawFn, g: torch.Generator) -> dict:
    b = draw(st.integers(0, 4))
    v = draw(st.sampled_from(VOCABS))
    _, logits, stride = _batch(draw, g, b, v)
    has_k = draw(st.booleans())
    k = torch.tensor([draw(st.sampled_from([1, max(v - 1, 1), v, v + 3, 2**31 - 1])) for _ in range(b)], dtype=torch.int32)
    p = torch.tensor([draw(st.one_of(st.sampled_from([0.5, 0.9, 1.0, 0.25, 1.5, 1e-8, 0.99999994, 0.125, 0.375, 0.625, 0.875]),
                                     st.floats(0.0078125, 1.0, width=32)))
                      for _ in range(b)], dtype=torch.float32)
    s, f, rounds = draw(st.sampled_from(SPLITS)), draw(st.sampled_from(contract.FANOUTS)), draw(st.sampled_from([1, 2, 5]))
    if draw(st.booleans()):
        stats, parts = (t.zero_() for t in contract.split_workspace())
        rounds = 5
    else:  # sized exactly
        stats, parts = torch.zeros(b * s, contract.STATS_WORDS), torch.zeros(b * rounds * s * f * 3)
    return dict(LOGITS=logits, LOGITS_STRIDE_0=stride, STATS=stats, PARTS=parts, K=k if has_k else None, P=p, HAS_K=has_k,
                VOCAB_SIZE=v, S=s, F=f, NUM_ROUNDS=rounds, BLOCK=draw(st.sampled_from([4, 16, 64, 256])),
                MASK_VALUE=draw(st.sampled_from([float("-inf"), -1e9, 0.0])))


def _workspace(draw: st.DrawFn, g: torch.Generator, a: dict, rounds: int) -> None:
    """Runs the oracle's stats kernel and `rounds` step rounds over the case's logits, then ages or
    corrupts the workspace as drawn."""
    import reference.topk_topp as oracle  # the oracle writes what the earlier launches leave

    how = draw(st.sampled_from(WORKSPACES))
    event(f"workspace: {how}")
    if how == "stale":  # words of another batch wherever this one writes nothing
        for t in (a["STATS"], a["PARTS"]):
            t.view(torch.int32).copy_(torch.randint(-(2**31), 2**31, t.shape, generator=g, dtype=torch.int64).to(torch.int32))
    x = a["LOGITS"]  # read only: the stats and step kernels write the workspace alone
    common = {n: a[n] for n in ("LOGITS_STRIDE_0", "K", "P", "HAS_K", "VOCAB_SIZE", "S")}
    oracle._topp_sb_stats_kernel(LOGITS=x, STATS=a["STATS"], BLOCK=a["BLOCK"], **common)
    for j in range(rounds):
        oracle._topp_sb_step_kernel(LOGITS=x, STATS=a["STATS"], PARTS=a["PARTS"], ROUND=j, F=a["F"],
                                    NUM_ROUNDS=a["NUM_ROUNDS"], BLOCK=a["BLOCK"], **common)
    if how == "corrupted":
        for t in (a["STATS"], a["PARTS"]):
            words = t.view(-1).view(torch.int32)
            n = words.numel()
            if n:
                at = torch.randint(0, n, (draw(st.integers(1, 8)),), generator=g)
                words[at] = torch.tensor([draw(st.integers(-(2**31), 2**31 - 1)) for _ in range(at.numel())], dtype=torch.int32)


def _split_args(a: dict, names: tuple[str, ...]) -> dict:
    return {n: a[n] for n in names}


@cases_for(contract.STATS_KERNEL)
def stats_cases() -> st.SearchStrategy[Case]:
    @st.composite
    def case(draw: st.DrawFn) -> Case:
        g = generator(draw(seeds))
        a = _split_launch(draw, g)
        return Case(contract.STATS_KERNEL, _split_args(a, contract.TOPP_STATS.arg_names))

    return case()


@cases_for(contract.STEP_KERNEL)
def step_cases() -> st.SearchStrategy[Case]:
    @st.composite
    def case(draw: st.DrawFn) -> Case:
        g = generator(draw(seeds))
        a = _split_launch(draw, g)
        a["ROUND"] = draw(st.integers(0, a["NUM_ROUNDS"] - 1))
        event(f"round: {'last' if a['ROUND'] == a['NUM_ROUNDS'] - 1 else a['ROUND']}")
        _workspace(draw, g, a, a["ROUND"])
        return Case(contract.STEP_KERNEL, _split_args(a, contract.TOPP_STEP.arg_names))

    return case()


@cases_for(contract.MASK_KERNEL)
def mask_cases() -> st.SearchStrategy[Case]:
    @st.composite
    def case(draw: st.DrawFn) -> Case:
        g = generator(draw(seeds))
        a = _split_launch(draw, g)
        _workspace(draw, g, a, a["NUM_ROUNDS"])
        return Case(contract.MASK_KERNEL, _split_args(a, contract.TOPP_MASK.arg_names))

    return case()


# -- state classes: what the cases must reach (conformance/coverage.py) --------------------------
def _topk_rows(a: Args) -> list[tuple[torch.Tensor, dict[str, tuple[float, int, int]]]]:
    """Each row's logits and the oracle's cut-offs, by step (reference/contract.cutoffs)."""
    from reference.topk_topp import cutoffs

    out = []
    for r in range(a["BATCH_SIZE"]):
        x = contract.row_values(a, r)
        out.append((x, cutoffs(x, *contract.row_steps(a, r), bool(a["SPLIT_COVERS_PONLY"]))))
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

    rounds = a["ROUND"] if kernel == contract.STEP_KERNEL else a["NUM_ROUNDS"] - 1
    out = []
    for r in range(contract.split_rows(a)):
        if contract.owned(a, r):
            state = replay(a, r, 0, rounds)
            out.append("no finite logit" if state is None else state.status)
    return out


def _split_status(status: str, last: bool) -> Callable[[str, Args, Outputs], int]:
    def count(kernel: str, a: Args, out: Outputs) -> int:
        if kernel == contract.STEP_KERNEL and last != (a["ROUND"] == a["NUM_ROUNDS"] - 1):
            return 0
        return _split_searches(kernel, a).count(status)
    return count


def _split_ties(kernel: str, a: Args, out: Outputs) -> int:
    from reference.topk_topp import cutoffs

    n = 0
    for r in range(contract.split_rows(a)):
        if contract.owned(a, r):
            x = contract.row_values(a, r)
            cut = cutoffs(x, None, contract.split_steps(a, r)[1], False).get("top-p")
            n += cut is not None and cut[1] < int((x == cut[0]).sum())
    return n


def _split_foreign(kernel: str, a: Args, out: Outputs) -> int:
    return sum(not contract.owned(a, r) for r in range(contract.split_rows(a)))


_SPLIT = (contract.STATS_KERNEL, contract.STEP_KERNEL, contract.MASK_KERNEL)


CLASSES: tuple[StateClass, ...] = (
    StateClass("ties split by top-k", (contract.KERNEL,), _ties_split("top-k"),
               "top-k keeps some of the logits equal to the k-th, lowest columns first (C35)"),
    StateClass("ties split by top-p", (contract.KERNEL,), _ties_split("top-p"),
               "top-p's prefix ends inside a run of equal logits (C35)"),
    StateClass("top-p after top-k", (contract.KERNEL,), _topp_after_topk, "top-p drops part of what top-k kept"),
    StateClass("row untouched", (contract.KERNEL,), _untouched,
               "neither step applies (k >= V, at most k finite logits, p >= 1, split rows, all -inf): no write"),
    StateClass("a round ends the search", (contract.STEP_KERNEL, contract.MASK_KERNEL), _split_status("found", False),
               "a row's cut-off found by the records of an earlier round (C36): nothing left to weigh"),
    StateClass("the last round finishes", (contract.STEP_KERNEL,), _split_status("search", True),
               "a row still searching at the last round: each program searches the whole row (C36)"),
    StateClass("the finishing record read", (contract.MASK_KERNEL,), _split_status("search", False),
               "a row the rounds left searching: the mask reads its slice's finishing record (C36)"),
    StateClass("ties split by the split pipeline", (contract.MASK_KERNEL,), _split_ties,
               "top-p's prefix ends inside a run of equal logits, kept lowest columns first across slices (C35)"),
    StateClass("rows not the split's", _SPLIT, _split_foreign, "p >= 1, or k < V with HAS_K: every word and logit untouched"),
)
