"""Contract of Model Runner V2's logprob kernels (docs/logprob.md, C45; vLLM's
``vllm/v1/worker/gpu/sample/logprob.py``).

When a request asks for logprobs, ``compute_topk_scores`` (``logprob.py:111``) gathers, for each
logits row (a sampled token: the sampler's, the rejection sampler's accepted and bonus tokens, or a
prompt position's next token), the ids whose scores it returns: the sampled token first, then the
row's top-k or the request's own ``logprob_token_ids``, built by K45
``_fill_logprob_token_ids_kernel`` (``logprob.py:193``) when some request named ids. K43
``_topk_log_softmax_kernel`` (``logprob.py:17``, from ``compute_token_logprobs``) writes the row's
log-softmax at those ids, and K44 ``_ranks_kernel`` (``logprob.py:62``) the sampled token's rank.
The grid is one program per row for all three.

C45: the log-softmax is C29's. G is the row's float32 maximum (``-0.0`` read as ``+0.0``); tile b
of ``BLOCK_SIZE`` columns sums ``exp32(x - G)`` exactly (``numerics.exact_sum``, K13's tile sums,
every tile at the row's maximum); L is the C29 log-sum-exp of those tiles (``numerics.logsumexp``:
the float64 ``tree_sum`` of the tile sums, its float64 log, rounded to float32), and the score of
id ``i`` is ``(x[i] - G) - L``, two float32 subtractions as vLLM's ``logits - max_val - lse``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from contracts import numerics
from contracts._checks import flat_view, require_rows
from contracts.spec import (
    INT,
    Earlier,
    KernelSpec,
    Role,
    at_least,
    cdiv,
    constexpr,
    in_int32,
    next_power_of_2,
    power_of_two,
    ptr,
    require,
    scalar,
)

F32, I32, I64, BOOL = torch.float32, torch.int32, torch.int64, torch.bool
LOGITS = (torch.float32, torch.bfloat16, torch.float16)
K43, K44, K45 = "_topk_log_softmax_kernel", "_ranks_kernel", "_fill_logprob_token_ids_kernel"
_MODULE = "vllm.v1.worker.gpu.sample.logprob"
# C29: a tile's exact sum of at most 2^16 terms in [0, 1] fits int64 in units of 2^-46.
MAX_BLOCK = 1 << 16
# compute_token_logprobs caps the id chunk at this many (vLLM's _MAX_TOPK_BLOCK).
MAX_TOPK_BLOCK = 1024


def rows(a: Mapping[str, Any]) -> int:
    """The rows a launch processes: the logits' rows for K43 and K44 (the call sites' grid,
    ``logits.shape[0]``), the output's for K45 (``batch_size``, the rows it allocates)."""
    t = a["out_token_ids_ptr"] if "out_token_ids_ptr" in a else a["logits_ptr"]
    return t.shape[0]


def _tiles_fit(k: str, a: Mapping[str, Any], name: str, extent: str) -> None:
    """A tile width: a power of two of at most 2^16 (C29's exact tile sums), and the columns it
    steps over plus one tile within int32 (vLLM's column indices are int32)."""
    block, n = a[name], a[extent]
    at_least(k, extent, n, 0)
    power_of_two(k, name, block)
    require(block <= MAX_BLOCK, k, name, f"must be <= {MAX_BLOCK} (a tile), got {block}")
    in_int32(k, extent, n + block, f"{extent} + {name} (column indices are int32)")


def _rows_at(k: str, a: Mapping[str, Any], name: str, stride_name: str, width: int, n: int | None = None) -> None:
    """The rows' ``width`` elements of ``name``, ``stride_name`` apart: the call sites pass the tensor's
    stride(0), and rows written never overlap."""
    n = rows(a) if n is None else n
    stride = a[stride_name]
    if n > 1:
        require(stride == a[name].stride(0), k, stride_name, f"must be {name}'s row stride {a[name].stride(0)}, got {stride}")
        at_least(k, stride_name, stride, width)
    require_rows(k, name, a[name], n, stride, width)


def gather_rows(t: torch.Tensor, n: int, stride: int, width: int) -> torch.Tensor:
    """``[n, width]``: flat elements ``r * stride + c`` of ``t``, as a kernel addresses them from its
    data pointer (inside ``t``: the preconditions' ``require_rows``)."""
    if not (n and width):
        return t.new_zeros((n, width))
    at = torch.arange(n, dtype=I64)[:, None] * stride + torch.arange(width, dtype=I64)[None, :]
    return flat_view(t)[at]


def _first_bad(bad: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in bad.nonzero()[0])


# -- K43 ---------------------------------------------------------------------------------------------
def log_normalizer(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """C45's (G, L) of one row ``x`` (its ``V`` logits as float32): G the maximum, ``-0.0`` read as
    ``+0.0``; L the C29 log-sum-exp of the tiles of ``block`` columns, each tile the exact sum of
    ``exp32(x - G)`` over its columns (``exp32(-inf) = 0``)."""
    v = x.numel()
    nb = cdiv(v, block)
    g = x.max() + 0.0
    tiles = torch.full((nb * block,), float("-inf"), dtype=F32)
    tiles[:v] = x
    sums = numerics.exact_sum(numerics.exp32(tiles.view(nb, block) - g))
    # Every tile at the row's maximum: logsumexp's shifts are all 0, its G 0, so L = RN(log(tree_sum)).
    return g, numerics.logsumexp(torch.zeros(nb, dtype=F32), sums)


def log_softmax_at(x: torch.Tensor, ids: torch.Tensor, block: int) -> torch.Tensor:
    """C45: the scores of a row ``x`` (float32) at ``ids``: ``(x[id] - G) - L``, each rounded."""
    g, lse = log_normalizer(x, block)
    return (x[ids.to(I64)] - g) - lse


def _log_softmax_preconditions(a: Mapping[str, Any]) -> None:
    k, n, v, topk = K43, rows(a), a["vocab_size"], a["topk"]
    _tiles_fit(k, a, "BLOCK_SIZE", "vocab_size")
    _tiles_fit(k, a, "TOPK_BLOCK_SIZE", "topk")
    # The kernel reads every row it is launched for, whatever topk (vLLM's reads the maxima first).
    _rows_at(k, a, "logits_ptr", "logits_stride", v)
    if not (n and topk):
        return  # nothing written, nothing decided
    _rows_at(k, a, "topk_ids_ptr", "topk_ids_stride", topk)
    out = a["output_ptr"]
    require(out.numel() >= n * topk, k, "output_ptr",
            f"must hold {n} rows of topk = {topk} scores (written at row * topk), has {out.numel()} elements")
    ids = gather_rows(a["topk_ids_ptr"], n, a["topk_ids_stride"], topk).to(I64)
    bad = (ids < 0) | (ids >= v)
    if bool(bad.any()):
        r, c = _first_bad(bad)
        raise ValueError(f"{k}: 'topk_ids_ptr' must hold token ids in [0, vocab_size = {v}); row {r}, column {c} "
                         f"holds {int(ids[r, c])}")
    x = a["logits_ptr"][:n, :v].to(F32)
    # C45's domain: a NaN or +inf logit makes the row's scores NaN (inf - inf), a row of -inf only
    # too (-inf - -inf), and a NaN's bits are the platform's (C30).
    bad = torch.isnan(x) | (x == float("inf"))
    if bool(bad.any()):
        r, c = _first_bad(bad)
        raise ValueError(f"{k}: 'logits_ptr' must hold finite values or -inf in the rows it scores (C45); row {r}, "
                         f"column {c} holds {float(x[r, c])!r}")
    dead = ~(x > float("-inf")).any(1)
    if bool(dead.any()):
        raise ValueError(f"{k}: 'logits_ptr' must hold a logit above -inf in every row it scores (C45: the row's "
                         f"normalizer is otherwise NaN); row {int(dead.nonzero()[0])} holds none")


def _log_softmax_rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    n, topk = rows(a), a["topk"]
    return "C45 log-softmax" if topk and index < n * topk else "C45 untouched"


def _log_softmax_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    n, topk = rows(a), a["topk"]
    if not topk or index >= n * topk:
        return f"flat index {index} lies past the {n} rows of {topk} scores: it must stay untouched"
    r, c = divmod(index, topk)
    token = int(gather_rows(a["topk_ids_ptr"], r + 1, a["topk_ids_stride"], topk)[r, c])
    x = a["logits_ptr"][r, : a["vocab_size"]].to(F32)
    g, lse = log_normalizer(x, a["BLOCK_SIZE"])
    return (f"row {r}, column {c}: token {token}, logit {float(x[token])!r}, row maximum {float(g)!r}, "
            f"log-sum-exp {float(lse)!r} ({cdiv(a['vocab_size'], a['BLOCK_SIZE'])} tiles)")


def _log_softmax_bytes(a: Mapping[str, Any]) -> int:
    n, v, topk = rows(a), a["vocab_size"], a["topk"]
    return n * v * a["logits_ptr"].element_size() + n * topk * (a["topk_ids_ptr"].element_size() + 4)


def _log_softmax_call_site(a: Mapping[str, Any]) -> bool:
    topk = a["topk"]
    return a["BLOCK_SIZE"] == 1024 and a["TOPK_BLOCK_SIZE"] == min(next_power_of_2(topk), MAX_TOPK_BLOCK)


_LOGITS_DOC = "[B, >= V] logits (float32 processed, or the model's raw logits), rows logits_stride apart"

TOPK_LOG_SOFTMAX = KernelSpec(
    name=K43,
    family="logprob",
    qualname=f"{_MODULE}.{K43}",
    params=(
        ptr("output_ptr", (F32,), F32, "[B, topk] each row's scores, written at row * topk", role=Role.OUT, ndim=(2,)),
        ptr("logits_ptr", LOGITS, F32, _LOGITS_DOC, ndim=(2,), contiguous=False),
        scalar("logits_stride", "row stride of logits (logits.stride(0))"),
        ptr("topk_ids_ptr", INT, I64, "[B, >= topk] the ids scored: the sampled token, then the top-k or the "
            "request's own ids", ndim=(2,), contiguous=False),
        scalar("topk_ids_stride", "row stride of topk_ids (token_ids.stride(0))"),
        scalar("topk", "ids scored per row (1 + num_logprobs at the call sites)"),
        scalar("vocab_size", "V, the columns of a row"),
        constexpr("BLOCK_SIZE", "vocabulary tile width (1024 at the call site)"),
        constexpr("TOPK_BLOCK_SIZE", "ids gathered at a time (min(next_power_of_2(topk), 1024) at the call site)"),
    ),
    grid=lambda a: (rows(a),),
    preconditions=_log_softmax_preconditions,
    explain=_log_softmax_explain,
    rule=_log_softmax_rule,
    call_site=_log_softmax_call_site,
    bytes_moved=_log_softmax_bytes,
)

# Earlier releases read the ids at row * topk (no stride): declared (drift), never bound.
_K43_COMMON = ("output_ptr", "logits_ptr", "logits_stride", "topk_ids_ptr", "topk", "vocab_size", "BLOCK_SIZE")
TOPK_LOG_SOFTMAX.earlier = (
    Earlier("0.21.0", (*_K43_COMMON, "PADDED_TOPK"), "ids at row * topk (no stride), gathered in one PADDED_TOPK block"),
    Earlier("0.30.0", (*_K43_COMMON, "TOPK_BLOCK_SIZE"), "ids at row * topk (no stride)"),
)


# -- K44 ---------------------------------------------------------------------------------------------
def rank(x: torch.Tensor, token: int) -> int:
    """C45: the columns of row ``x`` whose logit is >= the token's (IEEE comparisons: ``-0.0 == +0.0``,
    a NaN compares false, so a NaN column never counts and a NaN token ranks 0)."""
    return int((x >= x[token]).sum())


def _ranks_preconditions(a: Mapping[str, Any]) -> None:
    k, n, v = K44, rows(a), a["vocab_size"]
    _tiles_fit(k, a, "BLOCK_SIZE", "vocab_size")
    _rows_at(k, a, "logits_ptr", "logits_stride", v)
    for name in ("output_ptr", "token_ids_ptr"):
        require(a[name].numel() >= n, k, name, f"must hold an entry per row ({n}), has {a[name].numel()}")
    if n:
        ids = a["token_ids_ptr"][:n].to(I64)
        bad = (ids < 0) | (ids >= v)
        if bool(bad.any()):
            r = int(bad.nonzero()[0])
            raise ValueError(f"{k}: 'token_ids_ptr' must hold token ids in [0, vocab_size = {v}); row {r} holds {int(ids[r])}")


def _ranks_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    if index >= rows(a):
        return f"flat index {index} lies past the {rows(a)} rows: it must stay untouched"
    token = int(a["token_ids_ptr"][index])
    x = a["logits_ptr"][index, : a["vocab_size"]].to(F32)
    return (f"row {index}: token {token}, logit {float(x[token])!r}; {int((x > x[token]).sum())} columns above it, "
            f"{int((x == x[token]).sum())} equal (itself included)")


def _ranks_rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    if index >= rows(a):
        return "C45 untouched"
    x = a["logits_ptr"][index, : a["vocab_size"]]
    return "C45 rank at -inf" if float(x[int(a["token_ids_ptr"][index])]) == float("-inf") else "C45 rank"


RANKS = KernelSpec(
    name=K44,
    family="logprob",
    qualname=f"{_MODULE}.{K44}",
    params=(
        ptr("output_ptr", (I64,), I64, "[B] each row's rank of its token", role=Role.OUT),
        ptr("logits_ptr", LOGITS, F32, _LOGITS_DOC, ndim=(2,), contiguous=False),
        scalar("logits_stride", "row stride of logits (logits.stride(0))"),
        ptr("token_ids_ptr", INT, I64, "[B] each row's sampled token"),
        scalar("vocab_size", "V, the columns of a row"),
        constexpr("BLOCK_SIZE", "vocabulary tile width (8192 at the call site)"),
    ),
    grid=lambda a: (rows(a),),
    preconditions=_ranks_preconditions,
    explain=_ranks_explain,
    rule=_ranks_rule,
    call_site=lambda a: a["BLOCK_SIZE"] == 8192,
    bytes_moved=lambda a: rows(a) * (a["vocab_size"] * a["logits_ptr"].element_size() + 16),
)


# -- K45 ---------------------------------------------------------------------------------------------
def custom_counts(a: Mapping[str, Any]) -> list[int]:
    """Each row's count of the request's own ids (0 or less: none, the row takes the top-k)."""
    n = rows(a)
    states = a["expanded_idx_mapping_ptr"][:n].to(I64)
    return [int(c) for c in a["num_per_req_token_ids_ptr"].to(I64)[states]] if n else []


def written(a: Mapping[str, Any], r: int) -> int:
    """The columns after column 0 that row ``r`` writes: its request's own ids, else NUM_TOPK."""
    c = custom_counts(a)[r]
    return c if c > 0 else a["NUM_TOPK"]


def _fill_preconditions(a: Mapping[str, Any]) -> None:
    k, n, top, padded = K45, rows(a), a["NUM_TOPK"], a["PADDED_COLS"]
    power_of_two(k, "PADDED_COLS", padded)
    require(padded <= MAX_BLOCK, k, "PADDED_COLS", f"must be <= {MAX_BLOCK}, got {padded}")
    at_least(k, "NUM_TOPK", top, 0)
    require(top <= padded, k, "NUM_TOPK", f"must be <= PADDED_COLS = {padded} (the columns a row can write), got {top}")
    for name in ("sampled_token_ids_ptr", "expanded_idx_mapping_ptr"):
        require(a[name].numel() >= n, k, name, f"must hold an entry per row ({n}), has {a[name].numel()}")
    if not n:
        return
    states = a["expanded_idx_mapping_ptr"][:n].to(I64)
    count = a["num_per_req_token_ids_ptr"]
    bad = (states < 0) | (states >= count.numel())
    if bool(bad.any()):
        r = int(bad.nonzero()[0])
        raise ValueError(f"{k}: 'expanded_idx_mapping_ptr' entry {r} = {int(states[r])} must index "
                         f"'num_per_req_token_ids_ptr' of {count.numel()} request states")
    table, stride = a["per_req_token_ids_ptr"], a["per_req_token_ids_stride"]
    widest, takes_topk = 1, False
    for r, c in enumerate(custom_counts(a)):
        if c <= 0:
            takes_topk = True
            widest = max(widest, 1 + top)
            continue
        s = int(states[r])
        require(c <= padded, k, "num_per_req_token_ids_ptr",
                f"must hold counts <= PADDED_COLS = {padded} (a row writes at most that many ids); state {s} (row {r}) holds {c}")
        # A row of the table holds its request's ids: reading past its width reads the next request's.
        require(stride == table.stride(0), k, "per_req_token_ids_stride",
                f"must be per_req_token_ids' row stride {table.stride(0)}, got {stride}")
        require(c <= table.shape[1], k, "num_per_req_token_ids_ptr",
                f"must hold counts <= per_req_token_ids' width {table.shape[1]}; state {s} (row {r}) holds {c}")
        require(s < table.shape[0], k, "expanded_idx_mapping_ptr",
                f"entry {r} = {s} must index a row of 'per_req_token_ids_ptr' ({table.shape[0]} rows)")
        widest = max(widest, 1 + c)
    if takes_topk and top:
        # Only the rows that take the top-k read it (NUM_TOPK == 0: a placeholder, never read).
        topk_rows = [r for r, c in enumerate(custom_counts(a)) if c <= 0]
        _rows_at(k, a, "topk_indices_ptr", "topk_indices_stride", top, max(topk_rows) + 1)
    for name, stride_name in (("out_token_ids_ptr", "out_token_ids_stride"), ("out_valid_mask_ptr", "out_valid_mask_stride")):
        _rows_at(k, a, name, stride_name, widest)


def _fill_row(a: Mapping[str, Any], output: str, index: int) -> tuple[int, int]:
    stride = a["out_token_ids_stride" if output == "out_token_ids_ptr" else "out_valid_mask_stride"]
    return divmod(index, stride) if stride else (0, index)


def _fill_rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    r, c = _fill_row(a, output, index)
    if r >= rows(a) or c > written(a, r):
        return "C45 untouched"
    if c == 0:
        return "C45 sampled token"
    return "C45 request's ids" if custom_counts(a)[r] > 0 else "C45 top-k ids"


def _fill_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    r, c = _fill_row(a, output, index)
    if r >= rows(a):
        return f"flat index {index} lies past the {rows(a)} rows: it must stay untouched"
    s, count = int(a["expanded_idx_mapping_ptr"][r]), custom_counts(a)[r]
    line = f"row {r}, column {c} -> state {s}: {count} own ids, NUM_TOPK {a['NUM_TOPK']}"
    return line + (": past the columns written, it must stay untouched" if c > written(a, r) else "")


FILL_TOKEN_IDS = KernelSpec(
    name=K45,
    family="logprob",
    qualname=f"{_MODULE}.{K45}",
    params=(
        ptr("out_token_ids_ptr", (I64,), I64, "[B, 1 + num_cols] the ids to score (the host's zeros); written "
            "columns 0 .. the row's count", role=Role.INOUT, ndim=(2,), contiguous=False),
        scalar("out_token_ids_stride"),
        ptr("out_valid_mask_ptr", (BOOL,), BOOL, "[B, 1 + num_cols] which columns hold an id (the host's False)",
            role=Role.INOUT, ndim=(2,), contiguous=False),
        scalar("out_valid_mask_stride"),
        ptr("sampled_token_ids_ptr", INT, I64, "[B] each row's sampled token"),
        ptr("topk_indices_ptr", INT, I32, "[B, NUM_TOPK] the rows' top-k ids; NUM_TOPK == 0: any integer tensor "
            "(vLLM passes per_req_token_ids), never read", ndim=(2,), contiguous=False),
        scalar("topk_indices_stride"),
        ptr("expanded_idx_mapping_ptr", INT, I32, "[>= B] each row's request state"),
        ptr("num_per_req_token_ids_ptr", INT, I32, "[max_num_reqs] each request's count of own ids (0: none)"),
        ptr("per_req_token_ids_ptr", INT, I32, "[max_num_reqs, 128] each request's own ids", ndim=(2,), contiguous=False),
        scalar("per_req_token_ids_stride"),
        constexpr("NUM_TOPK", "top-k ids per row (num_logprobs; 0: none)"),
        constexpr("PADDED_COLS", "next_power_of_2(num_cols): the columns a row can write"),
    ),
    grid=lambda a: (rows(a),),
    preconditions=_fill_preconditions,
    explain=_fill_explain,
    rule=_fill_rule,
    call_site=lambda a: (a["out_token_ids_ptr"].shape[1] >= 2
                         and a["PADDED_COLS"] == next_power_of_2(a["out_token_ids_ptr"].shape[1] - 1)),
    bytes_moved=lambda a: rows(a) * (a["out_token_ids_ptr"].shape[1] * 9 + 16),
)

SPECS = (TOPK_LOG_SOFTMAX, RANKS, FILL_TOKEN_IDS)
