"""CPU launcher of the top-k/top-p mask over csrc/topk_topp.cpp."""

from __future__ import annotations

from contracts import topk_topp as contract
from cpu_impl.launcher import CpuKernel

# The C++ side sees the workspace's element count only: its shape is checked here.
_topk_topp_kernel = CpuKernel(contract.TOPK_TOPP, contract.check_buffer)
# The split top-p pipeline: every check is the C++ side's (it sees LOGITS' rows).
_topp_sb_stats_kernel = CpuKernel(contract.TOPP_STATS)
_topp_sb_step_kernel = CpuKernel(contract.TOPP_STEP)
_topp_sb_mask_kernel = CpuKernel(contract.TOPP_MASK)
