"""Contract of Model Runner V2's sampling parameters (docs/sample.md, C41; vLLM's
``vllm/v1/worker/gpu/sample/``).

Before MRV2's sampler or rejection sampler sees a logit, ``Sampler.apply_sampling_params``
(``sampler.py:226``) copies the logits to float32 and applies each row's parameters in place, one
row per token (a request's verification rows share its parameters through
``expanded_idx_mapping``): the temperature (K36, ``gumbel.py:22``), then min-p (K37,
``min_p.py:9``). Rows are ``logits_stride`` apart, ``vocab_size`` columns each; the grid is one
program per row and vocabulary tile for K36, one per row for K37.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from contracts import numerics
from contracts._checks import require_rows
from contracts.spec import (
    INT,
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

F32, I32 = torch.float32, torch.int32
K36, K37 = "_temperature_kernel", "_min_p_kernel"
_MODULE = "vllm.v1.worker.gpu.sample"


def rows(a: Mapping[str, Any]) -> int:
    """The rows a launch processes: the logits' rows (the call site's grid, ``logits.shape[0]``)."""
    return a["logits_ptr"].shape[0]


def _preconditions(name: str, per_request: str) -> Any:
    def check(a: Mapping[str, Any]) -> None:
        v, stride, n = a["vocab_size"], a["logits_stride"], rows(a)
        at_least(name, "vocab_size", v, 0)
        in_int32(name, "vocab_size", v + a["BLOCK_SIZE"], "vocab_size + BLOCK_SIZE (column indices are int32)")
        power_of_two(name, "BLOCK_SIZE", a["BLOCK_SIZE"])
        require(a["BLOCK_SIZE"] <= 2**16, name, "BLOCK_SIZE", f"must be <= 65536 (a tile), got {a['BLOCK_SIZE']}")
        if n > 1:  # the call site passes logits.stride(0); rows written in place never overlap
            require(stride == a["logits_ptr"].stride(0), name, "logits_stride",
                    f"must be logits_ptr's row stride {a['logits_ptr'].stride(0)}, got {stride}")
            at_least(name, "logits_stride", stride, v)
        require_rows(name, "logits_ptr", a["logits_ptr"], n, stride, v)
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

SPECS = (TEMPERATURE, MIN_P)
