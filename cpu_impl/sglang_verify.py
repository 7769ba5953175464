"""CPU launchers of SGLang's speculative verification over csrc/sglang_verify.cpp. The C++ side sees
element counts; the shapes are checked here, by the contract's own checks."""

from __future__ import annotations

from contracts import sglang_verify as contract
from cpu_impl.launcher import CpuKernel

speculative_sampling_classic_kernel = CpuKernel(contract.SPECULATIVE_SAMPLING_CLASSIC, contract.classic_shapes)
verify_tree_greedy_kernel_triton = CpuKernel(contract.GREEDY_TREE, contract.greedy_shapes)
tree_speculative_sampling_target_only = CpuKernel(contract.TARGET_ONLY, contract.target_only_shapes)
