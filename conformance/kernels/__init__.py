"""Every kernel contract, by vLLM kernel name."""

from __future__ import annotations

from conformance.contract import KernelSpec
from conformance.kernels import rejection

SPECS: dict[str, KernelSpec] = {s.name: s for s in rejection.SPECS}
FAMILIES: dict[str, tuple[KernelSpec, ...]] = {"rejection": rejection.SPECS}


def get(name: str) -> KernelSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise KeyError(f"unknown kernel {name!r}; known: {', '.join(SPECS)}") from None
