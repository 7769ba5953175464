"""CPU launchers of the rejection-sampler kernels over csrc/rejection.cpp."""

from __future__ import annotations

from collections.abc import Callable

from conformance.contract import Args, KernelSpec
from conformance.kernels import rejection as contracts
from cpu_impl.launcher import CpuKernel


def _vocab_columns(spec: KernelSpec, *names: str) -> Callable[[Args], None]:
    """[rows, V] tensors have V = vocab_size columns: the C++ side sees element counts, not shapes."""

    def check(a: Args) -> None:
        v = a["vocab_size"]
        for name in names:
            t = a[name]
            if t is not None and t.shape[-1] != v:
                raise ValueError(f"{spec.name}: '{name}' must have shape [rows, vocab_size={v}], got {tuple(t.shape)}")

    return check


rejection_greedy_sample_kernel = CpuKernel(contracts.REJECTION_GREEDY)
rejection_random_sample_kernel = CpuKernel(
    contracts.REJECTION_RANDOM, _vocab_columns(contracts.REJECTION_RANDOM, "target_probs_ptr", "draft_probs_ptr")
)
expand_kernel = CpuKernel(contracts.EXPAND)
sample_recovered_tokens_kernel = CpuKernel(
    contracts.SAMPLE_RECOVERED,
    _vocab_columns(contracts.SAMPLE_RECOVERED, "target_probs_ptr", "draft_probs_ptr", "inv_q_ptr"),
)
