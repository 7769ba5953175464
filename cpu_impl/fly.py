"""CPU launchers of the FLy pre-pass over csrc/fly.cpp."""

from __future__ import annotations

from conformance.kernels import fly as contracts
from cpu_impl.launcher import CpuKernel, vocab_columns

apply_fly_greedy_acceptance_kernel = CpuKernel(
    contracts.APPLY_FLY_GREEDY, vocab_columns(contracts.APPLY_FLY_GREEDY, "target_logits_ptr")
)
apply_fly_random_acceptance_kernel = CpuKernel(
    contracts.APPLY_FLY_RANDOM, vocab_columns(contracts.APPLY_FLY_RANDOM, "target_probs_ptr", "draft_probs_ptr")
)
