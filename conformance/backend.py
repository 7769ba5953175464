"""What a backend is: how it resolves a kernel, where it runs, what it declines.

The registry of backends by name is :mod:`conformance.backends`; this module holds only the types,
so that a package defining backends (conformance/engine) needs nothing of the registry.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from contracts.spec import KernelSpec, Table

# The engines whose kernels the contracts specify, by root package, as messages name them. Which
# engine a contract belongs to is data of the contract: its qualname's root package (an op's, the
# torch.ops namespace its engine registers), read by :func:`engine_of` and nowhere else.
TITLES = {"vllm": "vLLM", "sglang": "SGLang"}
OP_NAMESPACES = {"_C": "vllm", "sgl_kernel": "sglang"}


def engine_of(spec: KernelSpec) -> str:
    """The root package of the engine whose kernel ``spec`` specifies (``vllm``, ``sglang``)."""
    parts = spec.qualname.split(".")
    if parts[:2] == ["torch", "ops"] and len(parts) > 2:
        return OP_NAMESPACES.get(parts[2], parts[2])
    return parts[0]


def engine_title(spec: KernelSpec) -> str:
    package = engine_of(spec)
    return TITLES.get(package, package)


@dataclass(frozen=True)
class Capability:
    """Cases a backend declares it does not support (data: a name, the kernels, a test, the reason).

    Such a case is still launched: a refusal with a Python exception is counted ``unsupported``,
    never ``fail``; outputs the backend does produce are compared like any other.
    """

    name: str
    kernels: tuple[str, ...] | None  # None: every kernel
    when: Callable[[KernelSpec, Mapping[str, Any]], bool]
    reason: str

    def covers(self, spec: KernelSpec, args: Mapping[str, Any]) -> bool:
        return (self.kernels is None or spec.name in self.kernels) and bool(self.when(spec, args))


@dataclass(frozen=True)
class Backend:
    name: str
    # Returns the kernel object for ``spec`` or None when this backend does not implement it.
    resolve: Callable[[KernelSpec], Any]
    # Device the backend's tensors live on: "cpu" or "cuda".
    device: Callable[[], str]
    # How it runs, for reports: "oracle", "native", "compiled", "interpreted".
    mode: Callable[[], str]
    # None when usable here, else why not.
    unavailable: Callable[[], str | None] = lambda: None
    # The oracle is a plain function: called as kernel(**args), not kernel[grid](**args).
    gridless: bool = False
    # A backend that replaces only some kernels of another: compositions take the rest from
    # ``base``; conformance checks only the kernels it implements itself.
    base: str | None = None
    # Refuses out-of-contract launches with TypeError/ValueError before touching memory (§1.12);
    # the malformed-input fuzz (conformance/tools/fuzz.py) holds every such backend to it.
    validates: bool = False
    # The engine under test (vLLM's own kernels): run only when asked for, and its disagreements
    # are findings about the engine (conformance/findings.py).
    engine: bool = False
    # The engine whose kernels it runs (its root package, TITLES): another engine's kernels are
    # "n/a" there. Empty: every contract's (specdiff's own backends implement them all).
    package: str = ""
    # Kernels of its own engine it has no form of, and why (qualname -> reason; data): a
    # CUDA-only kernel on an engine's Triton backend is "n/a", not missing.
    absent: Mapping[str, str] = field(default_factory=dict, hash=False)
    # What it declines (see Capability); Triton launch options it accepts and ignores (§1.9).
    capabilities: tuple[Capability, ...] = ()
    launch_options: bool = True
    # Its kernels are Triton kernels: it has no form of a host function (KernelSpec.host), which
    # is then "n/a" there rather than missing.
    triton: bool = False
    # Whether it has ``spec``, told without loading or building anything (``list``); None: resolve it.
    lists: Callable[[KernelSpec], bool] | None = None
    # Its kernels take a pointer table as vLLM's do, a uint64 tensor of addresses: a launch's
    # :class:`Table` reaches them so (the tensors stay alive in the launch's arguments).
    addresses: bool = False
    # It has a form of vLLM's C++ CPU ops (KernelSpec.op): not vLLM's Triton kernels.
    ops: bool = True

    def applies(self, spec: KernelSpec) -> bool:
        if self.package and (engine_of(spec) != self.package or spec.qualname in self.absent):
            return False
        return not (spec.host and self.triton) and (self.ops or not spec.op)

    def inapplicable(self, spec: KernelSpec) -> str:
        """Why ``spec`` has no form here (where :meth:`applies` is False)."""
        if self.package and engine_of(spec) != self.package:
            return (f"{spec.name} is {engine_title(spec)}'s kernel ({spec.qualname}); "
                    f"{self.name} runs {TITLES.get(self.package, self.package)}'s")
        if self.package and spec.qualname in self.absent:
            return self.absent[spec.qualname]
        if spec.op:
            return f"vLLM implements {spec.name} as a C++ op of its CPU build (torch.ops._C.{spec.op}): it has no Triton form"
        return f"{engine_title(spec)} implements {spec.name} in PyTorch on the host: it has no Triton form"

    def has(self, spec: KernelSpec) -> bool:
        """Whether this backend implements ``spec``, as cheaply as it can tell (``list``)."""
        return self.lists(spec) if self.lists is not None else self.resolve(spec) is not None

    def unsupported(self, spec: KernelSpec, args: Mapping[str, Any]) -> str | None:
        """The first declared capability the case falls outside of, or None."""
        return next((c.name for c in self.capabilities if c.covers(spec, args)), None)

    def launcher(self, kernel: Any, grid: Any) -> Any:
        """What a launch calls: ``kernel[grid]``, or the kernel itself for a gridless backend."""
        if self.gridless:  # a plain function, given the grid only where the kernel reads it
            launch = functools.partial(kernel, grid=tuple(grid)) if getattr(kernel, "reads_grid", False) else kernel
        else:
            launch = kernel[grid]
        if not self.addresses:
            return launch

        def with_addresses(*args: Any, **kwargs: Any) -> Any:
            return launch(*map(address, args), **addressed(kwargs))

        return with_addresses


def address(v: Any) -> Any:
    """A launch argument as vLLM's kernels take it: a pointer table as its uint64 addresses."""
    return v.addresses(v[0].device if v else "cpu") if isinstance(v, Table) else v


def addressed(args: Mapping[str, Any]) -> dict[str, Any]:
    """A launch's arguments as vLLM's kernels take them (:func:`address`); the tables' tensors must
    outlive every launch of the result."""
    return {k: address(v) for k, v in args.items()}
