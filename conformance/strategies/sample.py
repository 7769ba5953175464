"""Rows for Model Runner V2's sampling parameters: requests sharing rows (a request's verification
rows), temperatures 0, -0.0, 1, tiny, subnormal and huge, min-p 0, 1, tiny, above 1, negative and
NaN, logits at the min-p threshold, infinite, subnormal and huge logits, strided rows and
vocabularies off the tile width."""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.strategies import cases_for, generator, int_dtypes, seeds
from contracts import sample as contract

TEMPERATURES = (0.0, -0.0, 1.0, 0.7, 1.3, 2.0, 1e-7, 3e-39, 5e6, 1e30)
MIN_PS = (0.0, 0.0, 0.05, 0.1, 0.5, 1.0, 1e-9, 1.5, -0.1, float("nan"))


@st.composite
def _launch(draw: st.DrawFn, kernel: str, values: tuple[float, ...]) -> Case:
    g = generator(draw(seeds))
    n = draw(st.integers(0, 6))
    v = draw(st.one_of(st.integers(0, 40), st.integers(41, 700), st.sampled_from([1024, 2049])))
    states = draw(st.integers(1, 6))
    mapping = draw(st.lists(st.integers(0, states - 1), min_size=n, max_size=n))
    params = torch.tensor([draw(st.sampled_from(values)) for _ in range(states)], dtype=torch.float32)
    pad = draw(st.sampled_from([0, 0, 3, 17]))
    logits = torch.randn(n, v + pad, generator=g) * draw(st.sampled_from([0.5, 3.0, 40.0]))
    if n and v:
        logits.view(-1)[torch.randint(0, n * (v + pad), (max(1, n * v // 10),), generator=g)] = float("-inf")
        if kernel == contract.K36 and draw(st.booleans()):
            logits[0, draw(st.integers(0, v - 1))] = draw(st.sampled_from([float("inf"), -0.0, 1e-40, 3e38]))
            event("an infinite, zero, subnormal or huge logit")
    if pad and draw(st.booleans()):
        logits = logits[:, :v]  # rows inside a wider buffer
        event("strided rows")
    if kernel == contract.K37 and n and v:  # a logit exactly at its row's threshold: kept (x < threshold masks)
        r = draw(st.integers(0, n - 1))
        p = params[mapping[r]]
        row = logits[r, :v]
        if 0.0 < float(p) <= 1.0 and bool(torch.isfinite(row.max())):
            row[draw(st.integers(0, v - 1))] = contract.min_p_threshold(row.max(), p)
            event("a logit at the threshold")
    block = draw(st.sampled_from([16, 64, 1024] if v <= 1024 else [1024, 8192]))
    args = dict(
        logits_ptr=logits,
        logits_stride=logits.stride(0) if n else v,
        expanded_idx_mapping_ptr=torch.tensor(mapping, dtype=torch.int64).to(draw(int_dtypes)),
        **{"temperature_ptr" if kernel == contract.K36 else "min_p_ptr": params},
        vocab_size=v,
        BLOCK_SIZE=block,
    )
    return Case(kernel, args)


@cases_for(contract.K36)
def temperature_cases() -> st.SearchStrategy[Case]:
    return _launch(contract.K36, TEMPERATURES)


@cases_for(contract.K37)
def min_p_cases() -> st.SearchStrategy[Case]:
    return _launch(contract.K37, MIN_PS)


SAMPLE_TEMPERATURES = (0.0, 0.0, 0.7, 1.0, 1.3, 1e-3, 50.0)


@st.composite
def _gumbel(draw: st.DrawFn) -> Case:
    g = generator(draw(seeds))
    n = draw(st.integers(0, 6))
    v = draw(st.one_of(st.integers(1, 40), st.integers(41, 700), st.sampled_from([1024, 2049])))
    block = draw(st.sampled_from([16, 64, 1024] if v <= 1024 else [1024]))
    nb = -(-v // block)
    drafter = draw(st.booleans())  # the drafter's launch: its cache, its salt, the temperature in the kernel
    per_token = drafter and draw(st.integers(0, 4)) == 0
    states = draw(st.integers(max(1, n if drafter and not per_token else 1), 8))
    if drafter and not per_token:  # one row per request, as the drafter's idx_mapping has
        mapping = draw(st.permutations(range(states)))[:n]
    else:
        mapping = draw(st.lists(st.integers(0, states - 1), min_size=n, max_size=n))
    if n and draw(st.integers(0, 3)) == 0:  # CUDA-graph padding rows
        mapping = [m if draw(st.integers(0, 2)) else -1 for m in mapping]
        event("padding rows")
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16, torch.float16])) if drafter else torch.float32
    pad = draw(st.sampled_from([0, 0, 5]))
    logits = (torch.randn(n, v + pad, generator=g) * draw(st.sampled_from([0.5, 3.0, 20.0]))).to(dtype)
    if n and v:
        logits.view(-1)[torch.randint(0, n * (v + pad), (max(1, n * v // 8),), generator=g)] = float("-inf")
        if draw(st.booleans()):  # equal maxima (signed zeros among them): the tile's first maximum wins
            logits[0, : min(v, 3)] = 1e4 if draw(st.booleans()) else -0.0
            logits[0, 1 : min(v, 3) : 2] = 1e4 if float(logits[0, 0]) == 1e4 else 0.0
            event("tied maxima")
        if draw(st.integers(0, 3)) == 0:  # a tile with no finite logit
            logits[n - 1, : min(v, block)] = float("-inf")
    if pad and draw(st.booleans()):
        logits = logits[:, :v]
        event("strided rows")
    use_fp64 = draw(st.booleans())
    temps = torch.tensor([draw(st.sampled_from(SAMPLE_TEMPERATURES)) for _ in range(states)], dtype=torch.float32)
    cache = col = None
    s0 = s1 = 0
    if drafter:
        cols = draw(st.integers(1, 3))
        cache = torch.full((states, cols, v + draw(st.sampled_from([0, 3]))), 7.0, dtype=dtype)
        s0, s1 = cache.stride(0), cache.stride(1)
        col = (torch.randint(0, cols, (n,), generator=g) if per_token else torch.tensor(draw(st.integers(0, cols - 1))))
        col = col.to(draw(st.sampled_from([torch.int64, torch.int32])))
        if per_token and n:  # rows of one request take distinct columns (a cell has one writer)
            used: dict[int, set[int]] = {}
            for r, m in enumerate(mapping):
                free = [c for c in range(cols) if c not in used.setdefault(m, set())]
                if m >= 0 and not free:
                    mapping[r] = -1
                    continue
                if m >= 0:
                    col[r] = free[0]
                    used[m].add(free[0])
    args = dict(
        local_argmax_ptr=torch.empty(n, nb, dtype=torch.int64),
        local_argmax_stride=nb,
        local_max_ptr=torch.empty(n, nb, dtype=torch.float64 if use_fp64 else torch.float32),
        local_max_stride=nb,
        logits_cache_ptr=cache,
        logits_cache_stride_0=s0,
        logits_cache_stride_1=s1,
        logits_cache_col_ptr=col,
        logits_cache_source_ptr=logits if drafter else None,
        logits_cache_source_stride=logits.stride(0) if drafter and n else 0,
        logits_ptr=logits,
        logits_stride=logits.stride(0) if n else v,
        expanded_idx_mapping_ptr=torch.tensor(mapping, dtype=torch.int64).to(draw(int_dtypes)),
        seeds_ptr=torch.randint(-(2**62), 2**62, (states,), generator=g),
        pos_ptr=torch.randint(0, draw(st.sampled_from([64, 2**20, 2**29])), (n,), generator=g).to(draw(int_dtypes)),
        temp_ptr=temps,
        vocab_size=v,
        BLOCK_SIZE=block,
        IS_DRAFTING=drafter,
        APPLY_TEMPERATURE=drafter,
        USE_FP64=use_fp64,
        PER_TOKEN_COL=per_token,
    )
    if draw(st.integers(0, 5)) == 0:  # off the call sites: the flags apart
        args["IS_DRAFTING"], args["APPLY_TEMPERATURE"] = draw(st.booleans()), draw(st.booleans())
    return Case(contract.K38, args)


@cases_for(contract.K38)
def gumbel_cases() -> st.SearchStrategy[Case]:
    return _gumbel()


def _rows(test: Callable[[Args, Outputs, int, float], bool], table: str) -> Callable[[str, Args, Outputs], int]:
    def count(kernel: str, a: Args, out: Outputs) -> int:
        if not a["vocab_size"]:
            return 0
        return sum(1 for r in range(contract.rows(a)) if test(a, out, r, float(a[table][int(a["expanded_idx_mapping_ptr"][r])])))

    return count


def _untouched(a: Args, out: Outputs, r: int, value: float) -> bool:
    return value == 0.0 or (value == 1.0 and "temperature_ptr" in a)


def _far(a: Args, out: Outputs, r: int, t: float) -> bool:
    return t != 0.0 and not (2.0**-20 <= abs(t) <= 2.0**20)  # Triton's reciprocal range: the general division


def _masks(a: Args, out: Outputs, r: int, p: float) -> bool:
    before = a["logits_ptr"][r, : a["vocab_size"]]
    after = out["logits_ptr"][r, : a["vocab_size"]]
    return bool(((after == float("-inf")) & (before != float("-inf"))).any())


def _whole(a: Args, out: Outputs, r: int, p: float) -> bool:
    return bool((out["logits_ptr"][r, : a["vocab_size"]] == float("-inf")).all()) and _masks(a, out, r, p)


def _ties_kept(a: Args, out: Outputs, r: int, p: float) -> bool:
    return p == 1.0 and _masks(a, out, r, p)


def _at_threshold(a: Args, out: Outputs, r: int, p: float) -> bool:
    row = a["logits_ptr"][r, : a["vocab_size"]]
    if p == 0.0 or not bool(torch.isfinite(row.max())):
        return False
    return bool((row == contract.min_p_threshold(row.max(), torch.tensor(p))).any())


def _sampling_rows(test: Callable[[Args, int, float], bool]) -> Callable[[str, Args, Outputs], int]:
    def count(kernel: str, a: Args, out: Outputs) -> int:
        total = 0
        for r in range(contract.rows(a)):
            s_ = int(a["expanded_idx_mapping_ptr"][r])
            total += test(a, r, float(a["temp_ptr"][s_]) if s_ >= 0 else 0.0)
        return total

    return count


def _tied_tile(a: Args, r: int, t: float) -> bool:
    if t != 0.0:
        return False
    row = a["logits_ptr"][r, : a["vocab_size"]].float()
    block = a["BLOCK_SIZE"]
    return any(int((tile == tile.max()).sum()) > 1 for tile in row.split(block) if bool(torch.isfinite(tile.max())))


def _dead_tile(a: Args, r: int, t: float) -> bool:
    row = a["logits_ptr"][r, : a["vocab_size"]].float()
    return any(bool((tile == float("-inf")).all()) for tile in row.split(a["BLOCK_SIZE"]))


CLASSES: tuple[StateClass, ...] = (
    StateClass("row untouched", (contract.K36, contract.K37), lambda k, a, o: _rows(_untouched, "temperature_ptr" if k == contract.K36 else "min_p_ptr")(k, a, o),
               "temperature 0 (-0.0 too) or 1; min-p 0: the row is not written"),
    StateClass("temperature outside [2**-20, 2**20]", (contract.K36,), _rows(_far, "temperature_ptr"),
               "tiny, subnormal or huge: our Triton divides the general way"),
    StateClass("min-p masks", (contract.K37,), _rows(_masks, "min_p_ptr"), "logits below max + log(min_p) become -inf"),
    StateClass("min-p 1 keeps the maximum's ties", (contract.K37,), _rows(_ties_kept, "min_p_ptr"), "threshold = max"),
    StateClass("a row masked whole", (contract.K37,), _rows(_whole, "min_p_ptr"), "min-p above 1: the threshold exceeds the maximum"),
    StateClass("a logit at the threshold", (contract.K37,), _rows(_at_threshold, "min_p_ptr"), "kept: only logits below it are masked"),
    StateClass("a padding row", (contract.K38,), _sampling_rows(lambda a, r, t: int(a["expanded_idx_mapping_ptr"][r]) < 0),
               "no request: no noise, no cache write, the tiles' plain argmax"),
    StateClass("greedy row", (contract.K38,), _sampling_rows(lambda a, r, t: int(a["expanded_idx_mapping_ptr"][r]) >= 0 and t == 0.0),
               "temperature 0: the tiles' plain argmax"),
    StateClass("the draft's salted stream", (contract.K38,), _sampling_rows(lambda a, r, t: a["IS_DRAFTING"] and t != 0.0),
               "IS_DRAFTING: the position plus 2**30"),
    StateClass("the draft-logits cache written", (contract.K38,),
               _sampling_rows(lambda a, r, t: a["logits_cache_ptr"] is not None and int(a["expanded_idx_mapping_ptr"][r]) >= 0),
               "a request's raw logits copied at its state and column; its seed takes the column (spec_step_seed)"),
    StateClass("float64 noise", (contract.K38,), _sampling_rows(lambda a, r, t: a["USE_FP64"] and t != 0.0), "USE_FP64"),
    StateClass("tied maximum in a greedy tile", (contract.K38,), _sampling_rows(_tied_tile), "the tile's first maximum wins"),
    StateClass("a tile of -inf only", (contract.K38,), _sampling_rows(_dead_tile), "its first column at -inf"),
)
