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

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from contracts import topk_topp as contract
from contracts._checks import item
from contracts.numerics import exp32

F32, F64, I64 = torch.float32, torch.float64, torch.int64


def weights(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Each logit's integer weight against the row maximum ``m``: ``floor(exp32(x - m) * 2**32)``."""
    # The float32 product is exact, the cast floors. At most 1: the split kernels take the maximum
    # from a workspace, which may hold anything.
    return (exp32(x - m).clamp(max=1.0) * 4294967296.0).to(I64)


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
    a = locals()
    mask = torch.tensor(MASK_VALUE, dtype=F32)  # a constexpr float, rounded to float32
    for r in range(BATCH_SIZE):
        x = contract.row_values(a, r)  # a view: written in place
        k, p = contract.row_steps(a, r)
        kept = list(stages(x, k, p, bool(SPLIT_COVERS_PONLY)).values())
        if kept:
            drop = torch.ones(VOCAB_SIZE, dtype=torch.bool)
            drop[kept[-1]] = False
            x[drop] = mask


# The split top-p pipeline (docs/topk_topp.md, C36). Its workspace holds int32 words in float32
# storage, read and written through an int32 view. A key is the order-preserving int32 of a float32
# (-0.0 as +0.0); a row's search narrows a key range [lo, hi] that holds the last token C35's top-p
# keeps, a round at a time: each slice bins the keys of the range, the next launch combines the
# bins of every slice and keeps the one the cut-off lies in, shrunk to the keys it holds.
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
KEY_NEG_INF = -2139095041  # key(-inf)
KEY_MAX = 0x7F7FFFFF  # key(largest finite float32)
KEY_POS_INF = 0x7F800000  # key(+inf): the smallest key of a slice without a finite logit
MASS_MAX = 1 << 53  # a mass word pair decodes into [0, 2**53]
MAX_PASSES = 64  # the finishing round's whole-row passes (each shrinks the range: 13 suffice with 6 bins)
FOUND, NONE = 1, 2  # the finishing round's record: its first word


def key32(x: torch.Tensor) -> torch.Tensor:
    """The order-preserving int32 key of float32 logits, as int64."""
    b = torch.where(x == 0, torch.zeros_like(x), x).view(torch.int32).to(I64)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


def value32(key: int) -> torch.Tensor:
    """The float32 logit of a key (the map is its own inverse)."""
    b = key ^ ((key >> 31) & 0x7FFFFFFF)
    return torch.tensor([b], dtype=torch.int64).to(torch.int32).view(F32)[0]


def _words(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.int32)  # the workspace is contiguous: a view, written through


def _i32(v: int) -> int:
    return ((v & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


def _mass(lo: int, hi: int) -> int:
    return min(max((hi << 32) + (lo & 0xFFFFFFFF), 0), MASS_MAX)


def split_need(p: float, z: int) -> int:
    """The smallest integer mass at least p * Z (float64, one rounding), as C35."""
    return math.ceil(float(torch.tensor(p, dtype=F32)) * float(z))


def slice_bounds(a: Mapping[str, Any], s: int) -> tuple[int, int]:
    v = a["VOCAB_SIZE"]
    n = -(-v // a["S"])
    return min(s * n, v), min((s + 1) * n, v)


def bins(a: Mapping[str, Any]) -> int:
    return 3 * a["F"] // 4


def partials(x: torch.Tensor, lo: int, hi: int, m: torch.Tensor, nb: int) -> list[tuple[int, int, int]]:
    """(mass, smallest key, largest key) of the finite logits of ``x`` in each of ``nb`` equal bins
    of the key range [lo, hi]; an empty bin is (0, INT32_MAX, INT32_MIN)."""
    k = key32(x)
    live = (x > float("-inf")) & (k >= lo) & (k <= hi)
    b = ((k - lo) * nb).div(hi - lo + 1, rounding_mode="floor")
    w = weights(x, m)
    out = []
    for i in range(nb):
        sel = live & (b == i)
        out.append((int(w[sel].sum()), int(k[sel].min()), int(k[sel].max())) if bool(sel.any()) else (0, INT32_MAX, INT32_MIN))
    return out


@dataclass
class Search:
    """A row's search: keys above ``hi`` weigh ``above`` in all, the cut-off's key is in [lo, hi]."""

    lo: int
    hi: int
    m: torch.Tensor  # the row maximum, float32
    p: float
    need: int = -1  # known once a round has weighed the whole range
    above: int = 0
    status: str = "search"  # then "found" (cut, keep, before) or "none" (the row is left alone)
    cut: int = 0
    keep: int = 0  # how many logits keyed `cut` are kept, lowest columns first
    before: int = 0  # how many of those lie in the slices before this program's

    def combine(self, records: list[list[tuple[int, int, int]]], me: int) -> None:
        """One round: ``records[s][b]`` is slice s's (mass, smallest, largest key) of bin b."""
        nb = len(records[0])
        mass = [sum(r[b][0] for r in records) for b in range(nb)]
        if self.need < 0:  # the first round weighs every finite logit: Z
            self.need = split_need(self.p, self.above + sum(mass))
        above = self.above
        for b in reversed(range(nb)):
            if mass[b] > 0 and above + mass[b] >= self.need:
                break
            above += mass[b]
        else:
            self.status = "none"
            return
        lo = min(max(min(r[b][1] for r in records), self.lo), self.hi)
        hi = min(max(max(r[b][2] for r in records), lo), self.hi)
        self.lo, self.hi, self.above = lo, hi, above
        if lo == hi:
            w = int(weights(value32(lo).reshape(1), self.m)[0])
            ties = [r[b][0] // w if w > 0 else 0 for r in records]
            self.status, self.cut, self.before = "found", lo, sum(ties[:me])
            room = self.need - 1 - above
            self.keep = 0 if room < 0 or w == 0 else min(sum(ties), room // w + 1)


def _row_search(a: Mapping[str, Any], r: int) -> Search | None:
    """The search's start from STATS: [smallest, largest] finite key of the row; None for a row
    without a finite logit."""
    st = _words(a["STATS"])[r * a["S"] * 4 : (r + 1) * a["S"] * 4].to(I64).reshape(-1, 4)
    hi = min(max(int(st[:, 0].max()), KEY_NEG_INF), KEY_MAX)
    if hi == KEY_NEG_INF:
        return None
    lo = min(max(int(st[:, 1].min()), KEY_NEG_INF + 1), hi)
    return Search(lo, hi, value32(hi), float(a["P"][r]))


def _records(a: Mapping[str, Any], r: int, j: int) -> list[list[tuple[int, int, int]]]:
    s, f, nb = a["S"], a["F"], bins(a)
    base = (r * a["NUM_ROUNDS"] + j) * s * f * 3
    w = _words(a["PARTS"])[base : base + s * f * 3].reshape(s, f * 3).tolist()
    return [[(_mass(r[4 * b], r[4 * b + 1]), r[4 * b + 2], r[4 * b + 3]) for b in range(nb)] for r in w]


def replay(a: Mapping[str, Any], r: int, me: int, rounds: int) -> Search | None:
    """Row r's search after combining the records of rounds 0 .. rounds - 1 (it stops at the
    round that ends it), as program slice ``me`` sees it."""
    state = _row_search(a, r)
    for j in range(rounds):
        if state is None or state.status != "search":
            break
        state.combine(_records(a, r, j), me)
    return state


def _encode(rec: list[tuple[int, int, int]], f: int) -> list[int]:
    out = []
    for mass, lo, hi in rec:
        out += [_i32(mass), mass >> 32, lo, hi]
    return out + [0] * (3 * f - len(out))


def _topp_sb_stats_kernel(LOGITS: torch.Tensor, LOGITS_STRIDE_0: int, STATS: torch.Tensor, K: torch.Tensor | None,
                          P: torch.Tensor, HAS_K: bool, VOCAB_SIZE: int, S: int, BLOCK: int) -> None:
    a = contract.TOPP_STATS.bind((), locals())
    words = _words(STATS)
    for r in range(contract.split_rows(a)):
        if not contract.owned(a, r):
            continue
        x = contract.row_values(a, r)
        for s in range(S):
            lo, hi = slice_bounds(a, s)
            k, live = key32(x[lo:hi]), x[lo:hi] > float("-inf")
            top = int(k.max()) if hi > lo else KEY_NEG_INF
            bottom = int(k[live].min()) if bool(live.any()) else KEY_POS_INF
            words[(r * S + s) * 4 : (r * S + s + 1) * 4] = torch.tensor([top, bottom, 0, 0], dtype=torch.int32)


def _finish(a: Mapping[str, Any], r: int, me: int, state: Search) -> list[int]:
    """The last round: the search goes on over the whole row, pass after pass, until it ends."""
    x = contract.row_values(a, r)
    for _ in range(MAX_PASSES):
        if state.status != "search":
            break
        state.combine([partials(x, state.lo, state.hi, state.m, bins(a))], 0)
    if state.status != "found":
        return [NONE] + [0] * (3 * a["F"] - 1)
    start = slice_bounds(a, me)[0]
    before = int((key32(x[:start]) == state.cut).sum())
    return [FOUND, state.cut, state.keep, before] + [0] * (3 * a["F"] - 4)


def _topp_sb_step_kernel(LOGITS: torch.Tensor, LOGITS_STRIDE_0: int, STATS: torch.Tensor, PARTS: torch.Tensor,
                         K: torch.Tensor | None, P: torch.Tensor, ROUND: int, HAS_K: bool, S: int, F: int, NUM_ROUNDS: int,
                         VOCAB_SIZE: int, BLOCK: int) -> None:
    a = contract.TOPP_STEP.bind((), locals())
    words = _words(PARTS)
    out: dict[int, list[int]] = {}
    for r in range(contract.split_rows(a)):  # every program reads PARTS before any writes it
        if not contract.owned(a, r):
            continue
        for s in range(S):
            state = replay(a, r, s, ROUND)
            if state is None or state.status != "search":
                continue
            if ROUND == NUM_ROUNDS - 1:
                rec = _finish(a, r, s, state)
            else:
                lo, hi = slice_bounds(a, s)
                rec = _encode(partials(contract.row_values(a, r)[lo:hi], state.lo, state.hi, state.m, bins(a)), F)
            out[((r * NUM_ROUNDS + ROUND) * S + s) * F * 3] = rec
    for base, rec in out.items():
        words[base : base + len(rec)] = torch.tensor(rec, dtype=torch.int32)


def _topp_sb_mask_kernel(LOGITS: torch.Tensor, LOGITS_STRIDE_0: int, STATS: torch.Tensor, PARTS: torch.Tensor,
                         K: torch.Tensor | None, P: torch.Tensor, HAS_K: bool, MASK_VALUE: float, S: int, F: int,
                         NUM_ROUNDS: int, VOCAB_SIZE: int, BLOCK: int) -> None:
    a = contract.TOPP_MASK.bind((), locals())
    mask = torch.tensor(MASK_VALUE, dtype=F32)
    for r in range(contract.split_rows(a)):
        if not contract.owned(a, r):
            continue
        x = contract.row_values(a, r)  # a view: written in place
        for s in range(S):
            state = replay(a, r, s, NUM_ROUNDS - 1)
            if state is not None and state.status == "search":
                base = ((r * NUM_ROUNDS + NUM_ROUNDS - 1) * S + s) * F * 3
                rec = [int(w) for w in _words(PARTS)[base : base + 4]]
                state.status = "found" if rec[0] == FOUND else "none"
                state.cut, state.keep, state.before = rec[1], rec[2], rec[3]
            if state is None or state.status != "found":
                continue
            lo, hi = slice_bounds(a, s)
            k = key32(x[lo:hi])
            tie = k == state.cut
            rank = state.before + torch.cumsum(tie.to(I64), 0) - 1
            keep = (k > state.cut) | (tie & (rank < state.keep))
            x[lo:hi] = torch.where(keep, x[lo:hi], mask)


def explain_cell(a: Mapping[str, Any], output: str, index: int) -> str:
    """What decided flat cell ``index`` of K24's LOGITS: its row's steps and each stage's cut-off."""
    s, v = a["LOGITS_STRIDE_0"], a["VOCAB_SIZE"]
    r, c = divmod(index, s) if s else (0, index)
    if r >= a["BATCH_SIZE"] or c >= v:
        return f"flat index {index} lies outside every row's {v} columns: it must stay untouched"
    x = contract.row_values(a, r)
    k, p = contract.row_steps(a, r)
    finite = int((x > float("-inf")).sum())
    lines = [f"row {r}, column {c}: logit {item(a['LOGITS'], index)!r}; k={k} p={p!r} V={v} finite={finite} "
             f"SPLIT_COVERS_PONLY={a['SPLIT_COVERS_PONLY']}"]
    for stage, (pivot, ties, kept) in cutoffs(x, k, p, bool(a["SPLIT_COVERS_PONLY"])).items():
        lines.append(f"  {stage}: values > {pivot!r} kept, and the first {ties} equal to it in index order ({kept} kept)")
    return "\n".join(lines)


def describe_split(a: Mapping[str, Any], output: str, index: int) -> str:
    """Why a word or logit of the split pipeline holds what it does: the row, slice and round it
    belongs to, and the row's search as the oracle runs it."""
    b, s, v = contract.split_rows(a), a["S"], a["VOCAB_SIZE"]
    if output == "STATS":
        r, rest = divmod(index, s * 4)
        where = f"STATS word {index}: row {r}, slice {rest // 4}, word {rest % 4} (0: largest key, 1: smallest finite key, 2-3: zero)"
    elif output == "PARTS":
        f, rounds = a["F"], a["NUM_ROUNDS"]
        slot, word = divmod(index, f * 3)
        r, rest = divmod(slot, rounds * s)
        j, sl = divmod(rest, s)
        last = " (the finishing record: status, cut-off key, kept ties, ties before the slice)" if j == rounds - 1 else (
            f" (bin {word // 4}: mass low, mass high, smallest key, largest key)")
        where = f"PARTS word {index}: row {r}, round {j}, slice {sl}, word {word}{last}"
    else:
        st = a["LOGITS_STRIDE_0"]
        r, c = divmod(index, st) if st else (0, index)
        where = f"LOGITS row {r}, column {c}"
    if r >= b or (output == "LOGITS" and c >= v):
        return f"{where}: outside every row the kernel owns, it must stay untouched"
    k, p = contract.split_steps(a, r)
    if not contract.owned(a, r):
        return f"{where}: row {r} (k={k}, p={p!r}) is not the split kernels' (p >= 1, or k < V): untouched"
    x = contract.row_values(a, r)
    cut = cutoffs(x, None, p, False).get("top-p")
    rule = f"C35 keeps logits > {cut[0]!r} and the first {cut[1]} equal to it ({cut[2]} kept)" if cut else "no finite logit"
    return f"{where}: row {r}, p={p!r}; {rule}"
