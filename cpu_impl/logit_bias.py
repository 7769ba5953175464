"""CPU launcher of Model Runner V2's logit bias over csrc/logit_bias.cpp."""

from __future__ import annotations

from contracts import logit_bias as contract
from cpu_impl.launcher import CpuKernel

_bias_kernel = CpuKernel(contract.LOGIT_BIAS)
