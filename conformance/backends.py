"""Backends register on the kernel contracts by name; the runner launches whatever is registered.

A backend is a way to get, for a :class:`KernelSpec`, an object launched as
``kernel[grid](**args)``. The three built-in backends resolve the kernel by its vLLM name in
their own module of the kernel's family (``reference.rejection``, ``triton_impl.rejection``,
``cpu_impl.rejection``). A fourth backend — an engine's own kernels, say — registers with
:func:`register_backend`, or from another package through the ``specdiff.backends`` entry-point
group, without editing this file.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from contracts.spec import KernelSpec


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
    # What it declines (see Capability); Triton launch options it accepts and ignores (§1.9).
    capabilities: tuple[Capability, ...] = ()
    launch_options: bool = True
    # Its kernels are Triton kernels: it has no form of a host function (KernelSpec.host), which
    # is then "n/a" there rather than missing.
    triton: bool = False

    def applies(self, spec: KernelSpec) -> bool:
        return not (spec.host and self.triton)

    def unsupported(self, spec: KernelSpec, args: Mapping[str, Any]) -> str | None:
        """The first declared capability the case falls outside of, or None."""
        return next((c.name for c in self.capabilities if c.covers(spec, args)), None)

    def launcher(self, kernel: Any, grid: Any) -> Any:
        """What a launch calls: ``kernel[grid]``, or the kernel itself for a gridless backend."""
        return kernel if self.gridless else kernel[grid]


BACKENDS: dict[str, Backend] = {}
ORACLE = "reference"


def register_backend(backend: Backend) -> Backend:
    BACKENDS[backend.name] = backend
    return backend


def resolve_kernel(name: str, spec: KernelSpec) -> tuple[Backend, Any]:
    """The backend and kernel object that run ``spec`` on backend ``name``, following ``base``."""
    backend = BACKENDS[name]
    kernel = backend.resolve(spec)
    while kernel is None and backend.base is not None:
        backend = BACKENDS[backend.base]
        kernel = backend.resolve(spec)
    if kernel is None:
        raise LookupError(f"backend {name!r} has no {spec.name}")
    return backend, kernel


def _from_family(package: str) -> Callable[[KernelSpec], Any]:
    def resolve(spec: KernelSpec) -> Any:
        try:
            module = importlib.import_module(f"{package}.{spec.family}")
        except ModuleNotFoundError as e:
            if e.name == f"{package}.{spec.family}":
                return None
            raise
        return getattr(module, spec.name, None)

    return resolve


def _checked_oracle(spec: KernelSpec) -> Any:
    """The oracle's function for ``spec``, behind the contract's check: the oracle states semantics
    for launches inside the contract, and the harness applies the contract before it runs (on the
    CPU or the GPU, whichever holds the tensors: the oracle is plain PyTorch)."""
    fn = _from_family("reference")(spec)
    if fn is None:
        return None

    @functools.wraps(fn)
    def oracle(*args: Any, **kwargs: Any) -> Any:
        a = spec.bind(args, kwargs)  # as a launch binds: options dropped, unread placeholders set aside
        cuda = any(isinstance(v, torch.Tensor) and v.is_cuda for v in a.values())
        spec.check(a, device="cuda" if cuda else "cpu")
        return fn(**a)

    return oracle


def _triton_mode() -> str:
    import triton_impl

    return triton_impl.mode()


def _triton_device() -> str:
    import triton_impl

    return triton_impl.device()


def _triton_unavailable() -> str | None:
    try:
        import triton_impl  # noqa: F401  (first: it decides TRITON_INTERPRET before triton loads)
    except ImportError as e:  # pragma: no cover - triton is a dependency
        return f"triton is not importable: {e}"
    return None


def _cpu_unavailable() -> str | None:
    try:
        importlib.import_module("cpu_impl._C")
    except ImportError as e:
        return f"the C++ extension is not built: {e}"
    return None


register_backend(Backend(ORACLE, _checked_oracle, lambda: "cpu", lambda: "oracle", gridless=True, validates=True))
register_backend(Backend("triton", _from_family("triton_impl"), _triton_device, _triton_mode, _triton_unavailable, triton=True))
register_backend(Backend("cpu", _from_family("cpu_impl"), lambda: "cpu", lambda: "native", _cpu_unavailable, validates=True))


def _triton_split(spec: KernelSpec) -> Any:
    if spec.name != "sample_recovered_tokens_kernel":
        return None
    from triton_impl.rejection import sample_recovered_tokens_split

    return sample_recovered_tokens_split


# The split-vocabulary layout of sample_recovered_tokens (triton_impl/rejection.py); the engine's
# layout stays the "triton" backend's, with the engine's signature and grid.
register_backend(Backend("triton-split", _triton_split, _triton_device, _triton_mode, _triton_unavailable, base="triton",
                         triton=True))

# vLLM's own kernels and CPU port (conformance/engine), unavailable until a vLLM is named.
importlib.import_module("conformance.engine")

for _ep in importlib.metadata.entry_points(group="specdiff.backends"):
    register_backend(_ep.load())
