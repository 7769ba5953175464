"""Hypothesis strategies: one composite per batch concept, and the case strategy of each kernel.

Structure (how many requests, how many drafts each, which rows are greedy, which cells are
special) is drawn by Hypothesis so that it shrinks toward small batches; bulk values (a
probability row of a 257-token vocabulary) come from a torch generator seeded by a drawn
integer, which shrinks toward seed 0. Strategies generate in-contract input only.

Kernel modules register their case strategy with :func:`cases_for`; the runner and the tests
look them up with :func:`cases`.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from types import ModuleType

import torch
from hypothesis import strategies as st

import contracts
from conformance.case import Case

_CASES: dict[str, Callable[[], st.SearchStrategy[Case]]] = {}

# Modules that register case strategies, one per kernel family.
FAMILY_MODULES = {family: f"conformance.strategies.{family}" for family in contracts.FAMILIES}


def cases_for(kernel: str) -> Callable[[Callable[[], st.SearchStrategy[Case]]], Callable[[], st.SearchStrategy[Case]]]:
    def register(fn: Callable[[], st.SearchStrategy[Case]]) -> Callable[[], st.SearchStrategy[Case]]:
        _CASES[kernel] = fn
        return fn

    return register


def family_module(family: str) -> ModuleType:
    """The family's module of this package: its case strategies (registered on import), and its
    ``CLASSES`` and ``TARGETS`` (conformance/coverage.py)."""
    return importlib.import_module(FAMILY_MODULES[family])


def cases(kernel: str, call_site: bool = False) -> st.SearchStrategy[Case]:
    """Cases of ``kernel``, launched by keyword (as vLLM does) or positionally.

    ``call_site`` keeps only what vLLM's call sites pass: keyword launches, and every integer
    tensor in its parameter's call-site dtype (converted when its values fit, else not drawn).
    """
    spec = contracts.get(kernel)
    family_module(spec.family)
    base = _CASES[spec.name]()
    if call_site:
        return base.map(lambda c: _at_call_site(spec, c)).filter(lambda c: c is not None and (spec.call_site is None or spec.call_site(c.args)))
    return st.tuples(base, st.booleans()).map(lambda cp: dataclasses.replace(cp[0], positional=cp[1]))


def _at_call_site(spec: contracts.KernelSpec, case: Case) -> Case | None:
    args = dict(case.args)
    converted: dict[int, torch.Tensor] = {}  # aliased parameters stay aliased
    for p in spec.params:
        v = args[p.name]
        if not isinstance(v, torch.Tensor) or p.call_site is None or v.dtype == p.call_site:
            continue
        if v.dtype.is_floating_point or v.dtype == torch.bool or p.call_site.is_floating_point:
            continue
        info = torch.iinfo(p.call_site)
        if v.numel() and (int(v.min()) < info.min or int(v.max()) > info.max):
            return None
        if id(v) not in converted:
            converted[id(v)] = torch.empty_strided(v.shape, v.stride(), dtype=p.call_site).copy_(v)
        args[p.name] = converted[id(v)]
    return dataclasses.replace(case, args=args, positional=False)


# -- shared composites ----------------------------------------------------------------------------
int_dtypes = st.sampled_from([torch.int32, torch.int64])  # shrinks toward the call-site int32


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


seeds = st.integers(0, 2**32 - 1)


@st.composite
def ragged_counts(draw: st.DrawFn, max_requests: int = 8, max_len: int = 6, min_requests: int = 0) -> list[int]:
    """Per-request lengths: 0..max_len each (zero-length rows and all-zero batches included)."""
    return draw(st.lists(st.integers(0, max_len), min_size=min_requests, max_size=max_requests))


def inclusive_cumsum(n: list[int], dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(n, dtype=torch.int64).cumsum(0).to(dtype) if n else torch.zeros(0, dtype=dtype)
