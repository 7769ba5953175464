"""Coverage of the speculative-decoding state space: which state classes the cases reached.

A conformance run is only as good as the states its cases visit. Each kernel's cases are
classified here — from the arguments and from the oracle's outputs, where the state is a result
(a row whose drafts were all accepted shows as a written bonus cell) — into the classes of
:class:`StateClass`es of its family. The runner reports each class as a Hypothesis ``event()`` (``pytest
--hypothesis-show-statistics`` lists them), steers generation with ``target()`` toward long
accepted chains, and tallies them per kernel; under the ``ci`` and ``nightly`` profiles a
*required* class that no case reached fails the run.

Classes are data, kept with the family's cases: ``CLASSES`` in ``conformance/strategies/<family>.py``,
each a :class:`StateClass` with the kernels it applies to and a function that counts its occurrences
in one case (and ``TARGETS``, the ``target()`` a family's generation maximises).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

import contracts
from conformance import strategies

Args = Mapping[str, Any]
Outputs = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class StateClass:
    name: str
    kernels: tuple[str, ...]
    # Occurrences in one case (rows, cells or 1/0), from the arguments and the oracle's outputs.
    count: Callable[[str, Args, Outputs], int]
    doc: str = ""
    required: bool = True  # the ci and nightly profiles fail when no case reached it
    # A contract rule that follows vLLM 0.33.0 into a hazard: never required, never a failure, but
    # counted and listed apart ("hazards" in the report), so a maintainer sees how often it decides.
    hazard: bool = False
    # Reachable by the launches the engine's call sites make: a class outside them (a dtype or
    # layout no call site passes) is not required of a `--call-site` run.
    call_site: bool = True


def classes_for(kernel: str) -> list[StateClass]:
    """The state classes (and hazards) of ``kernel``, from its family's ``CLASSES``."""
    family = strategies.family_module(contracts.get(kernel).family)
    return [c for c in getattr(family, "CLASSES", ()) if kernel in c.kernels]


def required(kernel: str, call_site: bool = False) -> list[str]:
    """The classes a run of ``kernel`` must reach (with ``call_site``: of those the call sites reach)."""
    return [c.name for c in classes_for(kernel) if c.required and (c.call_site or not call_site)]


def classify(kernel: str, args: Args, outputs: Outputs) -> Counter[str]:
    """Occurrences of every class of ``kernel`` in one case (classes absent from it are omitted)."""
    found: Counter[str] = Counter()
    for c in classes_for(kernel):
        n = c.count(kernel, args, outputs)
        if n:
            found[c.name] += n
    return found


def observe(kernel: str, args: Args, outputs: Outputs) -> Counter[str]:
    """Classifies one case and reports it to Hypothesis: an ``event()`` per class, and the kernel's
    ``target()``. Call from inside a Hypothesis test; returns the classification."""
    from hypothesis import event, target

    found = classify(kernel, args, outputs)
    for name in sorted(found):
        event(f"state: {name}")
    targets = getattr(strategies.family_module(contracts.get(kernel).family), "TARGETS", {})
    if kernel in targets:
        label, fn = targets[kernel]
        target(float(fn(kernel, args, outputs)), label=label)
    return found


def missing(kernel: str, seen: Iterable[str], call_site: bool = False) -> list[str]:
    """Required classes of ``kernel`` that no case reached (with ``call_site``: of those the call sites reach)."""
    seen = set(seen)
    return [n for n in dict.fromkeys(required(kernel, call_site)) if n not in seen]
