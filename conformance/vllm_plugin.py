"""specdiff's C++ port as vLLM's CPU kernels: a vLLM general plugin (entry point group
``vllm.general_plugins``, name ``specdiff``; pyproject.toml).

vLLM loads general plugins in every process before its worker lets the platform replace Triton
kernels (``vllm/v1/worker/worker_base.py``: ``load_general_plugins()``, then
``current_platform.register_triton_kernel_overrides()``). A plugin that registered at load time
would be overwritten by ``CpuPlatform``'s own registration a moment later, so :func:`register`
extends that platform hook instead: vLLM's registration runs first, then specdiff's launchers are
registered over it through vLLM's own registry (``vllm/triton_utils/dispatcher.py``:
``register_kernels``, which wraps each in its ``KernelOverride`` and rebinds every module that
imported the kernel). With Triton-CPU installed vLLM skips its own overrides; specdiff still
registers, as installing the plugin asks for its port.

Two environment variables, read when the platform registers its kernels:

- ``SPECDIFF_PLUGIN_KERNELS``: ``cpu`` (the default: specdiff's C++ port), ``reference`` (specdiff's
  oracle, plain PyTorch: slow, the semantics itself) or ``engine`` (vLLM's own CPU port; the plugin
  only counts and records its launches). :func:`use` switches between them at run time, so that
  one engine process can interleave the three (``python -m conformance.e2e``).
- ``SPECDIFF_RECORD``: a directory. Every launch is saved there as a conformance case (the
  arguments before the launch) and its outputs (the arguments after), ``conformance replay DIR``
  runs them through every backend. At most ``SPECDIFF_RECORD_LIMIT`` launches per kernel (200).
  A directory that cannot be written is one warning; the engine goes on undisturbed.

On any other platform the plugin does nothing. ``VLLM_PLUGINS`` (vLLM's allowlist) turns it off:
set it to the plugins wanted, without ``specdiff``.
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contracts import dflash, eagle, rejection, slot_mapping
from contracts.spec import KernelSpec

# The kernels vLLM 0.33.0's CpuPlatform overrides (vllm/platforms/cpu.py:711-742), all of which
# specdiff ports; their contracts hold the qualnames the registry resolves.
FAMILIES = (rejection, eagle, dflash, slot_mapping)
KERNEL_SETS = ("cpu", "reference", "engine")

# Launches per kernel name in this process, whichever kernel set runs them, and their seconds.
LAUNCHES: Counter[str] = Counter()
SECONDS = [0.0]


def kernel_set() -> str:
    """The kernel set ``SPECDIFF_PLUGIN_KERNELS`` asks for; ValueError naming the variable otherwise."""
    value = os.environ.get("SPECDIFF_PLUGIN_KERNELS", "cpu")
    if value not in KERNEL_SETS:
        raise ValueError(f"SPECDIFF_PLUGIN_KERNELS must be one of {', '.join(KERNEL_SETS)}, got {value!r}")
    return value


def specs() -> list[KernelSpec]:
    return [spec for family in FAMILIES for spec in family.SPECS]


def launchers(backend: str = "cpu") -> dict[str, Any]:
    """qualname -> specdiff's launcher on ``backend`` ("cpu" or "reference"), for every V1 kernel of
    vLLM's CPU path."""
    from conformance.backends import BACKENDS, resolve_kernel

    gridless = BACKENDS[backend].gridless
    out = {}
    for spec in specs():
        _, kernel = resolve_kernel(backend, spec)
        out[spec.qualname] = kernel if not gridless else _Gridded(kernel)
    return out


class _Gridded:
    """A plain function (the oracle) launched as ``kernel[grid](...)`` or ``kernel(...)``."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn
        self.__signature__ = inspect.signature(fn)
        self.__name__ = getattr(fn, "__name__", "kernel")

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)


class Recorder:
    """Saves launches as conformance cases, one directory per kernel set (``vllm-cpu``, ``cpu``,
    ``reference``): ``NNNNNN-<kernel>.safetensors`` holds the arguments before the launch and
    ``NNNNNN-<kernel>.out.safetensors`` the same arguments after it. Only the bytes the arguments span
    are kept (vLLM's persistent buffers are far larger)."""

    def __init__(self, root: Path, limit: int) -> None:
        self.root = root
        self.limit = limit
        self.saved: Counter[tuple[str, str]] = Counter()
        self.broken = False
        self._lock = threading.Lock()
        self._serial = 0

    def before(self, spec: KernelSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A snapshot of the launch's arguments, or None when this launch is not recorded."""
        if self.broken or self.saved[ACTIVE[0], spec.name] >= self.limit:
            return None
        try:
            bound = dict(spec.bind(args, kwargs))
        except TypeError:
            return None  # a launch the contract cannot bind is saved by no one; the kernel refuses it
        try:
            return bound, compact(bound)
        except Exception as e:  # noqa: BLE001 - the recorder must never disturb the engine's launch
            self.broken = True
            print(f"specdiff: recording stopped, a {spec.name} launch could not be copied: {e}", file=sys.stderr)
            return None

    def after(self, spec: KernelSpec, snapshot: Any, meta: dict[str, Any]) -> None:
        if snapshot is None:
            return
        from conformance.case import Case
        from conformance.casefile import save_case

        bound, before = snapshot
        with self._lock:
            self._serial += 1
            stem = self.root / _RECORDED_AS[ACTIVE[0]] / f"{self._serial:06d}-{spec.name}"
            self.saved[ACTIVE[0], spec.name] += 1
        try:
            save_case(Case(spec.name, before, note="recorded from a running engine"), stem.with_name(stem.name + ".safetensors"), meta)
            save_case(Case(spec.name, compact(bound), note="the same launch's arguments after it ran"),
                      stem.with_name(stem.name + ".out.safetensors"), meta)
        except Exception as e:  # noqa: BLE001 - a full disk or an unsavable tensor: warn once, never fail the launch
            self.broken = True
            print(f"specdiff: recording stopped, cannot write under SPECDIFF_RECORD={str(self.root)!r}: {e}", file=sys.stderr)


def compact(args: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``args`` whose tensors keep their views of one another (aliases stay aliases) but
    own only the bytes those views span."""
    import torch

    groups: dict[tuple[str, int], list[str]] = {}
    for name, v in args.items():
        if isinstance(v, torch.Tensor) and v.layout is torch.strided and v.numel() > 0:
            groups.setdefault((str(v.device), v.untyped_storage().data_ptr()), []).append(name)
    out = dict(args)
    for names in groups.values():
        spans = []
        for n in names:
            t = args[n]
            first = t.storage_offset() * t.element_size()
            last = first + (sum((d - 1) * s for d, s in zip(t.shape, t.stride())) + 1) * t.element_size()
            spans.append((first, last))
        lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
        raw = torch.empty(0, dtype=torch.uint8, device=args[names[0]].device).set_(args[names[0]].untyped_storage())
        base = raw[lo:hi].cpu().clone()
        for n in names:
            t = args[n]
            offset = t.storage_offset() * t.element_size() - lo
            whole = base[: (hi - lo) - (hi - lo) % t.element_size()].view(t.dtype)
            out[n] = torch.as_strided(whole, t.shape, t.stride(), offset // t.element_size())
    for n, v in args.items():  # a tensor without elements: a fresh empty one of its kind
        if isinstance(v, torch.Tensor) and v.numel() == 0:
            out[n] = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype)
    return out


class Launcher:
    """What vLLM's registry holds for one kernel: every kernel set's form of it, launched through the
    active one (:func:`use`), counted, timed, and recorded when a recorder is given. Its signature is
    the contract's (vLLM's kernel parameters), so ``KernelOverride`` forwards launches by name; vLLM's
    own implementation then receives them as ``KernelOverride`` would have passed them."""

    def __init__(self, spec: KernelSpec, kernels: dict[str, Any], recorder: Recorder | None) -> None:
        self.spec, self.kernels, self.recorder = spec, kernels, recorder
        self.__signature__ = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                                for n in spec.arg_names])
        self.__name__ = spec.name
        engine = kernels.get("engine")
        self._engine_by_name = engine is not None and tuple(_names(engine)) == tuple(spec.arg_names)

    @property
    def kernel(self) -> Any:
        return self.kernels[ACTIVE[0]]

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return self

    def _launch(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        kernel = self.kernel
        if ACTIVE[0] != "engine" or args or self._engine_by_name:
            return kernel(*args, **kwargs)
        return kernel(*(kwargs[n] for n in self.spec.arg_names if n in kwargs))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        LAUNCHES[self.spec.name] += 1
        snapshot = None if self.recorder is None else self.recorder.before(self.spec, args, kwargs)
        start = time.perf_counter()
        result = self._launch(args, kwargs)
        SECONDS[0] += time.perf_counter() - start
        if snapshot is not None:
            self.recorder.after(self.spec, snapshot, {"recorded": {"kernels": _RECORDED_AS[ACTIVE[0]], "vllm": _vllm_version()}})  # type: ignore[union-attr]
        return result


def _names(fn: Any) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


_RECORDED_AS = {"engine": "vllm-cpu", "cpu": "cpu", "reference": "reference"}
ACTIVE = ["cpu"]


def use(kernels: str) -> None:
    """Switches every registered kernel to the set ``kernels`` from the next launch on."""
    if kernels not in KERNEL_SETS:
        raise ValueError(f"kernels must be one of {', '.join(KERNEL_SETS)}, got {kernels!r}")
    ACTIVE[0] = kernels


def recorder() -> Recorder | None:
    """The recorder ``SPECDIFF_RECORD`` asks for, or None; an unusable directory is one warning."""
    where = os.environ.get("SPECDIFF_RECORD")
    if not where:
        return None
    limit = os.environ.get("SPECDIFF_RECORD_LIMIT", "200")
    if not limit.isdigit():
        raise ValueError(f"SPECDIFF_RECORD_LIMIT must be a non-negative integer, got {limit!r}")
    root = Path(where)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        print(f"specdiff: not recording, SPECDIFF_RECORD={where!r} cannot be written: {e}", file=sys.stderr)
        return None
    return Recorder(root, int(limit))


def install(register_kernels: Callable[[dict[str, Any]], None], engine_kernels: dict[str, Any] | None = None) -> str:
    """Registers a :class:`Launcher` for every kernel with ``register_kernels`` (vLLM's, or a test's copy
    of it), the set ``SPECDIFF_PLUGIN_KERNELS`` asks for active. ``engine_kernels``: vLLM's own
    registered implementations by qualname (the ``engine`` set; without one, that set is not offered)."""
    chosen = kernel_set()
    engine_kernels = engine_kernels or {}
    if chosen == "engine" and not engine_kernels:
        raise ValueError("SPECDIFF_PLUGIN_KERNELS=engine, but vLLM registered no CPU kernels of its own here")
    ours = {b: launchers(b) for b in ("cpu", "reference")}
    rec = recorder()
    registered = {}
    for spec in specs():
        kernels = {b: ours[b][spec.qualname] for b in ours}
        if spec.qualname in engine_kernels:
            kernels["engine"] = engine_kernels[spec.qualname]
        elif chosen == "engine":
            continue  # vLLM keeps its Triton kernel there: nothing of ours to put in its place
        registered[spec.qualname] = Launcher(spec, kernels, rec)
    use(chosen)
    register_kernels(registered)
    return chosen


def _vllm_version() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:  # noqa: BLE001 - outside vLLM (a test's registry): no version to name
        return ""


def register() -> None:
    """The plugin's entry point: on vLLM's CPU platform, specdiff's launchers become the kernels
    after the platform registered its own. Idempotent: vLLM may load plugins more than once."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    kernel_set()  # a bad value fails at start-up, naming the variable, not at the first draft step
    platform = type(current_platform)
    own = platform.register_triton_kernel_overrides
    if getattr(own, "specdiff", False):
        return

    def register_triton_kernel_overrides(cls: type) -> None:
        own()
        from vllm.triton_utils import dispatcher

        registered = {name: entry[1] for name, entry in getattr(dispatcher, "_registry", {}).items()}
        install(dispatcher.register_kernels, registered)

    register_triton_kernel_overrides.specdiff = True  # type: ignore[attr-defined]
    platform.register_triton_kernel_overrides = classmethod(register_triton_kernel_overrides)  # type: ignore[method-assign]
