"""The Triton launch form over a C++ entry point, driven by the kernel's contract.

Every C++ entry point is ``cpu_impl._C.<family>.<kernel name without _kernel>`` and takes one
argument per contract parameter, in the kernel's order (``nox -s signatures`` checks both), so one
launcher serves every kernel: it binds the launch, checks each argument against the contract and
converts it in the same pass, and calls the entry point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from conformance.contract import Args, KernelSpec, Kind
from conformance.kernels._checks import geometry
from cpu_impl import _C

# Must match csrc/common.h.
DTYPE_CODES = {torch.int32: 0, torch.int64: 1, torch.float32: 2, torch.float64: 3, torch.bool: 4}

_PTR = Kind.PTR


def buf(t: torch.Tensor | None) -> tuple[int, int, int] | None:
    """A tensor as the C++ side's Buffer, (data_ptr, dtype code, numel); None for no tensor."""
    if not isinstance(t, torch.Tensor):
        return None
    return (t.data_ptr(), DTYPE_CODES[t.dtype], t.numel())


def cpp_entry_name(spec: KernelSpec) -> tuple[str, str]:
    """(submodule of cpu_impl._C, entry point) of a kernel: one name, every layer."""
    return spec.family, spec.name.removesuffix("_kernel")


class CpuKernel:
    """A drop-in for ``kernel[grid](...)`` and ``kernel(...)`` (spec §1.9, §1.11, C28).

    ``check`` adds value checks the C++ side cannot make (it sees element counts, not shapes);
    ``entry`` replaces the C++ entry point (tests plant broken launchers with it). Introspectable:
    ``inspect.signature`` gives the kernel's parameters in order, and ``arg_names`` /
    ``constexprs`` mirror a Triton ``JITFunction``'s.
    """

    def __init__(
        self,
        spec: KernelSpec,
        check: Callable[[Args], None] | None = None,
        entry: Callable[..., None] | None = None,
    ) -> None:
        self.spec = spec
        self._check = check
        self._entry = entry
        family, self._entry_name = cpp_entry_name(spec)
        self._module = getattr(_C, family)
        self.__name__ = spec.name
        self.__qualname__ = spec.name
        self.__doc__ = spec.doc or f"OpenMP port of {spec.qualname}"
        self.__signature__ = spec.signature()
        self.arg_names = list(spec.arg_names)
        self.constexprs = list(spec.constexprs)
        # The per-launch plan: dtypes by the id of the dtype object (torch.dtype's == and hash
        # cost more than the rest of a conversion), C++ dtype codes as values.
        self._plan = tuple(
            (p.name, p.kind is _PTR, p.optional, p.int_zero, {id(d): DTYPE_CODES[d] for d in p.dtypes}, p.contiguous, p.ndim)
            for p in spec.params
        )

    def __getitem__(self, grid: Any) -> CpuKernel:
        # The iteration space comes from the arguments, never from the grid (§1.11).
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        bound = self.spec.bind(args, kwargs)
        converted = self.convert(bound)
        if converted is None:
            self.spec.check_types(bound)  # words the violation convert() found, naming the argument
            raise AssertionError(f"{self.spec.name}: check_types accepted a launch the launcher refused")
        if self._check is not None:
            self._check(bound)
        try:
            self.entry()(*converted)
        except TypeError:
            # pybind11 refuses an int outside int64 without naming it; name it (free when all is well).
            self.spec.check_scalars(bound)
            raise

    def entry(self) -> Callable[..., None]:
        """The C++ entry point, looked up at every launch (the signature check stands a recorder
        in for it), from a submodule resolved once."""
        return self._entry or getattr(self._module, self._entry_name)

    def convert(self, a: Args) -> list[Any] | None:
        """The C++ entry point's arguments for a bound launch, or None when an argument breaks the
        type-level contract (tensor or None, dtype, CPU, rank, contiguity, flags): the check and
        the conversion in one pass, since they read the same tensor attributes."""
        out: list[Any] = []
        put = out.append
        tensor = torch.Tensor
        for name, is_ptr, optional, int_zero, codes, contiguous, ndim in self._plan:
            v = a[name]
            if is_ptr:
                if v is None:
                    if not optional:
                        return None
                    put(None)
                    continue
                if int_zero and v.__class__ is int and v == 0:
                    put(None)  # the integer 0 stands for no tensor (K9)
                    continue
                if not isinstance(v, tensor):
                    return None
                code = codes.get(id(v.dtype))
                if code is None or not v.is_cpu:
                    return None
                dim = v.dim()
                if dim not in ndim:
                    return None
                if contiguous:
                    if not v.is_contiguous():
                        return None
                    put((v.data_ptr(), code, v.numel()))
                elif dim and v.stride(-1) != 1:
                    return None
                else:  # a table with an explicit row stride: a Strided, whatever its layout
                    put((v.data_ptr(), code, v.numel(), *geometry(v)))
            elif isinstance(v, int):
                put(v)  # flags too: pybind11 converts an int to a C++ bool as bool() does
            else:
                return None
        for f in self.spec.flags:
            if bool(a[f.constexpr]) != f.expect(a[f.tensor]):
                return None
        return out

    def __repr__(self) -> str:
        return f"<CpuKernel {self.spec.name}>"
