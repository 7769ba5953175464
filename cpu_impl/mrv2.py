"""CPU launchers of Model Runner V2's rejection-sampler kernels over csrc/mrv2.cpp."""

from __future__ import annotations

from conformance.kernels import mrv2 as contracts
from cpu_impl.launcher import CpuKernel

_gather_draft_sampled_kernel = CpuKernel(contracts.GATHER_DRAFT_SAMPLED)
_flatten_sampled_kernel = CpuKernel(contracts.FLATTEN_SAMPLED)
_compute_local_logits_stats_kernel = CpuKernel(contracts.LOGITS_STATS)
_insert_resampled_kernel = CpuKernel(contracts.INSERT_RESAMPLED)
_compute_cumulative_log_p_kernel = CpuKernel(contracts.CUMULATIVE_LOG_P)
_compute_local_residual_mass_kernel = CpuKernel(contracts.LOCAL_RESIDUAL_MASS)
_rejection_kernel = CpuKernel(contracts.REJECTION)
_resample_kernel = CpuKernel(contracts.RESAMPLE)
