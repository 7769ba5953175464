"""CPU launchers of the rejection-sampler kernels over csrc/rejection.cpp."""

from __future__ import annotations

from conformance.kernels import rejection as contracts
from cpu_impl.launcher import CpuKernel, vocab_columns

rejection_greedy_sample_kernel = CpuKernel(contracts.REJECTION_GREEDY)
rejection_random_sample_kernel = CpuKernel(
    contracts.REJECTION_RANDOM, vocab_columns(contracts.REJECTION_RANDOM, "target_probs_ptr", "draft_probs_ptr")
)
expand_kernel = CpuKernel(contracts.EXPAND)
sample_recovered_tokens_kernel = CpuKernel(
    contracts.SAMPLE_RECOVERED,
    vocab_columns(contracts.SAMPLE_RECOVERED, "target_probs_ptr", "draft_probs_ptr", "inv_q_ptr"),
)
