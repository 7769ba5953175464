"""CPU launchers of the rejection-sampler kernels over csrc/rejection.cpp."""

from __future__ import annotations

from contracts import rejection as contract
from cpu_impl.launcher import CpuKernel, vocab_columns

rejection_greedy_sample_kernel = CpuKernel(contract.REJECTION_GREEDY)
rejection_random_sample_kernel = CpuKernel(
    contract.REJECTION_RANDOM, vocab_columns(contract.REJECTION_RANDOM, "target_probs_ptr", "draft_probs_ptr")
)
expand_kernel = CpuKernel(contract.EXPAND)
sample_recovered_tokens_kernel = CpuKernel(
    contract.SAMPLE_RECOVERED,
    vocab_columns(contract.SAMPLE_RECOVERED, "target_probs_ptr", "draft_probs_ptr", "inv_q_ptr"),
)
