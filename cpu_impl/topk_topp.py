"""CPU launcher of the top-k/top-p mask over csrc/topk_topp.cpp."""

from __future__ import annotations

from conformance.kernels import topk_topp as contracts
from cpu_impl.launcher import CpuKernel

# The C++ side sees the workspace's element count only: its shape is checked here.
_topk_topp_kernel = CpuKernel(contracts.TOPK_TOPP, contracts.check_buffer)
# The split top-p pipeline: every check is the C++ side's (it sees LOGITS' rows).
_topp_sb_stats_kernel = CpuKernel(contracts.TOPP_STATS)
_topp_sb_step_kernel = CpuKernel(contracts.TOPP_STEP)
_topp_sb_mask_kernel = CpuKernel(contracts.TOPP_MASK)
