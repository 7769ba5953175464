"""Rows for vLLM's CPU sampler ops: ties at the maximum, NaN, +inf and all -inf rows, logits near
float32's limits where a noise added to them is lost, vocabularies off the 16-lane width, strided
rows, and seeds built so that one token draws the top value (u rounds to 1.0)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.strategies import cases_for, generator, seeds
from contracts import argmax as contract

M64 = contract.M64
KINDS = ("spread", "ties", "nan", "sparse", "+inf", "huge", "signed zeros")


def _unshift(z: int, s: int) -> int:
    """The inverse of z ^ (z >> s) on 64-bit words."""
    out = z
    for _ in range(64 // s):
        out = z ^ (out >> s)
    return out


def unsplitmix64(z: int) -> int:
    """The word SplitMix64's finalizer maps to ``z``."""
    z = _unshift(z, 31)
    z = (z * pow(0x94D049BB133111EB, -1, 2**64)) & M64
    z = _unshift(z, 27)
    z = (z * pow(0xBF58476D1CE4E5B9, -1, 2**64)) & M64
    return _unshift(z, 30)


def seed_drawing_top(token: int, low_bits: int, below: int = 0) -> int:
    """An int64 seed whose row draws ``TOP_DRAW - below`` at ``token`` (below 0: u rounds to 1.0)."""
    word = ((contract.TOP_DRAW - below) << 11) | (low_bits & 0x7FF)
    key = (unsplitmix64(word) - (token + 1) * contract.GAMMA) & M64
    seed = unsplitmix64(key)
    return seed - 2**64 if seed >= 2**63 else seed


def logit_row(kind: str, g: torch.Generator, v: int) -> torch.Tensor:
    scale = float(torch.tensor([0.01, 1.0, 8.0, 60.0])[torch.randint(0, 4, (1,), generator=g)])
    row = torch.randn(v, generator=g) * scale
    some = torch.randint(0, v, (max(1, v // 8),), generator=g)
    if kind == "ties":
        row[some] = row.max()
    elif kind == "nan":
        row[some[: 1 + len(some) // 4]] = float("nan")
    elif kind == "sparse":  # mostly -inf, as top-k leaves a row; sometimes all of it
        keep = row.new_full((v,), float("-inf"))
        keep[some] = row[some]
        row = keep if torch.rand(1, generator=g) < 0.8 else torch.full((v,), float("-inf"))
    elif kind == "+inf":
        row[some[:2]] = float("inf")
    elif kind == "huge":  # beyond 2**53 apart, a noise added to the logit is lost
        row = (torch.rand(v, generator=g) * 2 - 1) * 3.4e38
        row[some[:3]] = 3.4028234663852886e38  # equal maxima: only the noise tells them apart
    elif kind == "signed zeros":
        row = torch.where(torch.rand(v, generator=g) < 0.5, torch.tensor(-0.0), torch.tensor(0.0))
    return row


@st.composite
def _logits(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Generator]:
    g = generator(draw(seeds))
    b = draw(st.integers(0, 5))
    v = draw(st.one_of(st.integers(1, 40), st.integers(41, 700), st.sampled_from([1024, 2049, 4000])))
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=b, max_size=b))
    for k in set(kinds):
        event(f"row: {k}")
    rows = [logit_row(k, g, v) for k in kinds]
    logits = torch.stack(rows) if rows else torch.empty(0, v)
    if draw(st.booleans()):  # rows inside a wider buffer (a view): the op reads each row at its stride
        pad = draw(st.integers(1, 17))
        wide = torch.full((b, v + pad), float("nan"))
        wide[:, :v] = logits
        logits = wide[:, :v]
        event("strided rows")
    return logits, g


@cases_for(contract.K34)
def greedy_cases() -> st.SearchStrategy[Case]:
    return _logits().map(lambda lg: Case(contract.K34, dict(sampled=torch.empty(lg[0].shape[0], dtype=torch.int64),
                                                            logits=lg[0])))


@st.composite
def _gumbel(draw: st.DrawFn) -> Case:
    logits, g = draw(_logits())
    b, v = logits.shape
    # The call site's seeds are in [0, 2**31); any int64 is accepted.
    row_seeds = [draw(st.integers(-(2**63), 2**63 - 1)) if draw(st.integers(0, 4)) == 0
                 else draw(st.integers(0, contract.CALL_SITE_SEEDS - 1)) for _ in range(b)]
    if b and draw(st.integers(0, 3)) == 0:
        r = draw(st.integers(0, b - 1))
        below = draw(st.sampled_from([0, 0, 1, 2, 5]))
        row_seeds[r] = seed_drawing_top(draw(st.integers(0, v - 1)), draw(st.integers(0, 2047)), below)
        event("a token draws near the top")
    return Case(contract.K35, dict(sampled=torch.empty(b, dtype=torch.int64), logits=logits,
                                   seeds=torch.tensor(row_seeds, dtype=torch.int64).reshape(b)))


@cases_for(contract.K35)
def gumbel_cases() -> st.SearchStrategy[Case]:
    return _gumbel()


def _rows(test: Callable[[Args, Outputs, int], bool]) -> Callable[[str, Args, Outputs], int]:
    def count(kernel: str, a: Args, out: Outputs) -> int:
        return sum(1 for b in range(a["logits"].shape[0]) if test(a, out, b))

    return count


def _nan(a: Args, out: Outputs, b: int) -> bool:
    return bool(torch.isnan(a["logits"][b]).any())


def _all_neg_inf(a: Args, out: Outputs, b: int) -> bool:
    return bool((a["logits"][b] == float("-inf")).all())


def _tied(a: Args, out: Outputs, b: int) -> bool:
    row = a["logits"][b]
    return not _nan(a, out, b) and int((row == row.max()).sum()) > 1


def _pos_inf(a: Args, out: Outputs, b: int) -> bool:
    return bool((a["logits"][b] == float("inf")).any())


def _top_draw(a: Args, out: Outputs, b: int) -> bool:
    row = a["logits"][b]
    drew = torch.from_numpy(contract.draws(int(a["seeds"][b]), row.numel()).astype("int64"))
    return bool(((drew >= contract.TOP_DRAW - 7) & (row != float("-inf"))).any())


def _noise_decides(a: Args, out: Outputs, b: int) -> bool:
    row = a["logits"][b]
    return not _nan(a, out, b) and bool(torch.isfinite(row).all()) and int(out["sampled"][b]) != int(row.argmax())


def _huge(a: Args, out: Outputs, b: int) -> bool:
    row = a["logits"][b]
    return bool(((row.abs() >= 1e30) & torch.isfinite(row)).any())


_BOTH = (contract.K34, contract.K35)
CLASSES: tuple[StateClass, ...] = (
    StateClass("NaN in the row", _BOTH, _rows(_nan), "greedy: the first NaN; Gumbel: NaN wins only as the scan's first token"),
    StateClass("a row of -inf", _BOTH, _rows(_all_neg_inf), "token 0"),
    StateClass("+inf logit", _BOTH, _rows(_pos_inf), "the first +inf wins: every later (inf - inf) is NaN"),
    StateClass("tied maximum", (contract.K34,), _rows(_tied), "the first of equal maxima (-0.0 equals 0.0)"),
    StateClass("noise decides", (contract.K35,), _rows(_noise_decides), "the sampled token is not the row's argmax"),
    StateClass("logits near float32's limit", (contract.K35,), _rows(_huge),
               "noise lost if added to the logit: the scan compares in (logit, noise) space"),
    StateClass("a draw near the top", (contract.K35,), _rows(_top_draw),
               "a token draws 2**53 - 8 or more: u's rounding moves 1 - u by up to half; the top draw's u, "
               "1 - 2**-54, rounds to 1.0, its noise is -log(2**-54) (C40)"),
)
