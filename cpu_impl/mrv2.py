"""CPU launchers of Model Runner V2's rejection-sampler kernels over csrc/mrv2.cpp."""

from __future__ import annotations

from contracts import mrv2 as contract
from cpu_impl.launcher import CpuKernel

_gather_draft_sampled_kernel = CpuKernel(contract.GATHER_DRAFT_SAMPLED)
_flatten_sampled_kernel = CpuKernel(contract.FLATTEN_SAMPLED)
_compute_local_logits_stats_kernel = CpuKernel(contract.LOGITS_STATS)
_insert_resampled_kernel = CpuKernel(contract.INSERT_RESAMPLED)
_compute_cumulative_log_p_kernel = CpuKernel(contract.CUMULATIVE_LOG_P)
_compute_local_residual_mass_kernel = CpuKernel(contract.LOCAL_RESIDUAL_MASS)
_rejection_kernel = CpuKernel(contract.REJECTION)
_resample_kernel = CpuKernel(contract.RESAMPLE)
