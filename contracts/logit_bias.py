"""Contract of Model Runner V2's logit bias (docs/logit_bias.md, C44; vLLM's
``vllm/v1/worker/gpu/sample/logit_bias.py``).

``LogitBiasState.apply`` runs K42 ``_bias_kernel`` (``logit_bias.py:159``) on the sampler's float32
copy of the logits, in place, before the temperature (``Sampler.apply_sampling_params``): one program
per row (a token; a request's verification rows share its state through ``expanded_idx_mapping``),
three steps in order.

1. Allowed token ids: where the request lists any, every other of the row's ``vocab_size`` columns
   becomes -inf and the listed ones keep their values.
2. Logit bias: each listed column adds its float32 bias.
3. Min tokens: while the row's position ``pos + 1 < min_len``, the request's stop tokens become
   -inf. With ``CHECK_ALL_MASKED_ROWS`` and the request's restore flag (a request with structured
   output), a row that this leaves all -inf gets back its stop tokens' finite values from before the
   mask.

The three per-request lists are rows of ``[max_num_reqs, width]`` tables, their lengths in
``num_*`` counts; ``BLOCK_SIZE`` (a power of two, 1024 at the call site: the widths' largest) holds a
list, ``LOGITS_BLOCK_SIZE`` (8192) tiles a row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from contracts._checks import require_rows
from contracts.spec import (
    INT,
    Earlier,
    KernelSpec,
    Role,
    at_least,
    constexpr,
    in_int32,
    power_of_two,
    ptr,
    require,
    scalar,
)

F32, I32, I64 = torch.float32, torch.int32, torch.int64
K42 = "_bias_kernel"
_MODULE = "vllm.v1.worker.gpu.sample.logit_bias"
INF = float("inf")

# (count, ids table, its stride, what the list is) of the three steps; the bias values ride with step 2.
ALLOWED = ("num_allowed_token_ids_ptr", "allowed_token_ids_ptr", "allowed_token_ids_stride", "allowed token ids")
BIAS = ("num_logit_bias_ptr", "bias_token_ids_ptr", "bias_token_ids_stride", "logit bias token ids")
STOP = ("num_stop_token_ids_ptr", "stop_token_ids_ptr", "stop_token_ids_stride", "stop token ids")


def rows(a: Mapping[str, Any]) -> int:
    """The rows a launch processes: the logits' rows (the call site's grid, ``logits.shape[0]``)."""
    return a["logits_ptr"].shape[0]


def _at(t: torch.Tensor, i: int) -> int:
    return int(t.reshape(-1)[i])


def state(a: Mapping[str, Any], r: int) -> int:
    return _at(a["expanded_idx_mapping_ptr"], r)


def listed(a: Mapping[str, Any], step: tuple[str, str, str, str], s: int) -> torch.Tensor:
    """Request state ``s``'s list of one step (int64 column ids, in table order)."""
    n = _at(a[step[0]], s)
    return a[step[1]][s, :n].to(I64) if n > 0 else torch.zeros(0, dtype=I64)


def min_tokens_active(a: Mapping[str, Any], r: int) -> bool:
    """Row ``r`` must not stop yet: its request lists stop tokens and ``pos + 1 < min_len``."""
    s = state(a, r)
    return _at(a["num_stop_token_ids_ptr"], s) > 0 and _at(a["pos_ptr"], r) + 1 < _at(a["min_lens_ptr"], s)


def restores(a: Mapping[str, Any], r: int) -> bool:
    """Row ``r`` checks, after masking its stop tokens, whether anything is left (and restores them if not)."""
    return bool(a["CHECK_ALL_MASKED_ROWS"]) and min_tokens_active(a, r) and _at(a["restore_when_all_masked_ptr"], state(a, r)) != 0


def survivors(a: Mapping[str, Any], r: int) -> torch.Tensor:
    """The columns of row ``r`` that step 1 leaves as they were (all of them without an allowed list)."""
    v = a["vocab_size"]
    ids = listed(a, ALLOWED, state(a, r))
    if not ids.numel():
        return torch.ones(v, dtype=torch.bool)
    keep = torch.zeros(v, dtype=torch.bool)
    keep[ids] = True
    return keep


def _table(k: str, a: Mapping[str, Any], name: str, stride_name: str) -> None:
    """A per-request table addressed as ``state * stride + column``: the call site passes its stride(0),
    so entry ``[s, j]`` is the tensor's."""
    t = a[name]
    if t.shape[0] > 1:
        require(a[stride_name] == t.stride(0), k, stride_name, f"must be {name}'s row stride {t.stride(0)}, got {a[stride_name]}")


def _list(k: str, a: Mapping[str, Any], step: tuple[str, str, str, str], r: int, s: int, *also: str,
          read: bool = True) -> torch.Tensor:
    """Row ``r``'s list of one step, bounded: a count in [0, width] that BLOCK_SIZE holds; where the
    row reads it (``read``), the state a row of the table (and of ``also``'s) and every id a column."""
    count, name, _, what = step
    n = _at(a[count], s)
    width = min([a[name].shape[1], *(a[x].shape[1] for x in also)])
    require(0 <= n <= width, k, count, f"entry {s} = {n} must be in [0, {width}] (the {what} table's width)")
    require(n <= a["BLOCK_SIZE"], k, "BLOCK_SIZE", f"must hold state {s}'s {n} {what}, got {a['BLOCK_SIZE']}")
    if n == 0 or not read:
        return torch.zeros(0, dtype=I64)
    for table in (name, *also):
        require(s < a[table].shape[0], k, "expanded_idx_mapping_ptr",
                f"entry {r} = {s} must index '{table}' of {a[table].shape[0]} request states")
    ids = a[name][s, :n].to(I64)
    bad = (ids < 0) | (ids >= a["vocab_size"])
    if bool(bad.any()):
        j = int(bad.nonzero()[0])
        raise ValueError(f"{k}: '{name}' state {s}'s {what} entry {j} = {int(ids[j])} must be a column in [0, {a['vocab_size']})")
    return ids


def _nan_at(k: str, a: Mapping[str, Any], r: int, where: torch.Tensor, why: str) -> None:
    row = a["logits_ptr"][r, : a["vocab_size"]]
    bad = torch.isnan(row) & where
    if bool(bad.any()):
        raise ValueError(f"{k}: 'logits_ptr' must hold no NaN {why} (C44; a NaN's bits, and a maximum over one, are the "
                         f"platform's); row {r}, column {int(bad.nonzero()[0])}")


def _preconditions(a: Mapping[str, Any]) -> None:
    k, n, v = K42, rows(a), a["vocab_size"]
    at_least(k, "vocab_size", v, 0)
    for name in ("BLOCK_SIZE", "LOGITS_BLOCK_SIZE"):
        power_of_two(k, name, a[name])
        require(a[name] <= 2**16, k, name, f"must be <= 65536 (a tile), got {a[name]}")
    in_int32(k, "vocab_size", v + a["LOGITS_BLOCK_SIZE"], "vocab_size + LOGITS_BLOCK_SIZE (column indices are int32)")
    logits, stride = a["logits_ptr"], a["logits_stride"]
    if n > 1:
        require(stride == logits.stride(0), k, "logits_stride", f"must be logits_ptr's row stride {logits.stride(0)}, got {stride}")
        at_least(k, "logits_stride", stride, v)
    require_rows(k, "logits_ptr", logits, n, stride, v)
    for name in ("expanded_idx_mapping_ptr", "pos_ptr"):
        require(a[name].numel() >= n, k, name, f"must hold an entry per row ({n}), has {a[name].numel()}")
    for _, name, stride_name, _ in (ALLOWED, BIAS, STOP):
        _table(k, a, name, stride_name)
    _table(k, a, "bias_ptr", "bias_stride")
    for r in range(n):
        s = state(a, r)
        for name in ("num_allowed_token_ids_ptr", "num_logit_bias_ptr", "min_lens_ptr", "num_stop_token_ids_ptr"):
            require(0 <= s < a[name].numel(), k, "expanded_idx_mapping_ptr",
                    f"entry {r} = {s} must index '{name}' of {a[name].numel()} request states")
        pos = _at(a["pos_ptr"], r)
        require(0 <= pos < 2**31 - 1, k, "pos_ptr", f"entry {r} = {pos} must be a position in [0, 2**31 - 1) (pos + 1 is int32)")
        _list(k, a, ALLOWED, r, s)
        keep = survivors(a, r)
        ids = _list(k, a, BIAS, r, s, "bias_ptr")
        if ids.numel():
            # vLLM's list is a dict's keys: two lanes adding to one column would race.
            if ids.unique().numel() != ids.numel():
                dup = next(int(i) for i in ids.tolist() if int((ids == i).sum()) > 1)
                raise ValueError(f"{k}: 'bias_token_ids_ptr' state {s} lists token {dup} twice (C44: distinct ids, a dict's keys)")
            bias = a["bias_ptr"][s, : ids.numel()]
            if not bool(torch.isfinite(bias).all()):
                j = int((~torch.isfinite(bias)).nonzero()[0])
                raise ValueError(f"{k}: 'bias_ptr' state {s}'s bias {j} = {float(bias[j])!r} must be finite (C44)")
            at = torch.zeros(v, dtype=torch.bool)
            at[ids] = True
            _nan_at(k, a, r, at & keep, "at a column it biases")
        # The stop list is read only while min tokens hold (its ids then index the row).
        stop = _list(k, a, STOP, r, s, read=min_tokens_active(a, r))
        if min_tokens_active(a, r):
            if a["CHECK_ALL_MASKED_ROWS"]:
                size = a["restore_when_all_masked_ptr"].numel()
                require(s < size, k, "expanded_idx_mapping_ptr",
                        f"entry {r} = {s} must index 'restore_when_all_masked_ptr' of {size} request states")
            if restores(a, r):
                scanned = keep.clone()
                scanned[stop] = False
                _nan_at(k, a, r, scanned, "in a row scanned for a live logit")


def _row_of(a: Mapping[str, Any], index: int) -> tuple[int, int]:
    return divmod(index, a["logits_stride"]) if a["logits_stride"] else (0, index)


def _steps(a: Mapping[str, Any], r: int, c: int) -> list[str]:
    s = state(a, r)
    out = []
    if listed(a, ALLOWED, s).numel():
        out.append("allowed" if bool(survivors(a, r)[c]) else "not allowed")
    bias = listed(a, BIAS, s)
    if bool((bias == c).any()):
        out.append(f"bias {float(a['bias_ptr'][s, int((bias == c).nonzero()[0])])!r}")
    if min_tokens_active(a, r) and bool((listed(a, STOP, s) == c).any()):
        out.append("a stop token under min tokens" + (" (the row is checked for a restore)" if restores(a, r) else ""))
    return out


def _explain(a: Mapping[str, Any], output: str, index: int) -> str:
    r, c = _row_of(a, index)
    if r >= rows(a) or c >= a["vocab_size"]:
        return f"flat index {index} lies outside the rows' {a['vocab_size']} columns: it must stay untouched"
    s = state(a, r)
    return (f"row {r} (state {s}, position {_at(a['pos_ptr'], r)}, min_len {_at(a['min_lens_ptr'], s)}), column {c}: "
            + (", ".join(_steps(a, r, c)) or "no step touches it"))


def _rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    r, c = _row_of(a, index)
    if r >= rows(a) or c >= a["vocab_size"]:
        return "C44 untouched columns"
    steps = _steps(a, r, c)
    if any(x.startswith("a stop") for x in steps):
        return "C44 min tokens" + (" restore" if restores(a, r) else "")
    if any(x.startswith("bias") for x in steps):
        return "C44 logit bias"
    return "C44 allowed token ids" if steps else "C44 untouched columns"


def _bytes(a: Mapping[str, Any]) -> int:
    n, v = rows(a), a["vocab_size"]
    moved = n * (a["expanded_idx_mapping_ptr"].element_size() + a["pos_ptr"].element_size() + 16)
    for r in range(n):
        s = state(a, r)
        if listed(a, ALLOWED, s).numel():
            moved += v * 4 + listed(a, ALLOWED, s).numel() * 12
        moved += listed(a, BIAS, s).numel() * 16
        if min_tokens_active(a, r):
            moved += listed(a, STOP, s).numel() * 8 + (v * 4 if restores(a, r) else 0)
    return moved


def _int_table(name: str, doc: str) -> Any:
    return ptr(name, INT, I32, doc, ndim=(2,), contiguous=False)


LOGIT_BIAS = KernelSpec(
    name=K42,
    family="logit_bias",
    qualname=f"{_MODULE}.{K42}",
    params=(
        ptr("logits_ptr", (F32,), F32, "[T, >= V] float32 logits (the sampler's copy), rows logits_stride apart; in place",
            role=Role.INOUT, ndim=(2,), contiguous=False),
        scalar("logits_stride", "row stride of logits (logits.stride(0))"),
        scalar("vocab_size", "V, the columns of a row"),
        ptr("expanded_idx_mapping_ptr", INT, I32, "[>= T] each row's request state"),
        ptr("num_allowed_token_ids_ptr", INT, I32, "[max_num_reqs] each request's allowed ids (0: all allowed)"),
        _int_table("allowed_token_ids_ptr", "[max_num_reqs, 1024] each request's allowed token ids"),
        scalar("allowed_token_ids_stride", "its row stride"),
        ptr("num_logit_bias_ptr", INT, I32, "[max_num_reqs] each request's biased ids"),
        _int_table("bias_token_ids_ptr", "[max_num_reqs, 1024] each request's biased token ids (a dict's keys: distinct)"),
        scalar("bias_token_ids_stride", "its row stride"),
        ptr("bias_ptr", (F32,), F32, "[max_num_reqs, 1024] each biased id's float32 bias", ndim=(2,), contiguous=False),
        scalar("bias_stride", "its row stride"),
        ptr("pos_ptr", INT, I64, "[>= T] each row's position in its sequence"),
        ptr("min_lens_ptr", INT, I32, "[max_num_reqs] each request's prompt length + min_tokens"),
        ptr("num_stop_token_ids_ptr", INT, I32, "[max_num_reqs] each request's stop ids (0 without min_tokens)"),
        ptr("restore_when_all_masked_ptr", INT, I32, "[max_num_reqs] nonzero: restore a row its stop mask leaves all -inf"),
        _int_table("stop_token_ids_ptr", "[max_num_reqs, 128] each request's stop token ids"),
        scalar("stop_token_ids_stride", "its row stride"),
        constexpr("BLOCK_SIZE", "a list's tile: a power of two >= every count (1024 at the call site)"),
        constexpr("LOGITS_BLOCK_SIZE", "a row's tile (8192 at the call site)"),
        constexpr("CHECK_ALL_MASKED_ROWS", "any request of the batch restores (the call site's enable_stop_token_restore)"),
    ),
    grid=lambda a: (rows(a),),
    preconditions=_preconditions,
    explain=_explain,
    rule=_rule,
    bytes_moved=_bytes,
)

_RESTORE = ("restore_when_all_masked_ptr", "CHECK_ALL_MASKED_ROWS")


def _without_restore(a: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in a.items() if k not in _RESTORE}


def _restore_predates(a: Mapping[str, Any]) -> str | None:
    if any(restores(a, r) for r in range(rows(a))):
        return "C44 all-masked restore (0.30.0)"
    return None


# Through 0.21.0 min tokens masked the stop tokens with no restore (no structured-output rows then).
LOGIT_BIAS.earlier = (Earlier("0.21.0", tuple(n for n in LOGIT_BIAS.arg_names if n not in _RESTORE),
                              "no all-masked restore (restore_when_all_masked, CHECK_ALL_MASKED_ROWS)", _without_restore,
                              _restore_predates),)

SPECS = (LOGIT_BIAS,)
