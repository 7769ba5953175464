"""Backends register on the kernel contracts by name; the runner launches whatever is registered.

A backend (:class:`conformance.backend.Backend`) is a way to get, for a :class:`KernelSpec`, an
object launched as ``kernel[grid](**args)``. The three built-in backends resolve the kernel by its
vLLM name in their own module of the kernel's family (``reference.rejection``,
``triton_impl.rejection``, ``cpu_impl.rejection``). The engines' (conformance/engine: vLLM's, then
SGLang's) are registered here after them. A further backend registers with :func:`register_backend`, or from another package
through the ``specdiff.backends`` entry-point group, without editing this file. Importing this module
registers every one of them.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from collections.abc import Callable
from typing import Any

import torch

from conformance import engine
from conformance.backend import Backend
from conformance.engine import sglang
from contracts.spec import KernelSpec

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
        return getattr(module, spec.function, None)

    return resolve


def _checked_oracle(spec: KernelSpec) -> Any:
    """The oracle's function for ``spec``, behind the contract's check: the oracle states semantics
    for launches inside the contract, and the harness applies the contract before it runs (on the
    CPU or the GPU, whichever holds the tensors: the oracle is plain PyTorch)."""
    fn = _from_family("reference")(spec)
    if fn is None:
        return None

    if spec.check_grid is not None:  # the kernel reads its grid: a launch passes it (Backend.launcher)

        @functools.wraps(fn)
        def gridded(*args: Any, grid: tuple[int, ...] | None = None, **kwargs: Any) -> Any:
            a = spec.bind(args, kwargs)
            grid = tuple(spec.grid(a)) if grid is None else tuple(grid)
            spec.check(a, device=_device(a), grid=grid)
            return fn(**a, grid=grid)

        gridded.reads_grid = True  # type: ignore[attr-defined]
        return gridded

    @functools.wraps(fn)
    def oracle(*args: Any, **kwargs: Any) -> Any:
        a = spec.bind(args, kwargs)  # as a launch binds: options dropped, unread placeholders set aside
        spec.check(a, device=_device(a))
        return fn(**a)

    return oracle


def _device(a: dict[str, Any]) -> str:
    return "cuda" if any(isinstance(v, torch.Tensor) and v.is_cuda for v in a.values()) else "cpu"


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
register_backend(Backend("triton", _from_family("triton_impl"), _triton_device, _triton_mode, _triton_unavailable, triton=True,
                         addresses=True))
register_backend(Backend("cpu", _from_family("cpu_impl"), lambda: "cpu", lambda: "native", _cpu_unavailable, validates=True))


def _triton_split(spec: KernelSpec) -> Any:
    if spec.name != "sample_recovered_tokens_kernel":
        return None
    from triton_impl.rejection import sample_recovered_tokens_split

    return sample_recovered_tokens_split


# The split-vocabulary layout of sample_recovered_tokens (triton_impl/rejection.py); the engine's
# layout stays the "triton" backend's, with the engine's signature and grid.
register_backend(Backend("triton-split", _triton_split, _triton_device, _triton_mode, _triton_unavailable, base="triton",
                         triton=True, addresses=True))

# vLLM's own kernels and CPU port (conformance/engine), unavailable until a vLLM is named; then
# SGLang's (conformance/engine/sglang.py), unavailable until an SGLang is named.
for _engine_backend in (*engine.BACKENDS, *sglang.BACKENDS):
    register_backend(_engine_backend)

for _ep in importlib.metadata.entry_points(group="specdiff.backends"):
    register_backend(_ep.load())
