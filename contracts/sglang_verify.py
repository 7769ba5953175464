"""Contract of SGLang 0.5.23's speculative verification (docs/sglang_verify.md, C46-C48).

SGLang verifies an EAGLE draft tree (``eagle_utils.py``'s ``eagle_sample``) with one of three
kernels, each one program (or CUDA block) per request:

- K46 ``speculative_sampling_classic_kernel`` (Triton, ``reject_sampling.py``): chain rejection
  sampling with float32 coins, the strict product rule ``coin * q < p``, optionally block
  verification, and one final token per request drawn by inverse CDF (the recovered token, or the
  bonus when every draft is accepted).
- K47 ``verify_tree_greedy_kernel_triton`` (Triton, ``spec_tree.py``; XPU's form of the greedy
  verifier that CUDA and the CPU build run in C++): greedy verification over the ``retrive_*``
  linked lists of the draft tree.
- K48 ``tree_speculative_sampling_target_only`` (CUDA only; its JIT binding in ``sampling.py``):
  tree verification from the target's probabilities alone, with one shared coin per tree level. It
  writes ``draft_probs`` (rejected lanes := p): an input mutation, part of what it outputs here.

The layout is SGLang's: ``Predicts`` flat by tree slot (a request's node ``s`` at
``RetriveIndex[b, s]``), ``AcceptIndex[b, 0..num]`` the accepted path's slots, ``AcceptTokenNum[b]``
the accepted drafts (bonus excluded). Rules shared with vLLM's rejection sampler are imported from
its contract (C16's residual weight); the final draw sums in C29's exact fixed point.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from contracts import numerics
from contracts.rejection import residual_weight
from contracts.spec import (
    INT,
    KernelSpec,
    Role,
    at_least,
    constexpr,
    next_power_of_2,
    power_of_two,
    ptr,
    real,
    require,
    require_fits,
    scalar,
)

F32, F64, I32, I64 = torch.float32, torch.float64, torch.int32, torch.int64
K46 = "speculative_sampling_classic_kernel"
K47 = "verify_tree_greedy_kernel_triton"
K48 = "tree_speculative_sampling_target_only"
_MODULE = "sglang.kernels.ops.speculative"

# C46: a final-draw row sums to at most 2**16, so its weights' fixed-point sum (units of 2**-46,
# numerics.SUM_SCALE) stays below 2**62 whatever the vocabulary: a probability row sums to about 1.
ROW_SUM_LIMIT = 2.0**16
SUM_SCALE = numerics.SUM_SCALE


# -- rules (shared by the oracle, the strategies and the departures) ----------------------------------
def chain_accepts(p: torch.Tensor, q: torch.Tensor, coin: torch.Tensor) -> torch.Tensor:
    """C46a: a draft is accepted iff ``0 < q <= 1`` and ``coin * q < p``, the float32 product compared
    strictly (no division: p = 0 rejects at coin 0, and so does a q outside (0, 1] or NaN)."""
    p, q, coin = p.to(F32), q.to(F32), coin.to(F32)
    return (q > 0) & (q <= 1) & (coin * q < p)


def sanitized(q: torch.Tensor) -> torch.Tensor:
    """C46c: a draft probability outside [0, 1] (NaN, infinite, negative, above 1) counts as 0 in K46's
    residual."""
    return torch.where((q >= 0) & (q <= 1), q, torch.zeros_like(q))


def scaled(scale: float | torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``RN(scale * p)`` in float32: a rounded product, never fused into the subtraction after it."""
    return torch.as_tensor(scale, dtype=F32) * p.to(F32)


def units(w: torch.Tensor) -> torch.Tensor:
    """C46d: non-negative float32 weights in C29's fixed point, truncated to multiples of 2**-46 (int64),
    so that sums and prefix sums are exact in any order (numerics.exact_sum's units)."""
    return (w.to(F64) * SUM_SCALE).to(I64)


def mass(total_units: torch.Tensor | int) -> torch.Tensor:
    """A fixed-point sum as float32: to float64 (rounded), scaled exactly, rounded to float32 (as
    numerics.exact_sum)."""
    return (torch.as_tensor(total_units, dtype=I64).to(F64) * (1.0 / SUM_SCALE)).to(F32)


def cut(coin: torch.Tensor | float, total_units: torch.Tensor | int) -> int:
    """C46d: the draw's threshold in units: ``float64(coin) * float64(total)``, rounded once, truncated
    to an integer (the coin lies in [0, 1]); the token is the first whose prefix sum exceeds it."""
    c = torch.as_tensor(coin, dtype=F32).to(F64)
    return int((c * torch.as_tensor(total_units, dtype=I64).to(F64)).to(I64))


def draw(w_units: torch.Tensor, coin: torch.Tensor | float, total_units: int | None = None) -> int | None:
    """C46d: the first index whose inclusive prefix sum of ``w_units`` exceeds ``cut(coin, total)``
    (``total`` defaults to their sum); None when none does (then each kernel has its fallback)."""
    prefix = torch.cumsum(w_units, 0)
    total = int(prefix[-1]) if total_units is None else total_units
    hit = (prefix > cut(coin, total)).nonzero()
    return int(hit[0]) if hit.numel() else None


def prefix_ratio(h: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """C46e (block verification): ``h_s = min(RN(RN(h_{s-1} * p) / q), 1)`` where ``0 < q <= 1``, else 0
    (float32, the quotient correctly rounded)."""
    h, p, q = h.to(F32), p.to(F32), q.to(F32)
    ok = (q > 0) & (q <= 1)
    ratio = torch.minimum((h * p) / torch.where(ok, q, torch.ones_like(q)), torch.ones_like(p))
    return torch.where(ok, ratio, torch.zeros_like(p))


def block_accept_prob(m: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """C46e: ``RN(m / RN(RN(m + 1) - h))`` in float32, m the residual mass at the next row."""
    m, h = m.to(F32), h.to(F32)
    return m / ((m + 1.0) - h)


def target_only_accepts(p: torch.Tensor, prob_acc: torch.Tensor, coin: torch.Tensor, threshold_single: float,
                        threshold_acc: float) -> torch.Tensor:
    """C48a: a node is accepted iff ``p > 0`` and (``coin < RN(prob_acc / t_acc)`` or ``p >= t_single``),
    float32, ``t_acc = max(RN32(threshold_acc), 1e-9f)`` (SGLang's launcher), ``prob_acc`` the level's
    running float32 sum of p up to and including this node."""
    t_acc = torch.maximum(torch.tensor(threshold_acc, dtype=F32), torch.tensor(1e-9, dtype=F32))
    t_single = torch.tensor(threshold_single, dtype=F32)
    p, prob_acc, coin = p.to(F32), prob_acc.to(F32), coin.to(F32)
    return (p > 0) & ((coin < prob_acc / t_acc) | (p >= t_single))


# -- K46's decisions (the oracle's, the strategies' and the departures') ---------------------------------
def classic_decisions(a: dict, b: int, tests: list[tuple[float, float]] | None = None) -> tuple[int, torch.Tensor | float, int | None]:
    """K46's verification of request ``b``: (accepted drafts, the residual's scale, the residual mass's
    units where block verification summed them). ``tests`` collects (coin, threshold) of every
    block-verification comparison made."""
    slots = a["NUM_SLOTS"]
    drafts = a["Candidates"][b, :slots].tolist()
    p, q, coins = a["TargetProbs"][b], a["DraftProbs"][b], a["UniformSamples"][b]
    if a["BLOCK_VERIFICATION"]:
        return _block_verify(drafts, p, q, coins, slots, tests)
    return _token_by_token(drafts, p, q, coins, slots), 1.0, None


def classic_final_units(a: dict, b: int, num: int, scale: torch.Tensor | float) -> torch.Tensor:
    """C46c/C46d: the final draw's weights of request ``b`` in fixed-point units: p at row ``num`` for
    the bonus, else the residual max(RN(scale * p) - q', 0)."""
    p = a["TargetProbs"][b, num]
    if num == a["NUM_SLOTS"] - 1:
        return units(p)
    return units(residual_weight(scaled(scale, p) - sanitized(a["DraftProbs"][b, num])))


def _token_by_token(drafts: list[int], p: torch.Tensor, q: torch.Tensor, coins: torch.Tensor, slots: int) -> int:
    """C46a: the drafts accepted before the first rejection."""
    num = 0
    for s in range(1, slots):
        d = drafts[s]
        if not bool(chain_accepts(p[s - 1, d], q[s - 1, d], coins[s - 1])):
            break
        num = s
    return num


def _block_verify(drafts: list[int], p: torch.Tensor, q: torch.Tensor, coins: torch.Tensor, slots: int,
                  tests: list[tuple[float, float]] | None) -> tuple[int, torch.Tensor | float, int | None]:
    """C46e: (accepted drafts, the residual's scale h, the residual mass's units where it was summed)."""
    h = torch.tensor(1.0)
    ratios = []
    for s in range(1, slots):
        d = drafts[s]
        h = prefix_ratio(h, p[s - 1, d], q[s - 1, d])
        ratios.append(h)
    for step in range(slots - 1, 0, -1):  # the longest prefix first
        h, coin = ratios[step - 1], coins[step - 1]
        if tests is not None:
            tests.append((float(coin), float(h)))
        if not bool(coin < h):
            continue
        accept_prob, total = h, None
        if step < slots - 1 and 0.0 < float(h) < 1.0:
            # The residual mass at the next row, with the raw q (a precondition keeps it >= 0).
            total = int(units(residual_weight(scaled(h, p[step]) - q[step])).sum())
            accept_prob = block_accept_prob(mass(total), h)
            if tests is not None:
                tests.append((float(coin), float(accept_prob)))
        if bool(coin < accept_prob):
            return step, h, total
    return 0, 1.0, None


# -- where SGLang's float32 arithmetic may decide otherwise (conformance/departures.py) ---------------
def _request_of(a: Mapping[str, Any], output: str, index: int) -> int | None:
    """The request whose K46 output cell ``index`` (a flat index of the output as a tensor) is."""
    n, bs = a["NUM_SLOTS"], batch(a)
    if output == "AcceptTokenNum":
        b = index
    elif output == "AcceptIndex":
        b = index // n
    else:
        hit = (a["RetriveIndex"].to(I64).reshape(-1) == index).nonzero()
        b = int(hit[0]) // n if hit.numel() else bs
    return b if b < bs else None


def _float32_error(a: Mapping[str, Any]) -> float:
    """A float32 sum of V terms (a sequence, a tree or NumPy's pairwise sum) is off its exact value by
    about sqrt(V) ulps; four times that, relative."""
    return 4.0 * (math.sqrt(a["VOCAB_SIZE"]) + a["NUM_SLOTS"]) * 2.0**-24


def near_draw_boundary(a: Mapping[str, Any], output: str, index: int) -> bool:
    """C46d departure: the Predicts cell holds a request's final token, and its cut lies within
    ``_float32_error`` (relative to the row's sum) of a boundary of the contract's token or of the
    sum itself: float32 sums and scans put those boundaries elsewhere."""
    b = _request_of(a, output, index) if output == "Predicts" else None
    if b is None:
        return False
    num, scale, total = classic_decisions(a, b)
    w = classic_final_units(a, b, num, scale)
    prefix = torch.cumsum(w, 0)
    whole = int(prefix[-1]) if total is None else total
    at = cut(a["UniformSamplesFinal"][b], whole)
    token = draw(w, a["UniformSamplesFinal"][b], total)
    edges = [whole] + ([int(prefix[token]), int(prefix[token - 1]) if token else 0] if token is not None else [])
    return any(abs(at - e) <= _float32_error(a) * max(whole, 1) for e in edges)


def near_block_test(a: Mapping[str, Any], output: str, index: int) -> bool:
    """C46e departure: the cell's request compares a coin with a block-verification threshold (h, or
    the residual test m / (m + 1 - h)) within ``_float32_error`` of it (SGLang's float32 mass sum;
    compiled, its approximate division and fused products)."""
    b = _request_of(a, output, index) if a["BLOCK_VERIFICATION"] else None
    if b is None:
        return False
    tests: list[tuple[float, float]] = []
    classic_decisions(a, b, tests)
    return any(abs(coin - t) <= _float32_error(a) * abs(t) for coin, t in tests)


# -- shared checks ---------------------------------------------------------------------------------
def _shape(k: str, name: str, t: torch.Tensor, want: tuple[int | None, ...], what: str) -> None:
    """``t`` has ``len(want)`` dimensions, each the given size (None: at least the next entry's)."""
    ok = t.dim() == len(want) and all(w is None or n == w for n, w in zip(t.shape, want))
    require(ok, k, name, f"must have shape {what}, got {tuple(t.shape)}")


def _strides(k: str, a: Mapping[str, Any], name: str, stride_names: tuple[str, ...]) -> None:
    """Each stride argument is the tensor's own stride where that dimension has more than one index
    (SGLang's launcher passes ``t.stride(i)``; a dimension of one index is never stepped)."""
    t = a[name]
    for i, s in enumerate(stride_names):
        if t.shape[i] > 1:
            require(a[s] == t.stride(i), k, s, f"must be {name}'s stride({i}) = {t.stride(i)}, got {a[s]}")


def _in_unit_interval(k: str, name: str, x: torch.Tensor, what: str) -> None:
    bad = ~((x >= 0) & (x <= 1))
    if bool(bad.any()):
        i = tuple(int(j) for j in bad.nonzero()[0])
        raise ValueError(f"{k}: '{name}' must hold {what} in [0, 1]; {list(i)} holds {x[i].item()!r}")


def _probability_rows(k: str, name: str, rows: torch.Tensor) -> None:
    """C46/C48's domain of target probabilities: every value in [0, 1] and every row summing to at
    most 2**16 (the fixed-point draw's bound, ROW_SUM_LIMIT)."""
    _in_unit_interval(k, name, rows, "probabilities")
    if rows.numel():
        sums = rows.to(F64).sum(-1)
        over = sums > ROW_SUM_LIMIT
        if bool(over.any()):
            i = [int(j) for j in over.nonzero()[0]]
            raise ValueError(f"{k}: '{name}' row {i} sums to {float(sums[tuple(i)])}, above 2**16 (C46d)")


def _tree(k: str, a: Mapping[str, Any], bs: int, n: int, index: str, nxt: str, sib: str, slots: int) -> None:
    """A draft tree per request (C47b): links in [-1, n), every sibling list ending at -1 within n
    steps (no sibling cycle: SGLang's CUDA and CPU forms would walk it forever), and every node's slot
    in [0, slots), distinct over the batch (two programs never write one slot)."""
    for name in (nxt, sib):
        x = a[name][:bs].to(I64)
        bad = (x < -1) | (x >= n)
        if bool(bad.any()):
            b, s = (int(j) for j in bad.nonzero()[0])
            raise ValueError(f"{k}: '{name}' [{b}, {s}] = {int(x[b, s])} must be -1 or a node in [0, {n})")
    s_ = a[sib][:bs].to(I64)
    if bs and n:
        cur = torch.arange(n).expand(bs, n)
        for _ in range(n):
            cur = torch.where(cur >= 0, s_.gather(1, cur.clamp(min=0)), cur)
        if bool((cur >= 0).any()):
            b, s = (int(j) for j in (cur >= 0).nonzero()[0])
            raise ValueError(f"{k}: '{sib}' must end every sibling list at -1 within {n} steps; request {b}'s list "
                             f"from node {s} is a cycle (C47b)")
    idx = a[index][:bs].to(I64).reshape(-1)
    bad = (idx < 0) | (idx >= slots)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"{k}: '{index}' [{i // max(n, 1)}, {i % max(n, 1)}] = {int(idx[i])} must be a slot in [0, {slots})")
    if idx.numel() != torch.unique(idx).numel():
        raise ValueError(f"{k}: '{index}' must hold distinct slots (two requests never write one predicts slot)")


def _slots_fit(k: str, a: Mapping[str, Any], index: str, out: str, bs: int) -> None:
    if bs and a[index].numel():
        x = a[index][:bs]
        for v in (int(x.min()), int(x.max())):
            require_fits(k, index, v, out, a[out])


# -- K46 ---------------------------------------------------------------------------------------------
_K46_STRIDES = {
    "Candidates": ("stride_cand_b", "stride_cand_s"),
    "RetriveIndex": ("stride_idx_b", "stride_idx_s"),
    "UniformSamples": ("stride_uni_b", "stride_uni_s"),
    "TargetProbs": ("stride_tp_b", "stride_tp_s", "stride_tp_v"),
    "DraftProbs": ("stride_dp_b", "stride_dp_s", "stride_dp_v"),
}


def batch(a: Mapping[str, Any]) -> int:
    """K46's requests: its grid, ``candidates.shape[0]`` (SGLang's wrapper)."""
    return a["Candidates"].shape[0]


def classic_shapes(a: Mapping[str, Any]) -> None:
    """K46's constexprs, shapes and strides (the C++ port sees element counts: its launcher checks these)."""
    k = K46
    slots, v = a["NUM_SLOTS"], a["VOCAB_SIZE"]
    at_least(k, "NUM_SLOTS", slots, 1)
    at_least(k, "VOCAB_SIZE", v, 1)
    require(v < 2**31, k, "VOCAB_SIZE", f"must be < 2**31 (token ids are int32), got {v}")
    for name in ("BLOCK_V", "BLOCK_REDUCE"):
        power_of_two(k, name, a[name])
        require(a[name] <= 2**16, k, name, f"must be <= 65536 (a tile), got {a[name]}")
    bs = batch(a)
    _shape(k, "Candidates", a["Candidates"], (bs, slots), f"[bs, NUM_SLOTS={slots}]")
    _shape(k, "RetriveIndex", a["RetriveIndex"], (bs, slots), f"[bs={bs}, NUM_SLOTS={slots}]")
    acc, idx = a["AcceptIndex"], a["RetriveIndex"]
    # SGLang addresses AcceptIndex with RetriveIndex's strides.
    require(acc.shape == idx.shape and all(acc.stride(i) == idx.stride(i) for i in range(2) if acc.shape[i] > 1), k,
            "AcceptIndex", f"must have RetriveIndex's shape {tuple(idx.shape)} and strides {idx.stride()} (K46 addresses it "
            f"with RetriveIndex's strides), got {tuple(acc.shape)} {acc.stride()}")
    uni = a["UniformSamples"]
    require(uni.dim() == 2 and uni.shape[0] == bs and uni.shape[1] >= slots - 1, k, "UniformSamples",
            f"must have shape [bs={bs}, >= NUM_SLOTS - 1 = {slots - 1}], got {tuple(uni.shape)}")
    require(a["UniformSamplesFinal"].numel() >= bs, k, "UniformSamplesFinal", f"must hold a coin per request ({bs})")
    require(a["AcceptTokenNum"].numel() >= bs, k, "AcceptTokenNum", f"must hold a count per request ({bs})")
    for name, rows in (("TargetProbs", slots), ("DraftProbs", slots - 1)):
        t = a[name]
        require(t.dim() == 3 and t.shape[0] == bs and t.shape[1] >= rows and t.shape[2] == v, k, name,
                f"must have shape [bs={bs}, >= {rows}, VOCAB_SIZE={v}], got {tuple(t.shape)}")
    for name, strides in _K46_STRIDES.items():
        _strides(k, a, name, strides)


def _classic_preconditions(a: Mapping[str, Any]) -> None:
    k = K46
    classic_shapes(a)
    slots, v, bs = a["NUM_SLOTS"], a["VOCAB_SIZE"], batch(a)
    idx, uni = a["RetriveIndex"], a["UniformSamples"]
    if not bs:
        return
    drafts = a["Candidates"][:, 1:slots].to(I64)
    bad = (drafts < 0) | (drafts >= v)
    if bool(bad.any()):
        b, s = (int(j) for j in bad.nonzero()[0])
        raise ValueError(f"{k}: 'Candidates' [{b}, {s + 1}] = {int(drafts[b, s])} must be a draft id in [0, VOCAB_SIZE={v}) "
                         "(C46b: SGLang reads its probabilities unguarded)")
    n_pred = a["Predicts"].numel()
    flat = idx.to(I64).reshape(-1)
    bad = (flat < 0) | (flat >= n_pred)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"{k}: 'RetriveIndex' [{i // slots}, {i % slots}] = {int(flat[i])} must be a slot of Predicts in "
                         f"[0, {n_pred})")
    require(flat.numel() == torch.unique(flat).numel(), k, "RetriveIndex",
            "must hold distinct slots (two requests never write one Predicts slot)")
    _slots_fit(k, a, "RetriveIndex", "AcceptIndex", bs)
    require_fits(k, "VOCAB_SIZE", v - 1, "Predicts", a["Predicts"])
    _in_unit_interval(k, "UniformSamples", uni[:, : slots - 1], "coins")
    _in_unit_interval(k, "UniformSamplesFinal", a["UniformSamplesFinal"][:bs], "coins")
    _probability_rows(k, "TargetProbs", a["TargetProbs"][:, :slots])
    if a["BLOCK_VERIFICATION"]:
        # The residual mass of block verification takes the raw q (C46e): negative or NaN q would
        # leave the fixed point's range, or meet a platform-defined maximum.
        q = a["DraftProbs"][:, : slots - 1]
        bad = ~(q >= 0)
        if bool(bad.any()):
            i = [int(j) for j in bad.nonzero()[0]]
            raise ValueError(f"{k}: 'DraftProbs' {i} = {q[tuple(i)].item()!r} must be >= 0 (not NaN) under "
                             "BLOCK_VERIFICATION (C46e)")


def _classic_call_site(a: Mapping[str, Any]) -> bool:
    """``chain_speculative_sampling_triton``'s launch (eagle_utils.py): contiguous tensors, one slot per
    draft step plus the root, BLOCK_V 4096, BLOCK_REDUCE min(next_pow2(V), 32768), node s of
    request b at slot b * n + s."""
    bs, n, v = batch(a), a["NUM_SLOTS"], a["VOCAB_SIZE"]
    return (a["BLOCK_V"] == 4096 and a["BLOCK_REDUCE"] == min(next_power_of_2(v), 32768)
            and all(a[p].is_contiguous() for p in ("Candidates", "RetriveIndex", "UniformSamples", "AcceptIndex"))
            and a["DraftProbs"].shape[1] == n - 1 and a["UniformSamples"].shape[1] == n
            and a["Predicts"].numel() == bs * n
            and torch.equal(a["RetriveIndex"].to(I64), torch.arange(bs * n).view(bs, n)))


def _classic_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    b = _request_of(a, output, index)
    if b is None:
        return f"{output}[{index}] is no request's cell: it must stay untouched"
    lines = [f"request {b} ({'block verification' if a['BLOCK_VERIFICATION'] else 'token by token'}), final coin "
             f"{float(a['UniformSamplesFinal'][b])!r}"]
    for s in range(1, a["NUM_SLOTS"]):
        d = int(a["Candidates"][b, s])
        p, q = float(a["TargetProbs"][b, s - 1, d]), float(a["DraftProbs"][b, s - 1, d])
        lines.append(f"  step {s}: draft {d} p={p!r} q={q!r} coin={float(a['UniformSamples'][b, s - 1])!r}")
    return "\n".join(lines)


def _classic_rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    if output == "Predicts":
        return "C46d final draw"
    return "C46e block verification" if a["BLOCK_VERIFICATION"] else "C46a strict product"


def _classic_bytes(a: Mapping[str, Any]) -> int:
    bs, n, v = batch(a), a["NUM_SLOTS"], a["VOCAB_SIZE"]
    return bs * (2 * v * 4 + n * 8 * 3 + 8)


_IDX = dict(ndim=(2,), contiguous=False)
SPECULATIVE_SAMPLING_CLASSIC = KernelSpec(
    name=K46,
    family="sglang_verify",
    qualname=f"{_MODULE}.reject_sampling.{K46}",
    params=(
        ptr("Predicts", INT, I32, "[bs * n] each tree slot's token (the caller pre-fills 0); written at the accepted path",
            role=Role.OUT),
        ptr("AcceptIndex", INT, I32, "[bs, NUM_SLOTS] the accepted path's slots (the caller pre-fills -1); RetriveIndex's strides",
            role=Role.OUT, **_IDX),
        ptr("AcceptTokenNum", INT, I32, "[bs] accepted drafts, the bonus excluded", role=Role.OUT),
        ptr("Candidates", INT, I64, "[bs, NUM_SLOTS] the root (column 0) and the chain's drafts", **_IDX),
        ptr("RetriveIndex", INT, I64, "[bs, NUM_SLOTS] each node's slot in Predicts", **_IDX),
        ptr("UniformSamples", (F32,), F32, "[bs, >= NUM_SLOTS - 1] a coin per draft step", **_IDX),
        ptr("UniformSamplesFinal", (F32,), F32, "[bs] the final draw's coin"),
        ptr("TargetProbs", (F32,), F32, "[bs, >= NUM_SLOTS, V] p, row s after s accepted drafts", ndim=(3,)),
        ptr("DraftProbs", (F32,), F32, "[bs, >= NUM_SLOTS - 1, V] q, row s the draft of step s + 1", ndim=(3,)),
        scalar("stride_cand_b"), scalar("stride_cand_s"),
        scalar("stride_idx_b"), scalar("stride_idx_s"),
        scalar("stride_uni_b"), scalar("stride_uni_s"),
        scalar("stride_tp_b"), scalar("stride_tp_s"), scalar("stride_tp_v"),
        scalar("stride_dp_b"), scalar("stride_dp_s"), scalar("stride_dp_v"),
        constexpr("NUM_SLOTS", "n: the root plus the drafts (candidates.shape[1])"),
        constexpr("VOCAB_SIZE", "V"),
        constexpr("BLOCK_V", "the final draw's tile (4096 at the call site); the result never depends on it (C46d)"),
        constexpr("BLOCK_VERIFICATION", "block verification (arXiv 2403.10444, Algorithm 2) instead of token by token",
                  default=False),
        constexpr("BLOCK_REDUCE", "block verification's mass tile (min(next_pow2(V), 32768)); no result depends on it",
                  default=4096),
    ),
    grid=lambda a: (batch(a),),
    preconditions=_classic_preconditions,
    explain=_classic_explain,
    rule=_classic_rule,
    call_site=_classic_call_site,
    bytes_moved=_classic_bytes,
)


# -- K47 ---------------------------------------------------------------------------------------------
def greedy_shapes(a: Mapping[str, Any]) -> None:
    """K47's sizes and shapes (the C++ port sees element counts: its launcher checks these)."""
    k = K47
    bs, spec, n = a["batch_size"], a["num_speculative_tokens"], a["num_draft_tokens"]
    at_least(k, "batch_size", bs, 0)
    at_least(k, "num_speculative_tokens", spec, 1)
    at_least(k, "num_draft_tokens", n, 1)
    for name in ("candidates_ptr", "retrieve_index_ptr", "retrieve_next_token_ptr", "retrieve_next_sibling_ptr",
                 "target_predict_ptr"):
        _shape(k, name, a[name], (bs, n), f"[batch_size={bs}, num_draft_tokens={n}]")
    _shape(k, "accept_index_ptr", a["accept_index_ptr"], (bs, spec), f"[batch_size={bs}, num_speculative_tokens={spec}]")
    require(a["accept_token_num_ptr"].numel() >= bs, k, "accept_token_num_ptr", f"must hold a count per request ({bs})")


def _greedy_preconditions(a: Mapping[str, Any]) -> None:
    k = K47
    greedy_shapes(a)
    bs, spec, n = a["batch_size"], a["num_speculative_tokens"], a["num_draft_tokens"]
    if not bs:
        return
    # The target is read at the accepted node's slot (flat in target_predict), which predicts is written at.
    slots = min(a["predicts_ptr"].numel(), bs * n)
    _tree(k, a, bs, n, "retrieve_index_ptr", "retrieve_next_token_ptr", "retrieve_next_sibling_ptr", slots)
    _slots_fit(k, a, "retrieve_index_ptr", "accept_index_ptr", bs)
    _slots_fit(k, a, "target_predict_ptr", "predicts_ptr", bs)
    require_fits(k, "num_speculative_tokens", spec - 1, "accept_token_num_ptr", a["accept_token_num_ptr"])


def _greedy_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    n = a["num_draft_tokens"]
    if output == "predicts_ptr":
        return f"predicts slot {index}: request {index // n}'s node {index % n} when its tree keeps SGLang's layout"
    b = index if output == "accept_token_num_ptr" else index // max(a["num_speculative_tokens"], 1)
    if b >= a["batch_size"]:
        return f"flat index {index} lies past the {a['batch_size']} requests"
    return (f"request {b}: candidates {a['candidates_ptr'][b].tolist()}, targets {a['target_predict_ptr'][b].tolist()}, "
            f"first child {a['retrieve_next_token_ptr'][b].tolist()}, next sibling {a['retrieve_next_sibling_ptr'][b].tolist()}")


# The tree's index tensors: int64 at every SGLang call site (its CUDA and XPU paths).
TREE_INDICES = ("candidates_ptr", "retrieve_index_ptr", "retrieve_next_token_ptr", "retrieve_next_sibling_ptr",
                 "target_predict_ptr")

GREEDY_TREE = KernelSpec(
    name=K47,
    family="sglang_verify",
    qualname=f"{_MODULE}.spec_tree.{K47}",
    params=(
        ptr("predicts_ptr", INT, I32, "[>= bs * n] each tree slot's token (the caller pre-fills 0)", role=Role.OUT),
        ptr("accept_index_ptr", INT, I32, "[bs, spec] the accepted path's slots (the caller pre-fills -1)", role=Role.OUT,
            ndim=(2,)),
        ptr("accept_token_num_ptr", INT, I32, "[bs] accepted drafts, the bonus excluded", role=Role.OUT),
        ptr("candidates_ptr", INT, I64, "[bs, n] each node's token (node 0: the root)", ndim=(2,)),
        ptr("retrieve_index_ptr", INT, I64, "[bs, n] each node's slot in predicts and target_predict", ndim=(2,)),
        ptr("retrieve_next_token_ptr", INT, I64, "[bs, n] each node's first child, or -1", ndim=(2,)),
        ptr("retrieve_next_sibling_ptr", INT, I64, "[bs, n] each node's next sibling, or -1", ndim=(2,)),
        ptr("target_predict_ptr", INT, I64, "[bs, n] the target's argmax at each slot", ndim=(2,)),
        constexpr("batch_size", "bs (the grid); never read in the body"),
        constexpr("num_speculative_tokens", "spec: accept_index.shape[1], the deepest path plus its root"),
        constexpr("num_draft_tokens", "n: the tree's nodes (candidates.shape[1])"),
    ),
    grid=lambda a: (a["batch_size"],),
    preconditions=_greedy_preconditions,
    explain=_greedy_explain,
    rule=lambda a, output, index, kind: "C47a greedy tree walk",
    call_site=lambda a: (all(a[n].dtype == I64 for n in TREE_INDICES)
                         and a["predicts_ptr"].numel() == a["batch_size"] * a["num_draft_tokens"]
                         and torch.equal(a["retrieve_index_ptr"].to(I64),
                                         torch.arange(a["batch_size"] * a["num_draft_tokens"]).view(a["batch_size"], a["num_draft_tokens"]))),
    bytes_moved=lambda a: a["batch_size"] * a["num_draft_tokens"] * 8 * 5,
)


# -- K48 ---------------------------------------------------------------------------------------------
def target_only_shape(a: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(bs, n, spec, V) of a K48 launch, from its tensors as SGLang's launcher reads them."""
    bs, n = a["candidates"].shape
    return bs, n, a["accept_index"].shape[1], a["target_probs"].shape[-1]


def target_only_shapes(a: Mapping[str, Any]) -> None:
    """K48's shapes and thresholds, as SGLang's launcher checks them (the C++ port sees element counts
    and float32 thresholds: its launcher checks these)."""
    k = K48
    _shape(k, "candidates", a["candidates"], (None, None), "[bs, n]")
    bs, n = a["candidates"].shape
    for name in ("retrive_index", "retrive_next_token", "retrive_next_sibling", "uniform_samples"):
        _shape(k, name, a[name], (bs, n), f"[bs={bs}, n={n}]")
    _shape(k, "accept_index", a["accept_index"], (bs, None), f"[bs={bs}, spec]")
    _shape(k, "accept_token_num", a["accept_token_num"], (bs,), f"[bs={bs}]")
    _shape(k, "predicts", a["predicts"], (bs * n,), f"[bs * n = {bs * n}]")
    _shape(k, "uniform_samples_for_final_sampling", a["uniform_samples_for_final_sampling"], (bs,), f"[bs={bs}]")
    _shape(k, "target_probs", a["target_probs"], (bs, n, None), f"[bs={bs}, n={n}, V]")
    _, _, spec, v = target_only_shape(a)
    _shape(k, "draft_probs", a["draft_probs"], (bs, n, v), f"[bs={bs}, n={n}, V={v}]")
    require(n > 0, k, "candidates", "must have at least one node (n > 0)")
    require(spec > 0, k, "accept_index", "must have at least one column (spec > 0)")
    require(v > 0, k, "target_probs", "must have at least one column (V > 0)")
    require(v < 2**31, k, "target_probs", f"must have fewer than 2**31 columns (token ids are int32), got {v}")
    for name in ("threshold_single", "threshold_acc"):
        x = a[name]
        require(0.0 <= x <= 1.0, k, name, f"must be in [0, 1] (SGLang's launcher checks it), got {x!r}")


def _target_only_preconditions(a: Mapping[str, Any]) -> None:
    k = K48
    target_only_shapes(a)
    bs, n, _, v = target_only_shape(a)
    if not bs:
        return
    _tree(k, a, bs, n, "retrive_index", "retrive_next_token", "retrive_next_sibling", bs * n)
    drafts = a["candidates"]
    bad = (drafts < 0) | (drafts >= v)
    if bool(bad.any()):
        b, s = (int(j) for j in bad.nonzero()[0])
        raise ValueError(f"{k}: 'candidates' [{b}, {s}] = {int(drafts[b, s])} must be a token id in [0, V={v}) "
                         "(C48b: SGLang reads and writes its probabilities unguarded)")
    _in_unit_interval(k, "uniform_samples", a["uniform_samples"], "coins")
    _in_unit_interval(k, "uniform_samples_for_final_sampling", a["uniform_samples_for_final_sampling"], "coins")
    _probability_rows(k, "target_probs", a["target_probs"])
    _in_unit_interval(k, "draft_probs", a["draft_probs"], "probabilities")


def _target_only_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    bs, n, spec, v = target_only_shape(a)
    b = (index // (n * v) if output == "draft_probs" else index // n if output == "predicts"
         else index // spec if output == "accept_index" else index)
    if b >= bs:
        return f"flat index {index} lies past the {bs} requests"
    return (f"request {b}: candidates {a['candidates'][b].tolist()}, first child {a['retrive_next_token'][b].tolist()}, "
            f"next sibling {a['retrive_next_sibling'][b].tolist()}, coins {a['uniform_samples'][b].tolist()}, final coin "
            f"{float(a['uniform_samples_for_final_sampling'][b])!r}, thresholds {a['threshold_single']!r}/{a['threshold_acc']!r}")


def _target_only_rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    return {"draft_probs": "C48c rejected lanes written", "predicts": "C48d final draw"}.get(output, "C48a shared coin")


TARGET_ONLY = KernelSpec(
    name=K48,
    family="sglang_verify",
    qualname=f"{_MODULE}.sampling.{K48}",
    params=(
        ptr("predicts", (I32,), I32, "[bs * n] each tree slot's token (the caller pre-fills 0)", role=Role.OUT),
        ptr("accept_index", (I32,), I32, "[bs, spec] the accepted path's slots (the caller pre-fills -1)", role=Role.OUT,
            ndim=(2,)),
        ptr("accept_token_num", (I32,), I32, "[bs] accepted drafts, the bonus excluded", role=Role.OUT),
        ptr("candidates", (I64,), I64, "[bs, n] each node's token (node 0: the root)", ndim=(2,)),
        ptr("retrive_index", (I64,), I64, "[bs, n] each node's slot in predicts", ndim=(2,)),
        ptr("retrive_next_token", (I64,), I64, "[bs, n] each node's first child, or -1", ndim=(2,)),
        ptr("retrive_next_sibling", (I64,), I64, "[bs, n] each node's next sibling, or -1", ndim=(2,)),
        ptr("uniform_samples", (F32,), F32, "[bs, n] the coin of the level below node s, at column s", ndim=(2,)),
        ptr("uniform_samples_for_final_sampling", (F32,), F32, "[bs] the final draw's coin"),
        ptr("target_probs", (F32,), F32, "[bs, n, V] p at each node", ndim=(3,)),
        ptr("draft_probs", (F32,), F32, "[bs, n, V] the residual's subtrahend (zeros at the call site); a rejected "
            "node's lane becomes p: an input mutation", role=Role.INOUT, ndim=(3,)),
        real("threshold_single", "a node with p >= it is accepted at any coin ([0, 1]; 1.0 at the call site)", default=1.0),
        real("threshold_acc", "the shared coin is compared with prob_acc / it ([0, 1]; 1.0 at the call site)", default=1.0),
        scalar("deterministic", "FlashInfer's deterministic scan; no result depends on it here (C48d)", default=True),
    ),
    grid=lambda a: (a["candidates"].shape[0],),
    preconditions=_target_only_preconditions,
    explain=_target_only_explain,
    rule=_target_only_rule,
    call_site=lambda a: (a["threshold_single"] == 1.0 and a["threshold_acc"] == 1.0 and bool(a["deterministic"])
                         and not bool(a["draft_probs"].any())),
    bytes_moved=lambda a: a["candidates"].shape[0] * (2 * a["target_probs"].shape[-1] * 4 + a["candidates"].shape[1] * 8 * 4),
    host=True,
)

SPECS = (SPECULATIVE_SAMPLING_CLASSIC, GREEDY_TREE, TARGET_ONLY)
