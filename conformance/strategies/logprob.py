"""Rows for Model Runner V2's logprob kernels: float32 processed and half-precision raw logits, rows
with -inf columns and of equal logits, ids that repeat and fall on -inf, more ids than a gather chunk
(a prompt's every token: 1 + V ids), tied and -inf sampled tokens, NaN columns for the ranks, strided
rows and vocabularies off the tile width; for K45, requests with and without their own ids, NUM_TOPK
0, and output buffers holding earlier values."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.strategies import cases_for, generator, int_dtypes, seeds
from contracts import logprob as contract
from contracts.spec import cdiv, next_power_of_2

INF = math.inf
_DTYPES = [torch.float32, torch.float32, torch.float32, torch.bfloat16, torch.float16]


@st.composite
def _shape(draw: st.DrawFn, call_block: int) -> tuple[int, int, int]:
    """(rows, V, BLOCK_SIZE): the call site's tile often; narrow tiles only where interpreted Triton
    keeps up (a few dozen tiles a row)."""
    n = draw(st.integers(0, 5))
    v = draw(st.one_of(st.integers(1, 40), st.integers(41, 700), st.sampled_from([1024, 2049, 3000])))
    narrow = [b for b in (16, 64, 256) if cdiv(v, b) <= 48]
    block = draw(st.sampled_from([call_block, call_block, *narrow]))
    return n, v, block


@st.composite
def _logits(draw: st.DrawFn, n: int, v: int, g: torch.Generator) -> torch.Tensor:
    """[n, V] (or V columns of a wider buffer) with -inf columns, equal rows and tied maxima; every row
    keeps a value above -inf (C45)."""
    x = torch.randn(n, v, generator=g) * draw(st.sampled_from([0.5, 3.0, 20.0]))
    if n and v > 1 and draw(st.booleans()):
        x.view(-1)[torch.randint(0, n * v, (max(1, n * v // 6),), generator=g)] = -INF
        x[:, draw(st.integers(0, v - 1))] = draw(st.sampled_from([0.0, 2.5]))  # a value above -inf per row
        event("rows with -inf columns")
    if n and draw(st.integers(0, 3)) == 0:
        x[draw(st.integers(0, n - 1))] = draw(st.sampled_from([0.0, 7.5, -1e4]))  # equal logits: -RN(ln V)
    if n and v > 2 and draw(st.booleans()):  # tied maxima, signed zeros among them
        top = 50.0 if draw(st.booleans()) else 0.0
        x[0, : min(v, 4)] = top
        if top == 0.0:
            x[0, 1] = -0.0
        event("tied maxima")
    x = x.to(draw(st.sampled_from(_DTYPES)))
    pad = draw(st.sampled_from([0, 0, 3]))
    if pad:
        wide = torch.full((n, v + pad), 9.0, dtype=x.dtype)
        wide[:, :v] = x
        x = wide[:, :v]
        event("strided rows")
    return x


@st.composite
def _log_softmax(draw: st.DrawFn) -> Case:
    g = generator(draw(seeds))
    n, v, block = draw(_shape(1024))
    x = draw(_logits(n, v, g))
    every = draw(st.integers(0, 9)) == 0 and v <= 2049  # a prompt's every token: 1 + V ids, several chunks
    k = v if every else draw(st.one_of(st.integers(0, min(v, 8)), st.integers(0, min(v, 40))))
    topk = 1 + k if draw(st.integers(0, 19)) else 0
    sampled = torch.randint(0, v, (n, 1), generator=g)
    if n and v and draw(st.booleans()):  # sampled tokens at -inf (a forced or replayed token)
        dead = (x.float() == -INF).nonzero()
        if len(dead):
            sampled[dead[0, 0], 0] = dead[0, 1]
    top = torch.topk(x.float(), k, dim=-1).indices if k and n else torch.zeros(n, k, dtype=torch.int64)
    if draw(st.booleans()):  # ids of the request's own (any, repeating)
        top = torch.randint(0, v, (n, k), generator=g)
    ids = torch.cat((sampled, top), 1)[:, :topk] if topk else torch.zeros(n, 1, dtype=torch.int64)
    if draw(st.integers(0, 4)) == 0:  # the rows of a wider buffer
        wide = torch.zeros(n, ids.shape[1] + 2, dtype=torch.int64)
        wide[:, : ids.shape[1]] = ids
        ids = wide[:, : ids.shape[1]]
    ids = ids.to(draw(st.sampled_from([torch.int64, torch.int64, torch.int32])))
    chunk = min(next_power_of_2(max(topk, 1)), contract.MAX_TOPK_BLOCK)
    if draw(st.integers(0, 3)) == 0:
        chunk = draw(st.sampled_from([1, 2, 4, 8]))  # off the call site: several chunks a row
    args = dict(
        output_ptr=torch.empty(n, topk),
        logits_ptr=x,
        logits_stride=x.stride(0) if n else v,
        topk_ids_ptr=ids,
        topk_ids_stride=ids.stride(0) if n else topk,
        topk=topk,
        vocab_size=v,
        BLOCK_SIZE=block,
        TOPK_BLOCK_SIZE=chunk,
    )
    return Case(contract.K43, args)


@cases_for(contract.K43)
def log_softmax_cases() -> st.SearchStrategy[Case]:
    return _log_softmax()


@st.composite
def _ranks(draw: st.DrawFn) -> Case:
    g = generator(draw(seeds))
    n, v, block = draw(_shape(8192))
    x = draw(_logits(n, v, g))
    tokens = torch.randint(0, v, (n,), generator=g)
    if n and v > 1:
        for r in range(n):
            how = draw(st.integers(0, 4))
            row = x[r].float()
            if how == 1:  # at the row's maximum (ties with it)
                tokens[r] = int(row.argmax())
            elif how == 2 and bool((row == -INF).any()):  # at -inf: every column counts
                tokens[r] = int((row == -INF).nonzero()[0])
        if draw(st.integers(0, 5)) == 0:  # NaN columns (never counted), a NaN token (rank 0)
            x[n - 1, draw(st.integers(0, v - 1))] = float("nan")
            if draw(st.booleans()):
                tokens[n - 1] = int(x[n - 1].float().isnan().nonzero()[0])
            event("a NaN column")
    args = dict(
        output_ptr=torch.empty(n, dtype=torch.int64),
        logits_ptr=x,
        logits_stride=x.stride(0) if n else v,
        token_ids_ptr=tokens.to(draw(st.sampled_from([torch.int64, torch.int64, torch.int32]))),
        vocab_size=v,
        BLOCK_SIZE=block,
    )
    return Case(contract.K44, args)


@cases_for(contract.K44)
def ranks_cases() -> st.SearchStrategy[Case]:
    return _ranks()


@st.composite
def _fill(draw: st.DrawFn) -> Case:
    g = generator(draw(seeds))
    n = draw(st.integers(0, 6))
    states = draw(st.integers(1, 6))
    width = draw(st.sampled_from([128, 128, 8]))  # vLLM's MAX_LOGPROB_TOKEN_IDS, or a narrow table
    counts = [draw(st.sampled_from([0, 0, 1, 2, 5, width])) for _ in range(states)]
    if not any(counts):  # the call site launches K45 only when some request names ids
        counts[0] = draw(st.integers(1, width))
    mapping = draw(st.lists(st.integers(0, states - 1), min_size=n, max_size=n))
    num_topk = draw(st.sampled_from([0, 0, 1, 3, 5, 20]))
    num_cols = max(num_topk, max((counts[m] for m in mapping), default=1), 1)
    padded = next_power_of_2(num_cols) * draw(st.sampled_from([1, 1, 1, 2]))
    table = torch.randint(0, 2**31 - 1, (states, width), generator=g, dtype=torch.int64).to(torch.int32)
    extra = draw(st.sampled_from([0, 0, 2]))  # buffers wider than the call site's
    out = torch.zeros(n, 1 + num_cols + extra, dtype=torch.int64)
    valid = torch.zeros(n, 1 + num_cols + extra, dtype=torch.bool)
    if draw(st.booleans()):  # earlier values past the columns written must survive
        out = torch.randint(-50, 50, out.shape, generator=g)
        valid = torch.rand(valid.shape, generator=g) < 0.5
        event("outputs holding earlier values")
    topk = torch.randint(0, 2**31 - 1, (n, num_topk), generator=g, dtype=torch.int64).to(torch.int32) if num_topk else table
    args = dict(
        out_token_ids_ptr=out,
        out_token_ids_stride=out.stride(0),
        out_valid_mask_ptr=valid,
        out_valid_mask_stride=valid.stride(0),
        sampled_token_ids_ptr=torch.randint(0, 2**31 - 1, (n,), generator=g).to(draw(st.sampled_from([torch.int64, torch.int32]))),
        topk_indices_ptr=topk.to(draw(int_dtypes)),
        topk_indices_stride=topk.stride(0),
        expanded_idx_mapping_ptr=torch.tensor(mapping, dtype=torch.int64).to(draw(int_dtypes)),
        num_per_req_token_ids_ptr=torch.tensor(counts, dtype=torch.int32).to(draw(int_dtypes)),
        per_req_token_ids_ptr=table,
        per_req_token_ids_stride=table.stride(0),
        NUM_TOPK=num_topk,
        PADDED_COLS=padded,
    )
    return Case(contract.K45, args)


@cases_for(contract.K45)
def fill_cases() -> st.SearchStrategy[Case]:
    return _fill()


# -- state classes -------------------------------------------------------------------------------------
def _rows(test: Callable[[Args, int], bool]) -> Callable[[str, Args, Outputs], int]:
    """A class's count: the launch's rows that pass ``test``."""

    def count(kernel: str, a: Args, out: Outputs) -> int:
        return sum(1 for r in range(contract.rows(a)) if test(a, r))

    return count


def _scored(a: Args, r: int) -> torch.Tensor:
    return contract.gather_rows(a["topk_ids_ptr"], r + 1, a["topk_ids_stride"], a["topk"])[r].to(torch.int64)


def _row(a: Args, r: int) -> torch.Tensor:
    return a["logits_ptr"][r, : a["vocab_size"]].float()


def _token_logit(a: Args, r: int) -> float:
    return float(_row(a, r)[int(a["token_ids_ptr"][r])])


CLASSES: tuple[StateClass, ...] = (
    StateClass("ids repeat", (contract.K43,), _rows(lambda a, r: a["topk"] > 0 and _scored(a, r).unique().numel() < a["topk"]),
               "a row scores one id twice (the sampled token among its top-k): the same score twice"),
    StateClass("an id at -inf", (contract.K43,), _rows(lambda a, r: a["topk"] > 0 and bool((_row(a, r)[_scored(a, r)] == -INF).any())),
               "its score is -inf"),
    StateClass("several id chunks", (contract.K43,), lambda k, a, o: int(a["topk"] > a["TOPK_BLOCK_SIZE"]) * contract.rows(a),
               "more ids than TOPK_BLOCK_SIZE: the gather runs in chunks (a prompt's 1 + V ids at the call site)"),
    StateClass("rows with -inf columns", (contract.K43, contract.K44), _rows(lambda a, r: bool((_row(a, r) == -INF).any())),
               "exp32(-inf) adds nothing to a tile's sum; a -inf column is >= only a -inf token"),
    StateClass("a vocabulary off the tile", (contract.K43, contract.K44),
               lambda k, a, o: contract.rows(a) * int(a["vocab_size"] % a["BLOCK_SIZE"] != 0),
               "the last tile's columns past V add nothing and are never counted"),
    StateClass("equal logits", (contract.K43,), _rows(lambda a, r: a["topk"] > 0 and bool((_row(a, r) == _row(a, r)[0]).all())),
               "every x - G is 0: each score is -RN(ln V)"),
    StateClass("half-precision logits", (contract.K43, contract.K44),
               lambda k, a, o: contract.rows(a) * int(a["logits_ptr"].dtype != torch.float32),
               "the model's raw bfloat16 or float16 logits (raw logprobs modes, prompt logprobs)"),
    StateClass("ties at the token's logit", (contract.K44,), _rows(lambda a, r: int((_row(a, r) == _token_logit(a, r)).sum()) > 1),
               "the rank counts every column equal to the token's logit (-0.0 == +0.0)"),
    StateClass("a sampled token at -inf", (contract.K44,), _rows(lambda a, r: _token_logit(a, r) == -INF),
               "every column of [0, V) counts, the padding lanes past V do not"),
    StateClass("custom ids", (contract.K45,), _rows(lambda a, r: contract.custom_counts(a)[r] > 0),
               "the request's own ids replace the top-k"),
    StateClass("top-k ids", (contract.K45,), _rows(lambda a, r: contract.custom_counts(a)[r] <= 0 and a["NUM_TOPK"] > 0),
               "a request without its own ids takes the row's top-k"),
    StateClass("sampled token alone", (contract.K45,), _rows(lambda a, r: contract.custom_counts(a)[r] <= 0 and a["NUM_TOPK"] == 0),
               "NUM_TOPK 0 and no ids of its own: column 0 only (the top-k placeholder never read)"),
)
