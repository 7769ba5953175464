"""Every kernel contract, by vLLM kernel name."""

from __future__ import annotations

from conformance.contract import KernelSpec
from conformance.kernels import async_update, dflash, eagle, fly, mrv2, rejection, slot_mapping, topk_topp

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
