"""Malformed launches: every backend that validates must refuse them cleanly (docs/spec.md §1.12).

A malformed case is a valid Hypothesis case of the kernel with one malformation applied, chosen
by Hypothesis from what the kernel's contract says about its parameters (:data:`KINDS`): a
dtype the parameter does not accept, a rank it does not have, ``None`` or a non-tensor where a
tensor is required, a tensor on another device, a non-contiguous tensor, a short buffer, a
cumulative count that decreases, a negative or huge scalar, a value outside its range (ids
outside the vocabulary, offsets outside buffers), a flag that disagrees with its tensor, a
scalar of the wrong type.

The contract judges each one (:meth:`KernelSpec.check`). When it rejects the launch, every
validating backend (``Backend.validates``: the oracle and the C++ port) must raise ``TypeError``
or ``ValueError`` whose message names a parameter of the kernel, must not crash, and must leave
every byte of every argument as it was — inputs, outputs, the gaps of strided tensors and guard
regions allocated around each tensor (a write outside a buffer lands there). When the contract
accepts it (a truncated buffer that had spare room), the case is valid and the backends must
agree on it, as in conformance. Under AddressSanitizer the guards are dropped, so every tensor
is its own allocation and ASan sees any out-of-bounds read or write.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import re
import resource
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hypothesis import Phase
from hypothesis import strategies as st

import contracts
from conformance.arguments import kernel_name, output_file
from conformance.backends import BACKENDS, ORACLE
from conformance.case import Case
from conformance.casefile import FAILURES_DIR, save_in_flight
from conformance.profiles import PROFILES, chosen
from conformance.runner import Disagreement, copy_args, run_case
from contracts.spec import KernelSpec, Kind, Role, Table

# Malformed launches per profile, over all kernels (each launched on every validating backend).
BUDGET = {"dev": 1000, "ci": 5000, "nightly": 50000}
GUARD = 16  # 8-byte words of guard before and after every tensor
ALL_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
              torch.float32, torch.float64, torch.complex64)


@dataclass
class Malformed:
    case: Case
    kind: str
    param: str
    detail: str


# -- the malformations --------------------------------------------------------------------------
# Each takes (draw, spec, args) and changes ``args`` in place (new tensors, never the case's own),
# returning (kind, parameter, detail), or None when it does not apply to this case.
Apply = Callable[[st.DrawFn, KernelSpec, dict[str, Any]], "tuple[str, str, str] | None"]


def _tensors(spec: KernelSpec, a: dict[str, Any], role: Role | None = None) -> list[str]:
    return [p.name for p in spec.params if p.kind is Kind.PTR and isinstance(a[p.name], torch.Tensor)
            and (role is None or p.role is role)]


def _ints(spec: KernelSpec, a: dict[str, Any]) -> list[str]:
    return [n for n in _tensors(spec, a, Role.IN) if not a[n].dtype.is_floating_point and a[n].dtype != torch.bool and a[n].numel()]


def _scalars(spec: KernelSpec, a: dict[str, Any]) -> list[str]:
    """Integer scalars and integer constexprs (not the boolean flags)."""
    return [p.name for p in spec.params if p.kind is not Kind.PTR and not isinstance(a[p.name], bool)]


def wrong_dtype(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    names = _tensors(spec, a)
    if not names:
        return None
    n = draw(st.sampled_from(names))
    dtype = draw(st.sampled_from([d for d in ALL_DTYPES if d not in spec.param(n).dtypes]))
    a[n] = a[n].to(dtype)
    return "wrong dtype", n, str(dtype)


def wrong_rank(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    names = _tensors(spec, a)
    if not names:
        return None
    n = draw(st.sampled_from(names))
    t = a[n]
    rank = draw(st.sampled_from([r for r in (0, 1, 2, 3) if r not in spec.param(n).ndim]))
    if rank == 0:
        a[n] = t.reshape(-1)[0].clone() if t.numel() else torch.zeros((), dtype=t.dtype)
    else:
        a[n] = t.reshape(*([1] * (rank - 1)), -1).clone() if rank > 1 else t.reshape(-1).clone()
    return "wrong rank", n, f"{t.dim()}-d -> {rank}-d"


def none_for_tensor(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    names = [p.name for p in spec.params if p.kind is Kind.PTR and not p.optional]
    if not names:
        return None
    n = draw(st.sampled_from(names))
    a[n] = None
    return "None for a required tensor", n, "None"


def bad_table(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    """A pointer table (Param.table) as vLLM's raw addresses, short a group, or with one tensor of
    another dtype."""
    names = [p.name for p in spec.params if p.table and isinstance(a[p.name], Table)]
    if not names:
        return None
    n = draw(st.sampled_from(names))
    how = draw(st.sampled_from(["addresses", "short", "dtype"]))
    if how == "short" and len(a[n]):
        a[n] = Table(a[n][:-1])
    elif how == "dtype" and len(a[n]):
        g = draw(st.integers(0, len(a[n]) - 1))
        a[n] = Table(t.to(torch.int64) if i == g else t for i, t in enumerate(a[n]))
    else:
        a[n] = a[n].addresses("cpu")
        how = "addresses"
    return "bad pointer table", n, how


def not_a_tensor(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    names = _tensors(spec, a)
    if not names:
        return None
    n = draw(st.sampled_from(names))
    how = draw(st.sampled_from(["list", "int", "numpy"]))
    # NumPy has no bfloat16: such a tensor goes to NumPy as float32.
    numpy = a[n].numpy() if a[n].dtype != torch.bfloat16 else a[n].float().numpy()
    a[n] = a[n].tolist() if how == "list" else numpy if how == "numpy" else 1
    return "not a tensor", n, how


def wrong_device(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    names = _tensors(spec, a)
    if not names:
        return None
    n = draw(st.sampled_from(names))
    a[n] = a[n].to("meta")
    return "wrong device", n, "meta"


def non_contiguous(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    names = [n for n in _tensors(spec, a) if a[n].numel() >= 2 and a[n].dim() >= 1 and a[n].shape[-1] >= 1]
    if not names:
        return None
    n = draw(st.sampled_from(names))
    t = a[n]
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] * 2, dtype=t.dtype)
    view = wide[..., ::2]  # inner stride 2: neither contiguous nor unit-inner-stride
    view.copy_(t)
    a[n] = view
    return "non-contiguous", n, f"strides {view.stride()}"


def short_buffer(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    names = [n for n in _tensors(spec, a) if a[n].dim() >= 1 and a[n].shape[0] >= 1]
    if not names:
        return None
    n = draw(st.sampled_from(names))
    t = a[n]
    keep = draw(st.integers(0, t.shape[0] - 1))
    a[n] = t[:keep].clone()
    return "short buffer", n, f"{t.shape[0]} -> {keep} rows"


def decreasing_counts(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    names = [n for n in _ints(spec, a) if a[n].dim() == 1 and a[n].numel() >= 1 and bool((a[n][1:] >= a[n][:-1]).all())]
    if not names:
        return None
    n = draw(st.sampled_from(names))
    t = a[n].clone()
    i = draw(st.integers(0, t.numel() - 1))
    t[i] = (t[i - 1] if i else 0) - draw(st.integers(1, 3))  # below its predecessor (or below 0)
    a[n] = t
    return "decreasing cumulative counts", n, f"entry {i} -> {int(t[i])}"


def negative_scalar(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    names = _scalars(spec, a)
    if not names:
        return None
    n = draw(st.sampled_from(names))
    a[n] = draw(st.sampled_from([-1, -2, -(2**31), -(2**63)]))
    return "negative length", n, str(a[n])


def huge_scalar(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    names = _scalars(spec, a)
    if not names:
        return None
    n = draw(st.sampled_from(names))
    a[n] = draw(st.sampled_from([2**31, 2**32 + 1, 2**62, 2**63 - 1, 2**63, 2**80]))
    return "huge scalar", n, str(a[n])


def _set_value(draw: st.DrawFn, a: dict[str, Any], n: str, choices: list[int]) -> tuple[int, int] | None:
    t = a[n].clone()
    if not t.is_contiguous():
        return None
    flat = t.view(-1)
    limit = torch.iinfo(t.dtype).max
    choices = [v for v in choices if -limit <= v <= limit]
    i = draw(st.integers(0, flat.numel() - 1))
    value = draw(st.sampled_from(choices))
    flat[i] = value
    a[n] = t
    return i, value


def out_of_range(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    """An integer input element far outside anything it may hold: offsets past buffers, -2, 2**31 - 1."""
    names = _ints(spec, a)
    if not names:
        return None
    n = draw(st.sampled_from(names))
    total = sum(x.numel() for x in a.values() if isinstance(x, torch.Tensor))
    done = _set_value(draw, a, n, [2 * total + 7, total, 2**31 - 1, 2**62, -2, -(2**31)])
    return None if done is None else ("value out of range", n, f"[{done[0]}] = {done[1]}")


def ids_outside_vocab(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    """A token id >= vocab_size in a ``*token_ids*`` input of a kernel with a ``vocab_size``."""
    vocab = a.get("vocab_size")
    names = [n for n in _ints(spec, a) if "token_ids" in n]
    if not isinstance(vocab, int) or isinstance(vocab, bool) or not names:
        return None
    n = draw(st.sampled_from(names))
    done = _set_value(draw, a, n, [vocab, vocab + 1, 2 * vocab + 3, 2**31 - 1])
    return None if done is None else ("ids outside the vocabulary", n, f"[{done[0]}] = {done[1]} (vocab_size {vocab})")


def flag_mismatch(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    if not spec.flags:
        return None
    f = draw(st.sampled_from(spec.flags))
    if spec.param(f.tensor).unread_unless == f.constexpr:
        # Off, the flag leaves its tensor unread (whatever is passed binds as None): only "on,
        # without a tensor" disagrees.
        a[f.constexpr], a[f.tensor] = True, None
    else:
        a[f.constexpr] = not bool(a[f.constexpr])
    return "flag disagrees with its tensor", f.constexpr, f"{f.constexpr}={a[f.constexpr]}"


def wrong_scalar_type(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    names = [p.name for p in spec.params if p.kind is not Kind.PTR]
    if not names:
        return None
    n = draw(st.sampled_from(names))
    real = bool(spec.param(n).dtypes)  # a float scalar: a float is its type, any value (inf, NaN) its value
    how = draw(st.sampled_from(["tensor", "str", "None"] if real else ["float", "tensor", "str", "None"]))
    v = a[n]
    a[n] = {"float": float(v) + 0.5, "tensor": torch.tensor(v), "str": str(v), "None": None}[how]
    return "wrong scalar type", n, how


def aliased_output(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    """A written tensor laid over another tensor argument's memory (C31): the same object where the
    types allow, else a view at a drawn byte offset inside the other's bytes."""
    pairs = [(o, i) for o in _tensors(spec, a) if spec.param(o).is_output and a[o].numel()
             for i in _tensors(spec, a) if i != o and a[i].numel()]
    if not pairs:
        return None
    o, i = draw(st.sampled_from(pairs))
    out, inp = a[o], a[i]
    same = inp.dtype == out.dtype and inp.shape == out.shape and inp.is_contiguous() and out.is_contiguous()
    if same and draw(st.booleans()):
        a[o] = inp
        return "aliased output", o, f"the same tensor as '{i}'"
    # One storage holding the input's bytes with the output's elements laid over some of them.
    item = max(out.element_size(), inp.element_size())
    in_bytes = inp.numel() * inp.element_size()
    shift = draw(st.integers(0, max(0, in_bytes // item - 1))) * item
    storage = torch.zeros(shift + max(in_bytes - shift, out.numel() * out.element_size()) + in_bytes + 8, dtype=torch.uint8)
    view_in = storage[: in_bytes].view(inp.dtype).view(inp.shape) if inp.is_contiguous() else None
    if view_in is None:
        return None
    view_in.copy_(inp)
    view_out = storage[shift: shift + out.numel() * out.element_size()].view(out.dtype).view(out.shape)
    view_out.copy_(out)
    a[i], a[o] = view_in, view_out
    return "aliased output", o, f"over '{i}' at byte {shift}"


def lazy_view(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    """A tensor with the same values behind a negative view: memory holds their negations."""
    names = [n for n in _tensors(spec, a) if a[n].dtype != torch.bool and a[n].numel()]
    if not names:
        return None
    n = draw(st.sampled_from(names))
    a[n] = torch._neg_view(-a[n])
    return "negative view", n, "is_neg()"


def sparse_layout(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    names = [n for n in _tensors(spec, a) if a[n].dim() >= 1 and a[n].dtype not in (torch.bfloat16, torch.float16)]
    if not names:
        return None
    n = draw(st.sampled_from(names))
    a[n] = a[n].to_sparse()
    return "sparse layout", n, "sparse_coo"


def null_data(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    """A fake tensor: it reports the CPU, its shape and dtype, and a null data pointer."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    names = [n for n in _tensors(spec, a) if a[n].numel()]
    if not names:
        return None
    n = draw(st.sampled_from(names))
    with FakeTensorMode():
        a[n] = torch.empty_strided(a[n].shape, a[n].stride(), dtype=a[n].dtype)
    return "null data pointer", n, "FakeTensor"


def output_requires_grad(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    names = [n for n in _tensors(spec, a) if spec.param(n).is_output and a[n].dtype.is_floating_point]
    if not names:
        return None
    n = draw(st.sampled_from(names))
    a[n] = a[n].detach().clone().requires_grad_()
    return "output requires grad", n, "requires_grad"


def overflowing_product(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    """Two scalars, each plausible alone, whose product (or sum) passes int32 or int64."""
    names = _scalars(spec, a)
    if len(names) < 2:
        return None
    m, n = draw(st.lists(st.sampled_from(names), min_size=2, max_size=2, unique=True))
    for k in (m, n):
        a[k] = draw(st.sampled_from([2**16 + 1, 2**31 - 1, 2**31 + 1, 2**32 + 1, 3037000500, 2**62 - 1]))
    return "overflowing product", f"{m}', '{n}", f"{a[m]} x {a[n]}"


def huge_count(draw: st.DrawFn, spec: KernelSpec, a: dict[str, Any]) -> tuple[str, str, str] | None:
    """The last element of an integer input (a cumulative total, a count, a length) at its dtype's
    largest values: a loop over it would never end."""
    names = [n for n in _ints(spec, a) if a[n].is_contiguous()]
    if not names:
        return None
    n = draw(st.sampled_from(names))
    t = a[n].clone()
    top = torch.iinfo(t.dtype).max
    t.view(-1)[-1] = draw(st.sampled_from([top, top - 1, top // 2, 2**31 - 1]))
    a[n] = t
    return "huge count", n, f"[-1] = {int(t.view(-1)[-1])}"


# Kinds that apply to some kernels' cases only come first: a kind that comes up short leaves its
# share to the kinds after it, and the last ones apply to every case.
KINDS: dict[str, Apply] = {
    "aliased output": aliased_output,
    "negative view": lazy_view,
    "null data pointer": null_data,
    "output requires grad": output_requires_grad,
    "overflowing product": overflowing_product,
    "huge count": huge_count,
    "ids outside the vocabulary": ids_outside_vocab,
    "flag disagrees with its tensor": flag_mismatch,
    "negative length": negative_scalar,
    "huge scalar": huge_scalar,
    "wrong scalar type": wrong_scalar_type,
    "decreasing cumulative counts": decreasing_counts,
    "value out of range": out_of_range,
    "non-contiguous": non_contiguous,
    "sparse layout": sparse_layout,
    "short buffer": short_buffer,
    "wrong dtype": wrong_dtype,
    "wrong rank": wrong_rank,
    "None for a required tensor": none_for_tensor,
    "not a tensor": not_a_tensor,
    "wrong device": wrong_device,
    "bad pointer table": bad_table,
}
# Kinds that cannot apply to a kernel, judged from its contract alone.
APPLIES: dict[str, Callable[[KernelSpec], bool]] = {
    "flag disagrees with its tensor": lambda spec: bool(spec.flags),
    "ids outside the vocabulary": lambda spec: "vocab_size" in spec.arg_names and any("token_ids" in n for n in spec.arg_names),
    "negative length": lambda spec: any(p.kind is not Kind.PTR for p in spec.params),
    "huge scalar": lambda spec: any(p.kind is not Kind.PTR for p in spec.params),
    "wrong scalar type": lambda spec: any(p.kind is not Kind.PTR for p in spec.params),
    "overflowing product": lambda spec: sum(p.kind is not Kind.PTR for p in spec.params) >= 2,
    "output requires grad": lambda spec: any(p.is_output and any(d.is_floating_point for d in p.dtypes) for p in spec.params),
    "bad pointer table": lambda spec: any(p.table for p in spec.params),
}

# Known gaps, as data: (kernel, kind, parameter) -> the finding. The fuzz does not generate these
# malformations (a generated one is redrawn) and every run prints them, until the owner fixes the
# backend and deletes the entry. Empty: the six entries that hid overflows, a null-pointer offset
# and a quadratic check were fixed (C32), not listed.
QUARANTINE: dict[tuple[str, str, str], str] = {}

# Kinds every CI run must have produced at least once, over all kernels: the malformed launches,
# then the hostile-input classes (docs/checks.md, "Bad input").
REQUIRED_KINDS = ("wrong dtype", "wrong rank", "short buffer", "decreasing cumulative counts", "negative length",
                  "None for a required tensor", "ids outside the vocabulary", "aliased output", "negative view",
                  "sparse layout", "null data pointer", "output requires grad", "overflowing product", "huge count")


# Valid cases each malformation starts from, drawn once per kernel. Drawing a case can cost far more
# than launching it (the split top-p cases run the oracle's earlier rounds to fill their workspace,
# about 0.15 s), and most draws of a kind end in contract and are thrown away: the malformation is
# what the fuzz varies, over a pool of a quarter as many valid cases as the kernel's quota, 16 to 256.
_pools: dict[tuple[str, int], list[Case]] = {}


def pool_size(quota: int) -> int:
    return min(256, max(16, quota // 4))


def base_cases(kernel: str, n: int) -> list[Case]:
    """``n`` valid cases of ``kernel`` for the malformations to start from (derandomized, drawn once)."""
    from hypothesis import HealthCheck, given, settings

    from conformance.strategies import cases

    if (kernel, n) not in _pools:
        pool: list[Case] = []

        @settings(max_examples=n, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.generate])
        @given(case=cases(kernel))
        def collect(case: Case) -> None:
            pool.append(case)

        collect()
        _pools[kernel, n] = pool
    return _pools[kernel, n]


@st.composite
def malformed_cases(draw: st.DrawFn, kernel: str, kind: str, pool: int = 16) -> Malformed:
    """A valid case of ``kernel`` (one of ``pool``, :func:`base_cases`) with one malformation of ``kind`` (see
    :data:`KINDS`); a case the kind does not apply to, or a quarantined (kernel, kind, parameter), is
    rejected (``assume``)."""
    from hypothesis import assume

    case = draw(st.sampled_from(base_cases(kernel, pool)))
    args = copy_args(case.args, "cpu")  # fresh tensors: the malformation never touches the case's own
    applied = KINDS[kind](draw, case.spec, args)
    assume(applied is not None and (kernel, applied[0], applied[1]) not in QUARANTINE)
    kind, param, detail = applied
    return Malformed(Case(kernel, args, None, case.positional, f"{kind}: {param} {detail}"), kind, param, detail)


# -- guarded launches ---------------------------------------------------------------------------
def asan_active() -> bool:
    try:
        ctypes.CDLL(None)["__asan_init"]
    except (AttributeError, OSError):
        return False
    return True


@dataclass
class Guarded:
    """Every tensor argument as a view into a larger buffer of random bytes; ``snapshot`` is
    the whole buffer before the launch. Arguments that share memory share one buffer."""

    args: dict[str, Any]
    buffers: list[tuple[str, torch.Tensor, torch.Tensor, int, int]] = field(default_factory=list)  # name, bytes, snapshot, lo, hi


def _unguardable(v: torch.Tensor) -> bool:
    """A tensor without plain memory to copy (sparse, fake): launched as it is."""
    from torch._subclasses.fake_tensor import FakeTensor

    return v.layout is not torch.strided or isinstance(v, FakeTensor)


def guarded(args: dict[str, Any], guard: int, seed: int = 0) -> Guarded:
    """Copies of ``args`` whose memory lies inside guard regions of ``guard`` * 8 random bytes:
    one buffer per storage, so aliasing and strides are kept, and so are negative views."""
    g = torch.Generator().manual_seed(seed)
    out = Guarded({})
    pad = guard * 8
    by_storage: dict[int, list[tuple[str, torch.Tensor]]] = {}
    # A pointer table's tensors are guarded one by one, as 'name[g]'.
    every = [(f"{k}[{g}]", t) for k, v in args.items() if isinstance(v, Table) for g, t in enumerate(v)]
    every += [(k, v) for k, v in args.items() if not isinstance(v, Table)]
    for name, v in every:
        if not isinstance(v, torch.Tensor) or v.device.type != "cpu" or _unguardable(v):
            out.args[name] = v
            continue
        # An empty tensor may have a null data pointer: keyed by itself, it shares with nothing.
        by_storage.setdefault(v.untyped_storage().data_ptr() or id(v), []).append((name, v))
    for views in by_storage.values():
        storage = views[0][1].untyped_storage()
        raw = torch.empty(0, dtype=torch.uint8).set_(storage)  # the storage's bytes, as stored
        end = max((v.storage_offset() + 1 + sum((n - 1) * st_ for n, st_ in zip(v.shape, v.stride()))) * v.element_size()
                  if v.numel() else 0 for _, v in views)
        # Rounded up to the widest element, so it views as each dtype; no slack otherwise, so that under
        # ASan (no guards) one byte past the tensor is past the allocation.
        align = max(v.element_size() for _, v in views)
        base = torch.randint(0, 256, (pad + -(-end // align) * align + pad,), dtype=torch.uint8, generator=g)
        base[pad: pad + end] = raw[:end]
        made: dict[int, torch.Tensor] = {}
        for name, v in views:
            if id(v) not in made:
                view = base.view(v.dtype).as_strided(v.shape, v.stride(), pad // v.element_size() + v.storage_offset())
                made[id(v)] = (torch._neg_view(view) if v.is_neg() else view).requires_grad_(v.requires_grad)
            out.args[name] = made[id(v)]
        out.buffers.append((" / ".join(n for n, _ in views), base, base.clone(), pad, pad + end))
    for k, v in args.items():
        if isinstance(v, Table):
            out.args[k] = Table(out.args.pop(f"{k}[{g}]") for g in range(len(v)))
    return out


def untouched(gd: Guarded) -> str | None:
    """None when every byte of every buffer is as before; else what changed, where."""
    for name, base, snapshot, lo, hi in gd.buffers:
        changed = (base != snapshot).nonzero()
        if changed.numel():
            i = int(changed[0])
            where = "the guard before it" if i < lo else "the guard after it" if i >= hi else "its own bytes (or the gaps between its rows)"
            return f"'{name}' changed at byte {i - lo} of the buffer ({where})"
    return None


def guards_intact(gd: Guarded) -> str | None:
    for name, base, snapshot, lo, hi in gd.buffers:
        for part, (a, b) in (("before", (0, lo)), ("after", (hi, base.numel()))):
            if b > a and bool((base[a:b] != snapshot[a:b]).any()):
                return f"wrote the guard {part} '{name}' (an out-of-bounds write)"
    return None


# -- the check of one malformed case --------------------------------------------------------------
class BadInputFailure(AssertionError):
    pass


def validating_backends(spec: KernelSpec) -> list[str]:
    return [b for b, be in BACKENDS.items() if be.validates and be.unavailable() is None and be.resolve(spec) is not None
            and be.device() == "cpu"]


_NAMED = re.compile(r"'([A-Za-z_][A-Za-z0-9_]*)(?:\[\d+\])?'")  # a pointer table's tensor: 'name[g]'


def launch_grid(spec: KernelSpec, case: Case, args: dict[str, Any]) -> tuple[int, ...]:
    """The grid a malformed launch runs under: the case's, for a kernel that reads its grid (the
    canonical one where the arguments give it), else (1,): every other port ignores the grid."""
    if spec.check_grid is None:
        return (1,)
    if case.grid is not None:
        return case.grid
    try:
        return tuple(spec.grid(args))
    except Exception:  # malformed beyond a grid: the contract refuses it by its arguments
        return (1,)


def verdict(spec: KernelSpec, args: dict[str, Any], grid: tuple[int, ...] = (1,)) -> BaseException | None:
    """The contract's judgement: None when the launch is in contract, else the exception."""
    try:
        spec.check(args, grid=grid)
    except (TypeError, ValueError) as e:
        return e
    except Exception as e:  # the contract's own check failed on malformed input: a harness bug
        raise BadInputFailure(f"{spec.name}: the contract's check raised {type(e).__name__} instead of TypeError/ValueError: {e}") from e
    return None


def launch(backend: str, spec: KernelSpec, case: Case, args: dict[str, Any]) -> None:
    b = BACKENDS[backend]
    kernel = b.launcher(b.resolve(spec), launch_grid(spec, case, args))
    if case.positional:
        kernel(*[args[n] for n in spec.arg_names])
    else:
        kernel(**args)


def check_malformed(m: Malformed, backends: list[str], guard: int, inflight: Path | None = None) -> bool:
    """Checks one malformed case; returns True when the contract rejected it (a malformed launch),
    False when it turned out valid (then the backends must agree). Raises BadInputFailure."""
    spec = m.case.spec
    rejected = verdict(spec, m.case.args, launch_grid(spec, m.case, m.case.args))
    if rejected is None:
        try:
            run_case(m.case, [ORACLE, *[b for b in backends if b != ORACLE]])
        except Disagreement as d:
            raise BadInputFailure(f"{spec.name}: after '{m.case.note}' (still in contract) backends disagree:\n{d}") from None
        gd = guarded(m.case.args, guard)
        for b in backends:
            if b == ORACLE:
                continue
            launch(b, spec, m.case, gd.args)
            bad = guards_intact(gd)
            if bad:
                raise BadInputFailure(f"{spec.name} on {b}: {bad}, on a valid case after '{m.case.note}'")
        return False
    for b in backends:
        gd = guarded(m.case.args, guard, seed=len(b))
        if inflight is not None and b != ORACLE:
            save_in_flight(m.case, inflight)  # a crash leaves the case that caused it behind
        try:
            launch(b, spec, m.case, gd.args)
        except (TypeError, ValueError) as e:
            named = set(_NAMED.findall(str(e))) & {*spec.arg_names, *["grid"] * (spec.check_grid is not None)}
            if not named:
                raise BadInputFailure(f"{spec.name} on {b}: {type(e).__name__} does not name a parameter: {e}\n  malformation: {m.case.note}"
                                      f"\n  the contract says: {rejected}") from None
        except Exception as e:
            raise BadInputFailure(f"{spec.name} on {b}: raised {type(e).__name__} (not TypeError/ValueError): {e}\n  malformation: {m.case.note}"
                                  f"\n  the contract says: {rejected}") from None
        else:
            raise BadInputFailure(f"{spec.name} on {b}: accepted a malformed launch ({m.case.note}); the contract says: {rejected}")
        bad = untouched(gd)
        if bad:
            raise BadInputFailure(f"{spec.name} on {b}: rejected '{m.case.note}' but {bad}: a backend must refuse before touching memory")
    return True


MEMORY_LIMIT = 8 << 30  # more bytes of address space while fuzzing (not under ASan, which maps terabytes of shadow)
EXAMPLE_SECONDS = 20  # one malformed example's wall-clock budget (Python-level hangs)


class Hung(AssertionError):
    pass


@contextlib.contextmanager
def bounded() -> Iterator[None]:
    """Malformed scalars can make a careless check allocate or loop for ever (``torch.arange(2**62)``):
    cap the address space so that becomes a MemoryError/RuntimeError here, not the OOM killer
    taking this machine's other processes, and arm an alarm per example (see :func:`_alarm`)."""
    limited = not asan_active() and hasattr(resource, "RLIMIT_AS")
    if limited:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = _address_space() + MEMORY_LIMIT  # on top of what the process has mapped already
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        if soft != resource.RLIM_INFINITY:
            cap = min(cap, soft)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        if limited:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _address_space() -> int:
    """Bytes of address space this process has mapped (0 where /proc is missing)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _alarm(signum: int, frame: Any) -> None:
    raise Hung(f"one malformed launch ran for more than {EXAMPLE_SECONDS} s")


def check_kernel(kernel: str, quota: int, guard: int | None = None, save_dir: Path | None = None) -> dict[str, Any]:
    """About ``quota`` malformed launches of ``kernel`` through every validating backend, shared
    evenly among the kinds of malformation (each kind its own Hypothesis run)."""
    from hypothesis import HealthCheck, assume, given, settings
    from hypothesis.errors import Unsatisfiable

    spec = contracts.get(kernel)
    backends = validating_backends(spec)
    guard = (0 if asan_active() else GUARD) if guard is None else guard
    tally: Counter[str] = Counter()
    inflight = (save_dir or FAILURES_DIR) / f"{kernel}.fuzz-inflight.safetensors"
    failures: list[str] = []
    started = time.perf_counter()
    kinds_here = [k for k in KINDS if APPLIES.get(k, lambda s: True)(spec)]
    for done, kind in enumerate(kinds_here):
        # Even shares; a kind that comes up short (cases it leaves in contract) leaves its share to the rest.
        per_kind = math.ceil(max(0, quota - tally["malformed"]) / (len(kinds_here) - done))
        if per_kind == 0:
            break

        @settings(max_examples=per_kind, suppress_health_check=list(HealthCheck))
        @given(m=malformed_cases(kernel, kind, pool_size(quota)))
        def prop(m: Malformed) -> None:
            signal.alarm(EXAMPLE_SECONDS)
            try:
                rejected = check_malformed(m, backends, guard, inflight)
            except (BadInputFailure, Hung):
                save_in_flight(m.case, (save_dir or FAILURES_DIR) / f"{kernel}.fuzz.safetensors")
                raise
            finally:
                signal.alarm(0)
            tally["malformed" if rejected else "in contract"] += 1
            if rejected:
                tally[f"kind: {m.kind}"] += 1
            assume(rejected)  # only malformed launches count toward the quota

        try:
            with bounded():
                prop()
        except Unsatisfiable:
            pass  # this kind never makes this kernel's cases malformed (no flags, no token ids...)
        except Exception as e:  # BadInputFailure, Hung, or several of them
            failures.append(_message(e))
    if inflight.exists():
        inflight.unlink()
    kinds = {k.removeprefix("kind: "): n for k, n in sorted(tally.items()) if k.startswith("kind: ")}
    return {
        "status": "fail" if failures else "pass",
        "backends": backends,
        "malformed": tally["malformed"],
        "launches": tally["malformed"] * len(backends),
        "in_contract": tally["in contract"],
        "kinds": kinds,
        "guard": guard,
        "seconds": round(time.perf_counter() - started, 2),
        "message": "\n".join(failures) if failures else None,
    }


def _message(e: BaseException) -> str:
    group = getattr(e, "exceptions", None)  # Hypothesis reports several distinct failures as a group
    if isinstance(group, tuple):
        return "\n".join(_message(x) for x in group)
    return f"{type(e).__name__}: {e}"


def quota_per_kernel(profile: str, n_kernels: int) -> int:
    return math.ceil(BUDGET.get(profile, BUDGET["dev"]) / max(1, n_kernels))


def replay(path: str) -> int:
    from conformance.casefile import load_case

    case = load_case(path)
    spec = case.spec
    m = Malformed(case, "replay", "", case.note)
    try:
        rejected = check_malformed(m, validating_backends(spec), 0 if asan_active() else GUARD)
    except BadInputFailure as e:
        print(e)
        return 1
    print(f"{case.kernel}: '{case.note}' {'refused cleanly by every validating backend' if rejected else 'is in contract; backends agree'}")
    return 0


# -- command line ----------------------------------------------------------------------------------
def add_parser(sub: Any) -> None:
    p = sub.add_parser("fuzz", help="malformed launches through every validating backend: clean TypeError/ValueError, no writes")
    p.add_argument("--profile", default=chosen(), choices=PROFILES)
    p.add_argument("--kernel", action="append", type=kernel_name, help="only this kernel (repeatable)")
    p.add_argument("--launches", type=int, help="malformed launches in all (default: dev 1,000, ci 5,000, nightly 50,000)")
    p.add_argument("--report", default="reports/fuzz.json", type=output_file)
    p.add_argument("--junit", type=output_file, help="write a JUnit XML report here")
    p.add_argument("--replay", help="re-check one saved malformed case")
    p.set_defaults(func=cmd)


def cmd(ns: argparse.Namespace) -> int:
    if ns.replay:
        return replay(ns.replay)
    from hypothesis import settings

    settings.load_profile(ns.profile)
    names = ns.kernel or list(contracts.SPECS)
    total = ns.launches or BUDGET[ns.profile]
    quota = math.ceil(total / len(names))
    print(f"specdiff fuzz: profile {ns.profile}, {quota} malformed cases per kernel ({quota * len(names)} in all), "
          f"guards {'off (AddressSanitizer watches every allocation)' if asan_active() else f'of {GUARD} elements'}", flush=True)
    for (kernel, kind, param), why in QUARANTINE.items():
        if kernel in names:
            print(f"  QUARANTINED {kernel}: {kind} of '{param}' is not generated: {why}", flush=True)
    results = {}
    for name in names:
        e = check_kernel(name, quota)
        results[name] = e
        print(f"  {name}: {e['status']} {e['malformed']} malformed x {len(e['backends'])} backends ({', '.join(e['backends'])}), "
              f"{e['in_contract']} still in contract, {e['seconds']} s", flush=True)
        if e["message"]:
            print("\n" + e["message"] + "\n", flush=True)
    kinds: Counter[str] = Counter()
    for e in results.values():
        kinds.update(e["kinds"])
    malformed = sum(e["malformed"] for e in results.values())
    launches = sum(e["launches"] for e in results.values())
    print(f"\nmalformed cases {malformed}, launches {launches}; by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    missing = [k for k in REQUIRED_KINDS if not kinds[k]] if not ns.kernel else []
    path = Path(ns.report)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": 1, "profile": ns.profile, "malformed": malformed, "launches": launches, "kinds": dict(kinds),
                                "missing_kinds": missing, "kernels": results,
                                "quarantine": [{"kernel": k, "kind": kd, "param": p, "why": w} for (k, kd, p), w in QUARANTINE.items()]},
                               indent=2) + "\n")
    if ns.junit:
        from conformance import junit

        junit.write(ns.junit, "fuzz", [junit.TestCase("fuzz", k, e["seconds"], failure=e["message"]) for k, e in results.items()]
                    + [junit.TestCase("fuzz", "kinds", failure=f"never produced: {', '.join(missing)}" if missing else None)])
    bad = [k for k, e in results.items() if e["status"] != "pass"]
    if missing:
        bad.append(f"kinds never produced: {', '.join(missing)}")
    if not ns.kernel and not ns.launches and malformed < BUDGET[ns.profile]:
        bad.append(f"only {malformed} malformed cases, the {ns.profile} profile wants {BUDGET[ns.profile]}")
    if bad:
        print(f"FAILED: {'; '.join(bad)}")
        return 1
    return 0
