"""CPU launchers of the FLy pre-pass over csrc/fly.cpp."""

from __future__ import annotations

from contracts import fly as contract
from cpu_impl.launcher import CpuKernel, vocab_columns

apply_fly_greedy_acceptance_kernel = CpuKernel(
    contract.APPLY_FLY_GREEDY, vocab_columns(contract.APPLY_FLY_GREEDY, "target_logits_ptr")
)
apply_fly_random_acceptance_kernel = CpuKernel(
    contract.APPLY_FLY_RANDOM, vocab_columns(contract.APPLY_FLY_RANDOM, "target_probs_ptr", "draft_probs_ptr")
)
