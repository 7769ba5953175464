"""Every kernel contract, by vLLM kernel name.

A contract is data (``contracts/spec.py``: ``KernelSpec``, its parameters, dtypes, outputs, grid and
preconditions), one module per kernel family, plus C29's numerics (``contracts/numerics.py``).
This package imports nothing else of specdiff's: the oracle, the kernels, the port and the harness
all read it (``tests/test_layout.py``)."""

from __future__ import annotations

import importlib
import pkgutil

from contracts.spec import KernelSpec


def _families() -> dict[str, tuple[KernelSpec, ...]]:
    """Every module of this package with SPECS, by name: a new family adds its module and nothing here.
    Sorted by name, so that every table lists the kernels in one order."""
    found = {}
    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"contracts.{m.name}")
        if hasattr(module, "SPECS"):
            found[m.name] = module.SPECS
    return found


FAMILIES: dict[str, tuple[KernelSpec, ...]] = _families()
SPECS: dict[str, KernelSpec] = {s.name: s for family in FAMILIES.values() for s in family}


def get(name: str) -> KernelSpec:
    """A kernel by its name; a vLLM function name shared by two kernels must be qualified by its
    family (``input_batch._prepare_prefill_inputs_kernel``), a unique one may be given bare."""
    if name in SPECS:
        return SPECS[name]
    bare = [s for s in SPECS.values() if s.function == name]
    if len(bare) == 1:
        return bare[0]
    if bare:
        raise KeyError(f"kernel {name!r} is ambiguous: give one of {', '.join(s.name for s in bare)}")
    raise KeyError(f"unknown kernel {name!r}; known: {', '.join(SPECS)}")
