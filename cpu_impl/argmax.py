"""CPU launchers of vLLM's CPU sampler ops over csrc/argmax.cpp."""

from __future__ import annotations

from contracts import argmax as contract
from cpu_impl.launcher import CpuKernel

greedy_argmax = CpuKernel(contract.GREEDY_ARGMAX)
fused_gumbel_argmax = CpuKernel(contract.FUSED_GUMBEL_ARGMAX)
