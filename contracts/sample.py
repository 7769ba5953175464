"""Contract of Model Runner V2's sampling parameters (docs/sample.md, C41; vLLM's
``vllm/v1/worker/gpu/sample/``).

Before MRV2's sampler or rejection sampler sees a logit, ``Sampler.apply_sampling_params``
(``sampler.py:226``) copies the logits to float32 and applies each row's parameters in place, one
row per token (a request's verification rows share its parameters through
``expanded_idx_mapping``): the temperature (K36, ``gumbel.py:22``), then min-p (K37,
``min_p.py:9``). Rows are ``logits_stride`` apart, ``vocab_size`` columns each; the grid is one
program per row and vocabulary tile for K36, one per row for K37.

Then it samples: K38 ``_gumbel_sample_kernel`` (``gumbel.py:282``) writes each tile's Gumbel-max
winner and score for the host to reduce, at the target's sampler (``sampler.py:350``, the
temperature already applied) and at every draft step of the drafter (``speculator.py:462``: the
temperature applied in the kernel, the draft stream salted, the raw logits copied into the
rejection sampler's draft-logits cache).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from contracts import numerics
from contracts._checks import require_rows
from contracts.spec import (
    INT,
    Earlier,
    Flag,
    KernelSpec,
    Role,
    at_least,
    cdiv,
    constexpr,
    in_int32,
    power_of_two,
    ptr,
    require,
    scalar,
)

F32, F64, I32, I64 = torch.float32, torch.float64, torch.int32, torch.int64
BF16, F16 = torch.bfloat16, torch.float16
K36, K37, K38 = "_temperature_kernel", "_min_p_kernel", "_gumbel_sample_kernel"
DRAFT_NOISE_SALT = 1 << 30  # added to a draft step's position: the draft's noise apart from the target's
_MODULE = "vllm.v1.worker.gpu.sample"


def rows(a: Mapping[str, Any]) -> int:
    """The rows a launch processes: the logits' rows (the call site's grid, ``logits.shape[0]``)."""
    return a["logits_ptr"].shape[0]


def _tiles_fit(k: str, a: Mapping[str, Any], least_vocab: int) -> None:
    """The vocabulary and its tiles: column indices are int32, a tile at most 2**16 wide."""
    v, block = a["vocab_size"], a["BLOCK_SIZE"]
    at_least(k, "vocab_size", v, least_vocab)
    power_of_two(k, "BLOCK_SIZE", block)
    require(block <= 2**16, k, "BLOCK_SIZE", f"must be <= 65536 (a tile), got {block}")
    in_int32(k, "vocab_size", v + block, "vocab_size + BLOCK_SIZE (column indices are int32)")


def _rows_at(k: str, a: Mapping[str, Any], name: str, stride_name: str, width: int) -> None:
    """The rows' ``width`` elements of ``name``, ``stride_name`` apart: the call sites pass the tensor's
    stride(0), and rows written never overlap."""
    n, stride = rows(a), a[stride_name]
    if n > 1:
        require(stride == a[name].stride(0), k, stride_name, f"must be {name}'s row stride {a[name].stride(0)}, got {stride}")
        at_least(k, stride_name, stride, width)
    require_rows(k, name, a[name], n, stride, width)


def _preconditions(name: str, per_request: str) -> Any:
    def check(a: Mapping[str, Any]) -> None:
        v, n = a["vocab_size"], rows(a)
        _tiles_fit(name, a, 0)
        _rows_at(name, a, "logits_ptr", "logits_stride", v)
        mapping = a["expanded_idx_mapping_ptr"]
        require(mapping.numel() >= n, name, "expanded_idx_mapping_ptr", f"must hold a request state per row ({n}), has {mapping.numel()}")
        states = a[per_request].numel()
        if n:
            m = mapping[:n].to(torch.int64)
            bad = (m < 0) | (m >= states)
            if bool(bad.any()):
                i = int(bad.nonzero()[0])
                raise ValueError(f"{name}: 'expanded_idx_mapping_ptr' entry {i} = {int(m[i])} must index '{per_request}' "
                                 f"of {states} request states")
        if n and v:
            _read_rows(name, a)

    return check


def _read_rows(name: str, a: Mapping[str, Any]) -> None:
    """C41's domain where a row is read: no NaN logit (a NaN maximum, and a NaN quotient's bits, are
    platform-defined, as C30 says), and a temperature that divides is finite and positive (vLLM's
    sampling parameters refuse a negative one; NaN and infinite ones make NaN quotients)."""
    table = "temperature_ptr" if name == K36 else "min_p_ptr"
    for r in range(rows(a)):
        s = int(a["expanded_idx_mapping_ptr"][r])
        value = float(a[table][s])
        if value == 0.0 or (name == K36 and value == 1.0):
            continue
        if name == K36:
            require(0.0 < value < float("inf"), name, table,
                    f"must be 0, 1, or finite and positive where a row divides by it (C41); state {s} holds {value!r}")
        row = a["logits_ptr"][r, : a["vocab_size"]]
        if bool(torch.isnan(row).any()):
            c = int(torch.isnan(row).nonzero()[0])
            raise ValueError(f"{name}: 'logits_ptr' must hold no NaN in a row it {'divides' if name == K36 else 'masks'} "
                             f"(C41); row {r}, column {c}")


def min_p_threshold(row_max: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """C41's min-p threshold: the row's float32 maximum plus C29's log of min-p, rounded once."""
    return (row_max.to(F32) + numerics.log32(min_p.to(F32).reshape(1))[0]).to(F32)


def _row_of(a: Mapping[str, Any], index: int) -> tuple[int, int]:
    return divmod(index, a["logits_stride"]) if a["logits_stride"] else (0, index)


def _explain(per_request: str) -> Any:
    def explain(a: Mapping[str, Any], output: str, index: int) -> str:
        r, c = _row_of(a, index)
        if r >= rows(a) or c >= a["vocab_size"]:
            return f"flat index {index} lies outside the rows' {a['vocab_size']} columns: it must stay untouched"
        s = int(a["expanded_idx_mapping_ptr"][r])
        value = float(a[per_request][s])
        return f"row {r}, column {c} -> request state {s}: {per_request.removesuffix('_ptr')} {value!r}"

    return explain


def _rule(name: str) -> Any:
    def rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
        r, c = _row_of(a, index)
        if r >= rows(a) or c >= a["vocab_size"]:
            return "C41 untouched columns"
        return "C41 temperature" if name == K36 else "C41 min-p threshold"

    return rule


def _bytes(per_request: str) -> Any:
    def moved(a: Mapping[str, Any]) -> int:
        n, v = rows(a), a["vocab_size"]
        return 2 * n * v * 4 + n * (a["expanded_idx_mapping_ptr"].element_size() + 4)

    return moved


def _params(per_request: str, doc: str) -> tuple:
    return (
        ptr("logits_ptr", (F32,), F32, "[T, >= V] float32 logits (the sampler's copy), rows logits_stride apart; in place",
            role=Role.INOUT, ndim=(2,), contiguous=False),
        scalar("logits_stride", "row stride of logits (logits.stride(0))"),
        ptr("expanded_idx_mapping_ptr", INT, I32, "[>= T] each row's request state"),
        ptr(per_request, (F32,), F32, doc),
        scalar("vocab_size", "V, the columns of a row"),
        constexpr("BLOCK_SIZE", "vocabulary tile width (8192 for K36, 1024 for K37 at the call site)"),
    )


TEMPERATURE = KernelSpec(
    name=K36,
    family="sample",
    qualname=f"{_MODULE}.gumbel.{K36}",
    params=_params("temperature_ptr", "[max_num_reqs] each request's temperature"),
    grid=lambda a: (rows(a), cdiv(a["vocab_size"], a["BLOCK_SIZE"])),
    preconditions=_preconditions(K36, "temperature_ptr"),
    explain=_explain("temperature_ptr"),
    rule=_rule(K36),
    bytes_moved=_bytes("temperature_ptr"),
)

MIN_P = KernelSpec(
    name=K37,
    family="sample",
    qualname=f"{_MODULE}.min_p.{K37}",
    params=_params("min_p_ptr", "[max_num_reqs] each request's min-p (0: off)"),
    grid=lambda a: (rows(a),),
    preconditions=_preconditions(K37, "min_p_ptr"),
    explain=_explain("min_p_ptr"),
    rule=_rule(K37),
    bytes_moved=_bytes("min_p_ptr"),
)


# -- K38 ---------------------------------------------------------------------------------------------
def tiles(a: Mapping[str, Any]) -> int:
    return cdiv(a["vocab_size"], a["BLOCK_SIZE"])


def _finite_positive_or_zero(name: str, table: str, t: torch.Tensor, s: int) -> float:
    value = float(t[s])
    require(value == 0.0 or 0.0 < value < float("inf"), name, table,
            f"must be 0 or finite and positive for a row that samples (C41); state {s} holds {value!r}")
    return value


def _gumbel_preconditions(a: Mapping[str, Any]) -> None:
    k, v = K38, a["vocab_size"]
    n = rows(a)
    _tiles_fit(k, a, 1)
    nb = tiles(a)
    for name, stride_name, width in (("logits_ptr", "logits_stride", v), ("local_argmax_ptr", "local_argmax_stride", nb),
                                     ("local_max_ptr", "local_max_stride", nb)):
        _rows_at(k, a, name, stride_name, width)
    for name in ("expanded_idx_mapping_ptr", "pos_ptr"):
        require(a[name].numel() >= n, k, name, f"must hold an entry per row ({n}), has {a[name].numel()}")
    cache = a["logits_cache_ptr"]
    if cache is not None:
        col_t, src = a["logits_cache_col_ptr"], a["logits_cache_source_ptr"]
        require(col_t is not None, k, "logits_cache_col_ptr", "must be given with logits_cache_ptr")
        require(src is not None, k, "logits_cache_source_ptr", "must be given with logits_cache_ptr (the host passes the logits)")
        require(src.dtype == cache.dtype, k, "logits_cache_source_ptr", f"must have logits_cache_ptr's dtype {cache.dtype}, has {src.dtype}")
        _rows_at(k, a, "logits_cache_source_ptr", "logits_cache_source_stride", v)
        need = n if a["PER_TOKEN_COL"] else 1
        require(col_t.numel() >= need, k, "logits_cache_col_ptr", f"must hold {need} column(s), has {col_t.numel()}")
        at_least(k, "logits_cache_stride_0", a["logits_cache_stride_0"], 0)
        at_least(k, "logits_cache_stride_1", a["logits_cache_stride_1"], 0)
    spans: list[tuple[int, int]] = []
    for r in range(n):
        s_ = int(a["expanded_idx_mapping_ptr"][r])
        pos = int(a["pos_ptr"][r])
        require(0 <= pos < 2**62, k, "pos_ptr", f"entry {r} = {pos} must be a position in [0, 2**62)")
        row = a["logits_ptr"][r, :v].to(F32)
        bad = torch.isnan(row) | (row == float("inf"))
        if bool(bad.any()):
            raise ValueError(f"{k}: 'logits_ptr' must hold finite values or -inf (C30); row {r}, column {int(bad.nonzero()[0])}")
        if s_ < 0:
            continue  # a padding row: no request, no noise, no cache write
        for table in ("temp_ptr", "seeds_ptr"):
            require(s_ < a[table].numel(), k, "expanded_idx_mapping_ptr",
                    f"entry {r} = {s_} must index '{table}' of {a[table].numel()} request states (or be negative: padding)")
        _finite_positive_or_zero(k, "temp_ptr", a["temp_ptr"], s_)
        if cache is not None:
            col = int(a["logits_cache_col_ptr"].reshape(-1)[r if a["PER_TOKEN_COL"] else 0])
            require(col >= 0, k, "logits_cache_col_ptr", f"row {r}'s column {col} must be >= 0 (a draft step)")
            at = cache_offset(a, r)
            require(0 <= at and at + v <= cache.numel(), k, "logits_cache_col_ptr",
                    f"places row {r}'s cache copy (state {s_}) at flat [{at}, {at + v}), outside logits_cache_ptr's "
                    f"{cache.numel()} elements")
            spans.append((at, r))
    spans.sort()
    for (at, r), (nxt, r2) in zip(spans, spans[1:]):  # two rows copying into one cache cell race
        require(nxt >= at + v, k, "expanded_idx_mapping_ptr",
                f"rows {r} and {r2} copy into overlapping cache cells (flat {at} and {nxt}, {v} each)")


def cache_offset(a: Mapping[str, Any], r: int) -> int:
    """Where row ``r``'s copy of its logits starts in the draft-logits cache (flat)."""
    col = int(a["logits_cache_col_ptr"].reshape(-1)[r if a["PER_TOKEN_COL"] else 0])
    return int(a["expanded_idx_mapping_ptr"][r]) * a["logits_cache_stride_0"] + col * a["logits_cache_stride_1"]


def _gumbel_rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    if output == "logits_cache_ptr":
        return "C41 draft-logits cache"
    stride = a["local_argmax_stride" if output == "local_argmax_ptr" else "local_max_stride"] or 1
    r = index // stride
    if r >= rows(a):
        return "C41 untouched"
    s_ = int(a["expanded_idx_mapping_ptr"][r])
    if s_ < 0 or float(a["temp_ptr"][s_]) == 0.0:
        return "C41 tile argmax"
    return "C41 Gumbel tile" + (" (float64)" if a["USE_FP64"] else "")


def _gumbel_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    if output == "logits_cache_ptr":
        return f"draft-logits cache flat index {index}"
    stride = a["local_argmax_stride" if output == "local_argmax_ptr" else "local_max_stride"] or 1
    r, b = divmod(index, stride)
    if r >= rows(a):
        return f"flat index {index} lies past the {rows(a)} rows: it must stay untouched"
    s_ = int(a["expanded_idx_mapping_ptr"][r])
    line = f"row {r}, tile {b} (columns [{b * a['BLOCK_SIZE']}, {min((b + 1) * a['BLOCK_SIZE'], a['vocab_size'])}))"
    if s_ < 0:
        return line + ": a padding row (no noise)"
    return (line + f" -> state {s_}: temperature {float(a['temp_ptr'][s_])!r}, seed {int(a['seeds_ptr'][s_])}, "
            f"position {int(a['pos_ptr'][r])}{', drafting' if a['IS_DRAFTING'] else ''}")


def _gumbel_bytes(a: Mapping[str, Any]) -> int:
    n, v = rows(a), a["vocab_size"]
    moved = n * v * a["logits_ptr"].element_size() + n * tiles(a) * (8 + a["local_max_ptr"].element_size())
    if a["logits_cache_ptr"] is not None:
        moved += 2 * n * v * a["logits_cache_ptr"].element_size()
    return moved


_FLOATS = (F32, BF16, F16)
GUMBEL_SAMPLE = KernelSpec(
    name=K38,
    family="sample",
    qualname=f"{_MODULE}.gumbel.{K38}",
    params=(
        ptr("local_argmax_ptr", (I64,), I64, "[T, NB] each tile's winning column", role=Role.OUT, ndim=(2,), contiguous=False),
        scalar("local_argmax_stride"),
        ptr("local_max_ptr", (F32, F64), F32, "[T, NB] each tile's winning score", role=Role.OUT, ndim=(2,), contiguous=False,
            float64_rtol=2.0**-40),
        scalar("local_max_stride"),
        ptr("logits_cache_ptr", _FLOATS, F32, "[max_num_reqs, num_cols, >= V] the rejection sampler's draft logits, or None",
            role=Role.INOUT, optional=True, ndim=(3,)),
        scalar("logits_cache_stride_0"),
        scalar("logits_cache_stride_1"),
        ptr("logits_cache_col_ptr", INT, I64, "[1] the draft step, or [T] one per row (PER_TOKEN_COL)", optional=True,
            ndim=(0, 1)),
        ptr("logits_cache_source_ptr", _FLOATS, F32, "[T, >= V] what the cache stores (the raw logits)", optional=True,
            ndim=(2,), contiguous=False),
        scalar("logits_cache_source_stride"),
        ptr("logits_ptr", _FLOATS, F32, "[T, >= V] the processed logits, rows logits_stride apart", ndim=(2,), contiguous=False),
        scalar("logits_stride"),
        ptr("expanded_idx_mapping_ptr", INT, I32, "[>= T] each row's request state; negative: a padding row"),
        ptr("seeds_ptr", (I64,), I64, "[max_num_reqs] each request's seed"),
        ptr("pos_ptr", INT, I64, "[>= T] each row's position"),
        ptr("temp_ptr", (F32,), F32, "[max_num_reqs] each request's temperature (0: greedy)"),
        scalar("vocab_size", "V"),
        constexpr("BLOCK_SIZE", "vocabulary tile width (1024 at the call sites)"),
        constexpr("IS_DRAFTING", "salt the position (+2**30): the draft's noise apart from the target's"),
        constexpr("APPLY_TEMPERATURE", "divide by the temperature in the kernel (the drafter); the target's logits come divided"),
        constexpr("USE_FP64", "float64 scores and noise (local_max_ptr float64)"),
        constexpr("PER_TOKEN_COL", "logits_cache_col_ptr holds a column per row"),
    ),
    grid=lambda a: (rows(a), tiles(a)),
    preconditions=_gumbel_preconditions,
    flags=(
        Flag("USE_FP64", "local_max_ptr", lambda x: isinstance(x, torch.Tensor) and x.dtype == F64, "local_max_ptr is float64"),
        Flag("PER_TOKEN_COL", "logits_cache_col_ptr", lambda x: isinstance(x, torch.Tensor) and x.dim() > 0,
             "logits_cache_col_ptr has a dimension"),
    ),
    explain=_gumbel_explain,
    rule=_gumbel_rule,
    bytes_moved=_gumbel_bytes,
)

# Earlier releases drew the sampler's noise from Philox (tl.randint of seed and position), not murmur3:
# another stream, so their kernels are declared (drift), never bound.
_OUT = ("local_argmax_ptr", "local_argmax_stride", "local_max_ptr", "local_max_stride")
_IN = ("logits_ptr", "logits_stride", "expanded_idx_mapping_ptr", "seeds_ptr", "pos_ptr", "temp_ptr", "vocab_size", "BLOCK_SIZE")
GUMBEL_SAMPLE.earlier = (
    Earlier("0.20.2", (*_OUT, "processed_logits_ptr", "processed_logits_stride", *_IN, "APPLY_TEMPERATURE"),
            "Philox noise; the temperature-divided logits written back (processed_logits); no draft salt, no float64 noise"),
    Earlier("0.21.0", (*_OUT, "processed_logits_ptr", "processed_logits_stride", "processed_logits_col_ptr", *_IN, "APPLY_TEMPERATURE"),
            "Philox noise; the processed logits written back at a column; no draft salt, no float64 noise"),
    Earlier("0.30.0", (*_OUT, "logits_cache_ptr", "logits_cache_stride_0", "logits_cache_stride_1", "logits_cache_col_ptr", *_IN,
                       "IS_DRAFTING", "APPLY_TEMPERATURE", "USE_FP64", "PER_TOKEN_COL"),
            "Philox noise; the cache copies the logits themselves (no logits_cache_source)"),
)

SPECS = (TEMPERATURE, MIN_P, GUMBEL_SAMPLE)
