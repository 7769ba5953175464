"""The Triton launch form over a C++ entry point, driven by the kernel's contract."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from conformance.contract import Args, KernelSpec

# Must match csrc/common.h.
DTYPE_CODES = {torch.int32: 0, torch.int64: 1, torch.float32: 2, torch.float64: 3, torch.bool: 4}
# Keyed by the dtype object's id: hashing a torch.dtype costs more than the rest of buf().
_CODES_BY_ID = {id(dtype): code for dtype, code in DTYPE_CODES.items()}


def buf(t: torch.Tensor | None) -> tuple[int, int, int] | None:
    """A tensor as the (data_ptr, dtype code, numel) triple the C++ entry points take."""
    if t is None or not isinstance(t, torch.Tensor):
        return None
    code = _CODES_BY_ID.get(id(t.dtype))
    return (t.data_ptr(), DTYPE_CODES[t.dtype] if code is None else code, t.numel())


class CpuKernel:
    """A drop-in for ``kernel[grid](...)`` and ``kernel(...)`` (spec §1.9, §1.11, C28).

    Introspectable: ``inspect.signature`` gives the kernel's parameters in order, and
    ``arg_names`` / ``constexprs`` mirror a Triton ``JITFunction``'s.
    """

    def __init__(self, spec: KernelSpec, compute: Callable[[Args], None]) -> None:
        self.spec = spec
        self._compute = compute
        self.__name__ = spec.name
        self.__qualname__ = spec.name
        self.__doc__ = spec.doc or f"OpenMP port of {spec.qualname}"
        self.__signature__ = spec.signature()
        self.arg_names = list(spec.arg_names)
        self.constexprs = list(spec.constexprs)

    def __getitem__(self, grid: Any) -> CpuKernel:
        # The iteration space comes from the arguments, never from the grid (§1.11).
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        bound = self.spec.bind(args, kwargs)
        self.spec.check_types(bound)
        try:
            self._compute(bound)
        except TypeError:
            # pybind11 refuses an int outside int64 without naming it; name it (free when all is well).
            self.spec.check_scalars(bound)
            raise

    def __repr__(self) -> str:
        return f"<CpuKernel {self.spec.name}>"
