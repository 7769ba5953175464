"""The engine as backends: vLLM's own Triton kernels (``vllm``) and its own CPU port (``vllm-cpu``).

A second engine, SGLang, has backends of its own (``sglang``, ``sglang-cpu``:
:mod:`conformance.engine.sglang`); both are :class:`Engine` objects, an engine named on the command
line and what is loaded from its files.

Both are built in and stay unavailable until a vLLM is named: ``--vllm VERSION|PATH`` on the
command line, or ``SPECDIFF_VLLM`` in the environment (child processes inherit it). ``--vllm
installed`` takes an importable vLLM instead (a GPU machine with vLLM installed): kernels are
then resolved by importing their qualnames, and the CPU ops come from ``vllm._C``.

``vllm`` runs wherever specdiff's own Triton backend runs: compiled with a GPU, interpreted
(``TRITON_INTERPRET=1``, decided by ``triton_impl`` before Triton loads) without one.
``vllm-cpu`` always runs on the CPU. What the CPU port does not support is declared in
:data:`CPU_CAPABILITIES`; the runner counts such cases as ``unsupported`` when the port refuses
them with a Python exception.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import re
from pathlib import Path
from typing import Any

import torch

from conformance.backend import Backend, Capability
from conformance.engine import source as _source
from conformance.engine.source import Distribution, Source, SourceError, VllmSource, locate
from contracts.spec import Earlier, KernelSpec, Kind

ENV = "SPECDIFF_VLLM"
INSTALLED = "installed"


# Every engine by root package (Backend.package): vLLM's here, SGLang's in conformance.engine.sglang.
ENGINES: dict[str, Engine] = {}


class Engine:
    """One engine as a run names it: its files (a :class:`Distribution`), the environment variable
    that names a release or a path (child processes inherit it), and what is read from those files,
    cached until the engine is named again."""

    def __init__(self, dist: Distribution, env: str) -> None:
        self.dist, self.env = dist, env
        self.package, self.title, self.option = dist.package, dist.title, dist.option
        self._located: Source | None = None
        self._loader: Any = None
        ENGINES[self.package] = self

    def use(self, spec: str) -> None:
        """Points the engine's backends at ``spec`` (a release, a path, or ``installed``; "" for none)."""
        os.environ[self.env] = spec
        self._located = self._loader = None

    def named(self) -> str | None:
        return os.environ.get(self.env) or None

    def located(self) -> Source:
        if self._located is None:
            self._located = self._locate()
        return self._located

    def _locate(self) -> Source:
        spec, package = self.named(), self.dist.package
        if spec is None:
            raise SourceError(f"no {self.title} named: pass {self.option} VERSION|PATH (or set {self.env})")
        if spec == INSTALLED:
            found = importlib.util.find_spec(package)
            if found is None or found.origin is None:
                raise SourceError(f"{self.option} installed, but no {self.title} is installed here")
            # Its files are read like any tree's; vLLM's compiled ops (vllm._C) replace the build from csrc.
            return Source(Path(found.origin).parent.parent, None, f"the installed {self.title} ({Path(found.origin).parent})", package)
        return locate(spec, self.dist)

    def release(self) -> str | None:
        """The release of the named engine (its ``_version.py``), or None when none is named or readable."""
        try:
            return self.located().release if self.named() else None
        except SourceError:
            return None

    def loader(self) -> Any:
        """Its Triton kernels by qualname (:class:`conformance.engine.kernels.KernelLoader`)."""
        if self._loader is None:
            from conformance.engine.kernels import KernelLoader

            self._loader = KernelLoader(self.located())
        return self._loader

    def unavailable(self) -> str | None:
        """Why no source of the engine can be read here, or None."""
        if self.named() is None:
            return f"no {self.title} named: pass {self.option} VERSION|PATH (or set {self.env})"
        try:
            self.located()
        except SourceError as e:
            return str(e)
        return None


VLLM = Engine(_source.VLLM, ENV)


def use(spec: str) -> None:
    """Points the vLLM backends at ``spec`` (a release, a path, or ``installed``; "" for none)."""
    VLLM.use(spec)
    overrides.cache_clear()


def named() -> str | None:
    return VLLM.named()


def located() -> VllmSource:
    return VLLM.located()


def release() -> str | None:
    """The release of the named vLLM (its ``_version.py``), or None when none is named or readable."""
    return VLLM.release()


def loader() -> Any:
    return VLLM.loader()


@functools.cache
def overrides() -> Any:
    from conformance.engine.cpu import CpuOverrides

    return CpuOverrides(located())


def _unavailable(need_ops: bool) -> str | None:
    why = VLLM.unavailable()
    if why is not None:
        return why
    src = located()
    if need_ops and src.csrc is None and named() != INSTALLED:
        return f"vLLM's C++ sources are not in {src.label}: pass a release or a source tree"
    if need_ops:
        # The CPU port as the engine installs it: its adapters, registered through the dispatcher
        # (0.31.0 on) or patched in by the CPU model runner (before).
        from conformance.engine.cpu import PATCHING_RUNNER

        files = [CPU_ADAPTERS, *((DISPATCHER, CPU_PLATFORM) if (src.root / DISPATCHER).is_file() else (PATCHING_RUNNER,))]
        missing = [f for f in files if not (src.root / f).is_file()]
        if missing:
            return (f"vLLM {src.release or src.label} has no {' or '.join(missing)}: its CPU port cannot be found, "
                    "so backend vllm-cpu cannot load")
    return None


# The release the contracts are written against: a kernel another release lacks is reported, not failed.
REFERENCE_RELEASE = "0.33.0"
CPU_ADAPTERS, DISPATCHER, CPU_PLATFORM = "vllm/utils/cpu_triton_utils.py", "vllm/triton_utils/dispatcher.py", "vllm/platforms/cpu.py"


class SignatureDrift(TypeError):
    """An engine kernel whose parameters are not its contract's: launched by the contract's names it
    would bind wrongly (an interpreted Triton kernel silently drops a keyword it does not declare)."""


class Drifted:
    """Stands in for a kernel whose parameters differ from the contract's: every launch raises
    :class:`SignatureDrift` naming the difference, before anything runs. ``arg_names`` are the
    release's; ``declared`` says whether the contract lists them (``KernelSpec.earlier``)."""

    def __init__(self, message: str, arg_names: tuple[str, ...], declared: bool) -> None:
        self.message, self.arg_names, self.declared = message, arg_names, declared

    def __getitem__(self, grid: Any) -> Any:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise SignatureDrift(self.message)


class Bound:
    """An earlier release's kernel launched as that release's call site launches it: the contract's
    arguments mapped onto the release's parameters (``Earlier.bind``), its outputs judged like any
    backend's. Launch options (``num_warps``) pass through."""

    def __init__(self, kernel: Any, spec: KernelSpec, earlier: Earlier) -> None:
        if earlier.bind is None:
            raise ValueError(f"{spec.name}: the earlier signature through {earlier.through} declares no bind")
        self.kernel, self.spec, self.earlier, self.bind = kernel, spec, earlier, earlier.bind
        self.arg_names = spec.arg_names

    def __getitem__(self, grid: Any) -> Any:
        launch = self.kernel[grid]

        def call(*args: Any, **kwargs: Any) -> Any:
            named = dict(zip(self.spec.arg_names, args))
            options = {k: v for k, v in kwargs.items() if k not in self.spec.arg_names}
            named.update((k, v) for k, v in kwargs.items() if k in self.spec.arg_names)
            why = self.earlier.predates(named) if self.earlier.predates is not None else None
            if why is not None:  # the capability "a rule later than the release": unsupported, named
                raise ValueError(f"{self.spec.name}: vLLM through {self.earlier.through} predates {why}")
            return launch(**self.bind(named), **options)

        return call


def _params(kernel: Any) -> tuple[str, ...] | None:
    names = getattr(kernel, "arg_names", None)
    if names is None:
        try:
            names = list(inspect.signature(kernel).parameters)
        except (TypeError, ValueError):
            return None
    return tuple(names)


def _version(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", release)[:3])


def declared_earlier(spec: KernelSpec, kernel: Any, eng: Engine = VLLM) -> Earlier | None:
    """The contract's earlier signature (``KernelSpec.earlier``) ``kernel``'s parameters match, if any.
    A declaration with the contract's own parameters (a rule that came later under the same names)
    holds for the named release when it is no later than the declaration's ``through``."""
    names = _params(kernel)
    if names != spec.arg_names:
        return next((e for e in spec.earlier if e.params == names), None)
    named = eng.release()
    if named is None:
        return None
    return next((e for e in spec.earlier if e.params == names and _version(named) <= _version(e.through)), None)


def signature_drift(spec: KernelSpec, kernel: Any, eng: Engine = VLLM) -> str | None:
    """How ``kernel``'s parameters differ from ``spec``'s (names and order), or None. A declared
    earlier signature (``KernelSpec.earlier``) that matches is named with the release it holds for."""
    names, want = _params(kernel), spec.arg_names
    if names is None or names == want:
        return None
    release = eng.located().release or eng.located().label
    extra = ", ".join(repr(n) for n in names if n not in want)
    missing = ", ".join(repr(n) for n in want if n not in names)
    what = (f"takes {extra} where the contract has {missing}" if extra and missing
            else f"takes {extra}, which the contract does not have" if extra
            else f"lacks {missing}, which the contract has" if missing
            else "takes the contract's parameters in another order")
    declared = declared_earlier(spec, kernel, eng)
    why = f"; declared in the contract: {declared.note} (through {declared.through})" if declared else ""
    return f"{eng.title} {release}'s {spec.name} {what}{why}"


class _HostFunction:
    """A host function launched like a kernel: ``f[grid](...)`` is ``f(...)``."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)  # inspect.signature sees the function's parameters

    def __getitem__(self, grid: Any) -> Any:
        return self.fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def triton_kernel(spec: KernelSpec, eng: Engine) -> Any:
    """``eng``'s own kernel of ``spec`` as a backend launches it: as it is, bound as an earlier
    release's call site binds it, or standing in for one whose parameters drifted; None if absent."""
    if spec.engine_apart:
        return None
    kernel = eng.loader().kernel(spec.qualname)
    if kernel is None:
        return None
    earlier = declared_earlier(spec, kernel, eng)
    if earlier is not None and earlier.bind is not None:
        return Bound(_HostFunction(kernel) if spec.host else kernel, spec, earlier)
    drift = signature_drift(spec, kernel, eng)
    if drift is not None:
        return Drifted(drift, tuple(getattr(kernel, "arg_names", ()) or ()), "declared in the contract" in drift)
    return _HostFunction(kernel) if spec.host else kernel


def _triton_kernel(spec: KernelSpec) -> Any:
    return triton_kernel(spec, VLLM)


class _Op:
    """One of vLLM's C++ CPU ops launched as its contract: the contract's inputs in order, the
    returned tensor written into the contract's one output (checked: shape and dtype)."""

    def __init__(self, spec: KernelSpec, op: Any) -> None:
        self.spec, self.op = spec, op
        self.arg_names = spec.arg_names
        (self.out,) = spec.outputs
        self.inputs = tuple(p.name for p in spec.params if not p.is_output)

    def __getitem__(self, grid: Any) -> Any:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        a = {**dict(zip(self.arg_names, args)), **kwargs}
        got = self.op(*(a[n] for n in self.inputs))
        want = a[self.out.name]
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            what = f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor) else type(got).__name__
            raise TypeError(f"torch.ops._C.{self.spec.op} returned {what} where the contract's '{self.out.name}' is "
                            f"{tuple(want.shape)} {want.dtype}")
        want.copy_(got)


def _op(spec: KernelSpec) -> Any:
    """vLLM's C++ op for ``spec`` (KernelSpec.op) from the CPU build, or None where the release lacks it."""
    overrides()  # loads the ops
    return _Op(spec, getattr(torch.ops._C, spec.op)) if hasattr(torch.ops._C, spec.op) else None


def _cpu_kernel(spec: KernelSpec) -> Any:
    if spec.op:
        return _op(spec)
    if spec.qualname not in overrides().table:
        return None  # the release's CPU port has no such kernel, whatever its Triton kernel's parameters
    kernel = _triton_kernel(spec)
    if isinstance(kernel, Drifted):
        return kernel
    bound = kernel if isinstance(kernel, Bound) else None
    kernel = bound.kernel if bound is not None else kernel
    wrong = overrides().misbinding(spec.qualname, kernel)
    if wrong is not None:  # what every launch of the engine's CPU port would meet
        return Drifted(f"vLLM {located().release or located().label}'s {spec.name}: {wrong}", tuple(kernel.arg_names), False)
    wrapped = overrides().wrap(spec.qualname, kernel)
    return Bound(wrapped, spec, bound.earlier) if bound is not None else wrapped


def _cpu_lists(spec: KernelSpec) -> bool:
    """Whether the engine's CPU port overrides ``spec``, read from vLLM's source: nothing built or loaded."""
    from conformance.engine.cpu import override_table

    if spec.op:
        src = located()
        return src.csrc is not None and f'"{spec.op}(' in (src.csrc / "cpu" / "torch_bindings.cpp").read_text()
    return not spec.engine_apart and spec.qualname in override_table(located())


def triton_mode() -> str:
    """How Triton runs here, "compiled" or "interpreted" (triton_impl decides before Triton loads)."""
    import triton_impl

    return triton_impl.mode()


def triton_device() -> str:
    """Where Triton's tensors live here, "cuda" or "cpu"."""
    import triton_impl

    return triton_impl.device()


def _predated(spec: KernelSpec, a: Any) -> bool:
    """Whether the named release's kernel is bound (``Bound``) and predates the rule ``a`` falls under."""
    if not spec.earlier or named() is None:
        return False
    earlier = declared_earlier(spec, loader().kernel(spec.qualname))
    return earlier is not None and earlier.predates is not None and earlier.predates(a) is not None


# Either engine backend, on a release the contract binds (KernelSpec.earlier): the launch raises.
LATER_RULE = Capability(
    "a rule later than the release", None, _predated,
    "the release's kernel computes otherwise under a contract rule that came after it (Earlier.predates)",
)


def _off_call_site_ints(spec: KernelSpec, a: Any) -> bool:
    return any(
        p.kind is Kind.PTR and isinstance(a[p.name], torch.Tensor) and not a[p.name].dtype.is_floating_point
        and a[p.name].dtype != torch.bool and p.call_site is not None and a[p.name].dtype != p.call_site
        for p in spec.params
    )


# What vLLM 0.33.0's CPU port declines, each as the adapter or the C++ says it (cpu_triton_utils.py,
# spec_decode_utils.cpp). A case inside one is still launched: a clean refusal counts as
# `unsupported`; results it does produce are compared like any other.
CPU_CAPABILITIES = (
    LATER_RULE,
    Capability(
        "synthetic mode", ("rejection_greedy_sample_kernel", "rejection_random_sample_kernel"),
        lambda spec, a: bool(a["SYNTHETIC_MODE"]),
        "the adapters assert not SYNTHETIC_MODE ('Synthetic acceptance not supported with CPU sampling')",
    ),
    Capability(
        "context parallelism", ("compute_slot_mapping_kernel",),
        lambda spec, a: a["TOTAL_CP_WORLD_SIZE"] > 1,
        "the adapter asserts TOTAL_CP_WORLD_SIZE == 1 ('Context Parallelism is not supported on CPU')",
    ),
    Capability(
        "positions longer than batch_size", ("eagle_step_slot_mapping_metadata_kernel",),
        lambda spec, a: a["positions_ptr"].numel() != a["batch_size"],
        "the adapter asserts batch_size == positions.shape[0] (the call site passes exactly the batch)",
    ),
    Capability(
        "block_table_stride off the table's row stride", ("copy_and_expand_dflash_inputs_kernel",),
        lambda spec, a: a["block_table_stride"] != a["block_table_ptr"].stride(0),
        "the adapter asserts block_table_stride == block_table.stride(0) (the call site passes exactly that)",
    ),
    Capability(
        "the draft-logits cache, interpreted", ("_gumbel_sample_kernel",),
        lambda spec, a: triton_mode() == "interpreted" and a["logits_cache_ptr"] is not None,
        "0.33.0's Gumbel sampler stores the drafter's cache copy masked with a block & a scalar bool (mask & is_valid_req); "
        "the interpreter's & of those is no mask dtype ('mask has unsupported dtype'): compiled only",
    ),
    Capability(
        "integer dtypes off the call site", None, _off_call_site_ints,
        "the C++ reads each integer tensor at one width (data_ptr<int32_t> or <int64_t>); the adapters widen only some",
    ),
)

# vLLM 0.33.0's K1/K2 mix the loaded id width with int32 in one branch (`.to(tl.int32)` on the
# argmax, a ternary with the draft id): compiled Triton refuses other id widths (CompilationError).
def _interpreted_log1p(spec: KernelSpec, a: Any) -> bool:
    from contracts import mrv2

    return triton_mode() == "interpreted" and bool(a["HAS_DRAFT_LOGITS"]) and any(q.residual for q in mrv2.resamples(a))


def _interpreted_nan_probs(spec: KernelSpec, a: Any) -> bool:
    t = a["draft_token_ids_ptr"].numel()
    probs = [x.reshape(-1)[: t * a["vocab_size"]] for x in (a["target_probs_ptr"], a["draft_probs_ptr"]) if isinstance(x, torch.Tensor)]
    return triton_mode() == "interpreted" and any(bool(torch.isnan(x).any()) for x in probs)


TRITON_CAPABILITIES = (
    LATER_RULE,
    Capability(
        "context parallelism, interpreted", ("_compute_slot_mappings_kernel",),
        lambda spec, a: triton_mode() == "interpreted" and a["CP_SIZE"] != 1,
        "0.33.0's MRV2 slot mapping under CP_SIZE > 1 masks a load with a block & a scalar bool (is_local & is_real_req); "
        "the interpreter's & of those is no mask dtype ('mask has unsupported dtype'): compiled only",
    ),
    Capability(
        "the draft-logits cache, interpreted", ("_gumbel_sample_kernel",),
        lambda spec, a: triton_mode() == "interpreted" and a["logits_cache_ptr"] is not None,
        "0.33.0's Gumbel sampler stores the drafter's cache copy masked with a block & a scalar bool (mask & is_valid_req); "
        "the interpreter's & of those is no mask dtype ('mask has unsupported dtype'): compiled only",
    ),
    Capability(
        "integer dtypes off the call site", None, lambda spec, a: not spec.host and _off_call_site_ints(spec, a),
        "0.33.0's rejection kernels give one variable int32 and int64 types in two branches; compiled Triton refuses that",
    ),
    Capability(
        "an all-NaN tile, interpreted", ("sample_recovered_tokens_kernel",), _interpreted_nan_probs,
        "0.33.0's tl.max(score, return_indices=True) over a tile of NaN scores: the interpreter's numpy.nanargmax raises "
        "'All-NaN slice encountered' (compiled, the tile's index comes back)",
    ),
    Capability(
        "a tl.range variable's .to, interpreted", ("_topk_topp_kernel",), lambda spec, a: triton_mode() == "interpreted",
        "0.33.0's top-k/top-p kernel casts its tl.range row index with row_id.to(tl.int64); the interpreter makes that "
        "index a Python int, which has no .to: compiled only",
    ),
    Capability(
        "libdevice log1p, interpreted", ("_resample_kernel",), _interpreted_log1p,
        "0.33.0's MRV2 resample takes the draft's distribution out with tldevice.log1p, which Triton's interpreter "
        "cannot run: compiled only",
    ),
)

# Registered by conformance.backends, after the built-in backends.
BACKENDS = (
    Backend("vllm", _triton_kernel, triton_device, lambda: f"vLLM, {triton_mode()}", lambda: _unavailable(False),
            engine=True, package="vllm", capabilities=TRITON_CAPABILITIES, addresses=True, ops=False),
    Backend("vllm-cpu", _cpu_kernel, lambda: "cpu", lambda: "vLLM's CPU port", lambda: _unavailable(True),
            engine=True, package="vllm", capabilities=CPU_CAPABILITIES, launch_options=False, lists=_cpu_lists),
)
