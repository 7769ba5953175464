"""CPU launcher of the top-k/top-p mask over csrc/topk_topp.cpp."""

from __future__ import annotations

from conformance.kernels import topk_topp as contracts
from cpu_impl.launcher import CpuKernel

# The C++ side sees the workspace's element count only: its shape is checked here.
_topk_topp_kernel = CpuKernel(contracts.TOPK_TOPP, contracts.check_buffer)
