"""SGLang as a second engine: its own Triton kernels (``sglang``) and its C++ CPU op (``sglang-cpu``).

Both stay unavailable until SGLang is named: ``--sglang VERSION|PATH`` on the command line, or
``SPECDIFF_SGLANG`` in the environment (child processes inherit it). A release is one pinned wheel
from the package index (SGLang publishes no sdist), digest-checked, of which only the modules of
its speculative and sampling kernels are unpacked (:data:`conformance.engine.source.SGLANG`).

``sglang`` runs SGLang's ``@triton.jit`` kernels, read by the same loader as vLLM's (root package
``sglang``; nothing of SGLang is imported), interpreted on a CPU machine and compiled on a GPU. A
kernel of SGLang's with no Triton form (the target-only tree sampler is a CUDA kernel compiled at
run time) reads ``n/a`` there, with the reason (:data:`NO_TRITON`); so does every kernel of another
engine, and vLLM's backends read ``n/a`` for SGLang's kernels (``Backend.package``).

``sglang-cpu`` is what SGLang runs on a CPU: ``torch.ops.sgl_kernel.verify_tree_greedy_cpu``, which
its greedy tree verification calls there (``spec_tree.verify_tree_greedy_func``). Its C++ is in the
sgl-kernel source tree, which the package index does not hold (``sglang-kernel``'s wheels are CUDA
builds without sources), so the backend is unavailable until ``--sglang-kernel PATH`` (or
``SPECDIFF_SGLANG_KERNEL``) names an sgl-kernel checkout; it then builds ``csrc/cpu/spec.cpp`` with a
registration unit generated from that checkout's ``torch_extension_cpu.cpp``, as vLLM's CPU ops are
built (:func:`conformance.engine.cpu.compile_library`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from conformance.backend import Backend, Capability
from conformance.engine import Drifted, Engine, source, triton_device, triton_kernel, triton_mode
from conformance.engine.source import SourceError, cache_dir
from contracts.sglang_verify import TREE_INDICES
from contracts.spec import KernelSpec

SGLANG = Engine(source.SGLANG, "SPECDIFF_SGLANG")
KERNEL_ENV = "SPECDIFF_SGLANG_KERNEL"

SPEC_TREE = "sglang.kernels.ops.speculative.spec_tree"
GREEDY = f"{SPEC_TREE}.verify_tree_greedy_kernel_triton"
CHAIN = "sglang.kernels.ops.speculative.reject_sampling.speculative_sampling_classic_kernel"
TARGET_ONLY = "sglang.kernels.ops.speculative.sampling.tree_speculative_sampling_target_only"

# SGLang's kernels with no Triton form, and why (read from 0.5.23's sources).
NO_TRITON = {
    TARGET_ONLY: "SGLang implements tree_speculative_sampling_target_only as a CUDA kernel compiled at run time "
                 "(tvm-ffi, jit/csrc/speculative/sampling.cuh); it has no Triton form, and on a CPU or XPU SGLang "
                 "has no such sampler at all",
}
# SGLang's kernels with no form on a CPU: there it verifies greedily whatever the temperature
# (srt/speculative/eagle_utils.py, _verify_uses_greedy), so no sampler of its runs on a CPU.
NO_CPU = {
    q: f"SGLang has no CPU form of {q.rpartition('.')[2]}: on a CPU it verifies greedily whatever the temperature "
       "(eagle_utils.py, _verify_uses_greedy), with verify_tree_greedy_cpu"
    for q in (CHAIN, TARGET_ONLY)
}


def use(spec: str) -> None:
    """Points the SGLang backends at ``spec`` (a release or a path; "" for none)."""
    SGLANG.use(spec)
    _ops.clear()


def use_kernel(path: str) -> None:
    """Points ``sglang-cpu`` at an sgl-kernel checkout ("" for none)."""
    os.environ[KERNEL_ENV] = path
    _ops.clear()


def named() -> str | None:
    return SGLANG.named()


def kernel_named() -> str | None:
    return os.environ.get(KERNEL_ENV) or None


# -- sglang: SGLang's Triton kernels ------------------------------------------------------------------------
def _triton(spec: KernelSpec) -> Any:
    if not SGLANG.loader().is_triton(spec.qualname):
        return None  # absent from this release, or no Triton kernel (its host function is never executed)
    return triton_kernel(spec, SGLANG)


def _lists(spec: KernelSpec) -> bool:
    return SGLANG.loader().is_triton(spec.qualname)


# -- sglang-cpu: SGLang's C++ CPU op -----------------------------------------------------------------------
# The op each kernel's CPU form is, and the argument list SGLang's call site passes it on a CPU
# (spec_tree.verify_tree_greedy_func): the kernel's eight tensors, shaped as the call site shapes
# them (read from the kernel's three sizes), in the kernel's order.
CPU_OPS = {GREEDY: "verify_tree_greedy_cpu"}
GREEDY_SIZES = ("batch_size", "num_speculative_tokens", "num_draft_tokens")
CPU_SOURCES = ("spec.cpp",)
CXXFLAGS = ("-O3", "-fopenmp", "-std=c++17", "-fPIC")


def kernel_tree() -> Path:
    """The ``csrc/cpu`` directory of the named sgl-kernel checkout (the repository's root, its
    ``sgl-kernel/`` or that directory itself), holding spec.cpp, common.h and torch_extension_cpu.cpp."""
    named = kernel_named()
    if named is None:
        raise SourceError(f"no sgl-kernel source named: SGLang's C++ CPU ops are not on the package index (sglang-kernel's "
                          f"wheels are CUDA builds without sources); pass --sglang-kernel PATH to a checkout (or set {KERNEL_ENV})")
    root = Path(named).expanduser()
    for d in (root / "sgl-kernel" / "csrc" / "cpu", root / "csrc" / "cpu", root):
        if (d / "spec.cpp").is_file():
            missing = [f for f in ("common.h", "torch_extension_cpu.cpp") if not (d / f).is_file()]
            if missing:
                raise SourceError(f"--sglang-kernel {named!r}: {d} has spec.cpp but no {' or '.join(missing)}")
            return d.resolve()
    raise SourceError(f"--sglang-kernel {named!r}: no sgl-kernel/csrc/cpu/spec.cpp under it (expected an sgl-kernel checkout)")


def build_cpu_ops(tree: Path, extra: tuple[str, ...] = ()) -> Path:
    """SGLang's CPU ops of :data:`CPU_OPS` built from ``tree`` (an sgl-kernel ``csrc/cpu``), cached by content."""
    from conformance.engine.cpu import compile_library, registration

    shim = registration((tree / "torch_extension_cpu.cpp").read_text(), sorted(set(CPU_OPS.values())), binder="m",
                        namespace="sgl_kernel", origin="sgl-kernel's csrc/cpu/torch_extension_cpu.cpp")
    flags = [*CXXFLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", *extra]
    h = hashlib.sha256(shim.encode())
    for f in (*CPU_SOURCES, *sorted(p.name for p in tree.glob("*.h"))):
        h.update((tree / f).read_bytes())
    h.update(" ".join(flags).encode() + torch.__version__.encode())
    out = cache_dir() / "sglang-cpu" / f"ops-{h.hexdigest()[:16]}.so"
    if "CHECK_GE" not in (tree / "common.h").read_text():
        # Newer spec.cpp checks sizes with CHECK_GE, which older common.h lacks; TORCH_CHECK, as its siblings.
        prelude = out.with_suffix(".prelude.h")
        prelude.parent.mkdir(parents=True, exist_ok=True)
        prelude.write_text('#pragma once\n#include <c10/util/Exception.h>\n'
                           '#define CHECK_GE(a, b) TORCH_CHECK((a) >= (b), #a " must be >= " #b)\n')
        flags += ["-include", str(prelude)]
    return compile_library([tree / f for f in CPU_SOURCES], [tree], shim, flags, out, "SGLang's CPU ops")


_ops: dict[str, Any] = {}


def _load_ops() -> str:
    """Loads SGLang's CPU ops into ``torch.ops.sgl_kernel`` (once per process); returns the library."""
    if "library" not in _ops:
        library = build_cpu_ops(kernel_tree(), tuple(os.environ.get("SPECDIFF_SGLANG_CXXFLAGS", "").split()))
        if not all(hasattr(torch.ops.sgl_kernel, op) for op in CPU_OPS.values()):
            torch.ops.load_library(str(library))
        _ops["library"] = str(library)
    return _ops["library"]


class _CpuOp:
    """SGLang's C++ op launched as its call site launches it on a CPU, for a launch of the kernel's
    contract: the kernel's tensors viewed at the call site's shapes (views: the op writes the
    caller's outputs), the sizes dropped. A tensor no view can take (non-contiguous) is passed as it
    is, for the op to refuse."""

    def __init__(self, spec: KernelSpec, op: Any) -> None:
        self.spec, self.op = spec, op
        self.arg_names = spec.arg_names

    def __getitem__(self, grid: Any) -> Any:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        a = {**dict(zip(self.arg_names, args)), **kwargs}
        values = [a[n] for n in self.arg_names]
        bs, steps, n = values[8:11]
        shapes = ((bs * n,), (bs, steps), (bs,), *[(bs, n)] * 5)
        self.op(*(_view(t, shape) for t, shape in zip(values[:8], shapes)))


def _view(t: Any, shape: tuple[int, ...]) -> Any:
    if not isinstance(t, torch.Tensor) or not t.is_contiguous():
        return t
    count = 1
    for s in shape:
        count *= s
    flat = t.view(-1)
    return flat[:count].view(shape) if flat.numel() >= count else t


def _cpu(spec: KernelSpec) -> Any:
    op = CPU_OPS.get(spec.qualname)
    if op is None:
        return None
    if spec.arg_names[8:11] != GREEDY_SIZES or len(spec.arg_names) != 11:
        return Drifted(f"the contract of {spec.name} takes {', '.join(spec.arg_names)}; SGLang's CPU op {op} is launched from "
                       f"eight tensors and {', '.join(GREEDY_SIZES)}", spec.arg_names, False)
    _load_ops()
    return _CpuOp(spec, getattr(torch.ops.sgl_kernel, op))


def _cpu_unavailable() -> str | None:
    try:
        kernel_tree()
    except SourceError as e:
        return str(e)
    return None


def _launch(spec: KernelSpec, a: Mapping[str, Any]) -> list[Any]:
    """A launch's arguments in the kernel's order: eight tensors (three outputs, five index tensors), three sizes."""
    return [a.get(n) for n in spec.arg_names]


def _tensors(values: list[Any]) -> list[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor)]


def _mixed_indices(spec: KernelSpec, a: Mapping[str, Any]) -> bool:
    dtypes = {t.dtype for t in _tensors(_launch(spec, a)[3:8])}
    return len(dtypes) > 1 or not dtypes <= {torch.int32, torch.int64}


def _off_size(spec: KernelSpec, a: Mapping[str, Any]) -> bool:
    v = _launch(spec, a)
    return len(v) == 11 and isinstance(v[0], torch.Tensor) and v[0].numel() != v[8] * v[10]


# What the C++ op refuses (sgl-kernel csrc/cpu/spec.cpp, verify_tree_greedy_cpu's checks): a case
# inside one is still launched; a clean refusal counts as `unsupported`.
CPU_CAPABILITIES = (
    Capability(
        "index tensors of mixed or narrow dtypes", None, _mixed_indices,
        "the op dispatches the five index tensors at one index type, int32 or int64 (AT_DISPATCH_INDEX_TYPES)",
    ),
    Capability(
        "outputs other than int32", None,
        lambda spec, a: any(t.dtype != torch.int32 for t in _tensors(_launch(spec, a)[:3])),
        "the op checks predicts, accept_index and accept_token_num are int32",
    ),
    Capability(
        "non-contiguous tensors", None,
        lambda spec, a: any(not t.is_contiguous() for t in _tensors(_launch(spec, a))),
        "the op checks every tensor is contiguous (CHECK_INPUT)",
    ),
    Capability(
        "predicts off the call site's size", None, _off_size,
        "the op takes predicts of batch_size * num_draft_tokens cells, as the call site allocates it",
    ),
)

def _compiled(test: Any) -> Any:
    return lambda spec, a: triton_mode() == "compiled" and bool(test(spec, a))


def _index_widths(spec: KernelSpec, a: Mapping[str, Any]) -> bool:
    return len({a[n].dtype for n in TREE_INDICES if isinstance(a.get(n), torch.Tensor)}) > 1


# What SGLang's Triton kernels cannot compile (Triton 3.6, sm_90); interpreted they run. A case inside
# one is still launched; a clean refusal counts as `unsupported`.
TRITON_CAPABILITIES = (
    Capability(
        "one slot token by token, compiled", (CHAIN.rpartition(".")[2],),
        _compiled(lambda spec, a: a.get("NUM_SLOTS") == 1 and not a.get("BLOCK_VERIFICATION")),
        "speculative_sampling_classic_kernel with NUM_SLOTS = 1 (no draft) fails Triton's TritonGPUCoalesce pass; "
        "SGLang's call sites always pass a draft",
    ),
    Capability(
        "index tensors of mixed widths, compiled", (GREEDY.rpartition(".")[2],), _compiled(_index_widths),
        "verify_tree_greedy_kernel_triton's walk index takes the width of each tensor it is read from: int32 and int64 "
        "mixed do not compile; SGLang's call sites pass int64 throughout",
    ),
)

# Registered by conformance.backends, after vLLM's.
BACKENDS = (
    Backend("sglang", _triton, triton_device, lambda: f"SGLang, {triton_mode()}", SGLANG.unavailable,
            engine=True, package="sglang", triton=True, ops=False, absent=NO_TRITON, lists=_lists,
            capabilities=TRITON_CAPABILITIES),
    Backend("sglang-cpu", _cpu, lambda: "cpu", lambda: "SGLang's CPU op", _cpu_unavailable,
            engine=True, package="sglang", capabilities=CPU_CAPABILITIES, launch_options=False, ops=False, absent=NO_CPU,
            lists=lambda spec: spec.qualname in CPU_OPS),
)
