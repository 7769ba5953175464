"""The Triton launch form over a C++ entry point, driven by the kernel's contract.

Every C++ entry point is ``cpu_impl._C.<family>.<kernel name without _kernel>`` and takes one
argument per contract parameter, in the kernel's order (``nox -s signatures`` checks both), so one
launcher serves every kernel: it binds the launch in Python, then hands the bound arguments to
``cpu_impl._C.Launcher`` (csrc/launch.cpp), which checks each against the contract's type-level
plan, converts it, and calls the entry point, all in C++. A launch it refuses is worded by the
contract's own checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import torch

from contracts.spec import Args, KernelSpec, Kind
from cpu_impl import _C

# Must match csrc/common.h.
DTYPE_CODES = {torch.int32: 0, torch.int64: 1, torch.float32: 2, torch.float64: 3, torch.bool: 4, torch.bfloat16: 5,
               torch.float16: 6, torch.uint8: 7}
_LAUNCHED = _C.Launcher.LAUNCHED


# The keys of a launch's grid among the bound arguments, for a kernel that reads its grid (its axes
# 0 and 1): no parameter is named so.
GRID = ("grid x", "grid y")


def _grid_axes(grid: Any) -> tuple[int, int]:
    """The first two axes of a launch grid (a tuple of one to three ints, or an int; a missing axis is 1)."""
    dims = (grid,) if isinstance(grid, int) else tuple(grid)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**63 for d in dims):
        raise ValueError(f"must be one to three non-negative ints, got {grid!r}")
    return dims[0], dims[1] if len(dims) > 1 else 1


def buf(t: torch.Tensor | None) -> tuple[int, int, int] | None:
    """A tensor as the C++ side's Buffer, (data_ptr, dtype code, numel); None for no tensor (a pointer
    table's tensors reach it as Strided tuples, (data_ptr, dtype code, numel, rows, columns, row stride))."""
    if not isinstance(t, torch.Tensor):
        return None
    return (t.data_ptr(), DTYPE_CODES[t.dtype], t.numel())


def cpp_entry_name(spec: KernelSpec) -> tuple[str, str]:
    """(submodule of cpu_impl._C, entry point) of a kernel: one name, every layer."""
    return spec.family, spec.function.removesuffix("_kernel")


def vocab_columns(spec: KernelSpec, *names: str) -> Callable[[Args], None]:
    """[rows, V] tensors have V = vocab_size columns: the C++ side sees element counts, not shapes."""

    def check(a: Args) -> None:
        v = a["vocab_size"]
        for name in names:
            t = a[name]
            if t is not None and t.shape[-1] != v:
                raise ValueError(f"{spec.name}: '{name}' must have shape [rows, vocab_size={v}], got {tuple(t.shape)}")

    return check


class CpuKernel:
    """A drop-in for ``kernel[grid](...)`` and ``kernel(...)`` (docs/spec.md §1.9, §1.11, C28).

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
        self._entry = entry
        family, self._entry_name = cpp_entry_name(spec)
        self._module = getattr(_C, family)
        self.__name__ = spec.name
        self.__qualname__ = spec.name
        self.__doc__ = spec.doc or f"OpenMP port of {spec.qualname}"
        self.__signature__ = spec.signature()
        self.arg_names = list(spec.arg_names)
        self.constexprs = list(spec.constexprs)
        # The type-level contract as the C++ launcher reads it (csrc/launch.cpp), one tuple per
        # parameter: (name, is a tensor, may be None, the integer 0 means no tensor,
        # {dtype: C++ dtype code}, must be contiguous, allowed ranks, is written, may alias, is a
        # pointer table).
        plan = [(p.name, p.kind is Kind.PTR, p.optional, p.int_zero, {d: DTYPE_CODES[d] for d in p.dtypes}, p.contiguous, p.ndim,
                 p.is_output, p.may_alias, p.table) for p in spec.params]
        if spec.check_grid is not None:  # the kernel reads its grid: the entry point's last two arguments
            plan += [(axis, False, False, False, {}, True, (), False, "", False) for axis in GRID]
        flags = [(f.constexpr, f.tensor, f.expect) for f in spec.flags]
        self._launcher = _C.Launcher(family, self._entry_name, plan, flags, torch.Tensor, self._module, check, entry)

    def __getitem__(self, grid: Any) -> Any:
        # The iteration space comes from the arguments, never from the grid (§1.11), but for a
        # kernel that reads its grid (KernelSpec.check_grid).
        if self.spec.check_grid is None:
            return self
        return lambda *args, **kwargs: self._launch(self.spec.bind(args, kwargs), grid)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        bound = self.spec.bind(args, kwargs)
        self._launch(bound, None)

    def _launch(self, bound: Args, grid: Any) -> None:
        if self.spec.check_grid is not None:
            try:
                grid = self.spec.grid(bound) if grid is None else grid(bound) if callable(grid) else grid
                axes = _grid_axes(grid)
            except Exception as e:  # the arguments' own refusal first: a grid from bad arguments is bad too
                self.spec.check_types(bound)
                self.spec.check_scalars(bound)
                self.spec.preconditions(bound)
                raise ValueError(f"{self.spec.name}: 'grid' {e}") from None
            bound = {**bound, **dict(zip(GRID, axes))}
        # Checked against the contract, converted and run in C++ (csrc/launch.cpp).
        if self._launcher.run(bound) != _LAUNCHED:
            self._refused(bound)

    def _refused(self, bound: Args) -> NoReturn:
        """Raises the contract's own words for a launch the C++ launcher refused: the argument
        named, the expectation stated."""
        self.spec.check_types(bound)
        self.spec.check_scalars(bound)  # a Python int outside int64
        raise AssertionError(f"{self.spec.name}: the contract accepts a launch the C++ launcher refused")

    def entry(self) -> Callable[..., None]:
        """The C++ entry point as a Python function, looked up at every launch (the signature
        check stands a recorder in for it), from a submodule resolved once."""
        return self._entry or getattr(self._module, self._entry_name)

    def convert(self, a: Args) -> tuple[Any, ...] | None:
        """The Python entry point's arguments for a bound launch ((data_ptr, dtype code, numel)
        per tensor), or None when an argument breaks the type-level contract (tensor or None,
        dtype, CPU, rank, contiguity)."""
        return self._launcher.python(a)

    def __repr__(self) -> str:
        return f"<CpuKernel {self.spec.name}>"
