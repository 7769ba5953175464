"""Every kernel contract, by vLLM kernel name.

A contract is data (``contracts/spec.py``: ``KernelSpec``, its parameters, dtypes, outputs, grid and
preconditions), one module per kernel family, plus C29's numerics (``contracts/numerics.py``).
This package imports nothing else of specdiff's: the oracle, the kernels, the port and the harness
all read it (``tests/test_layout.py``)."""

from __future__ import annotations

from contracts import async_update, dflash, eagle, fly, mrv2, rejection, slot_mapping, topk_topp
from contracts.spec import KernelSpec

FAMILIES: dict[str, tuple[KernelSpec, ...]] = {
    "rejection": rejection.SPECS,
    "eagle": eagle.SPECS,
    "dflash": dflash.SPECS,
    "slot_mapping": slot_mapping.SPECS,
    "mrv2": mrv2.SPECS,
    "fly": fly.SPECS,
    "async_update": async_update.SPECS,
    "topk_topp": topk_topp.SPECS,
}
SPECS: dict[str, KernelSpec] = {s.name: s for family in FAMILIES.values() for s in family}


def get(name: str) -> KernelSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise KeyError(f"unknown kernel {name!r}; known: {', '.join(SPECS)}") from None
