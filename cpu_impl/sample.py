"""CPU launchers of Model Runner V2's sampling parameters over csrc/sample.cpp."""

from __future__ import annotations

from contracts import sample as contract
from cpu_impl.launcher import CpuKernel

_temperature_kernel = CpuKernel(contract.TEMPERATURE)
_min_p_kernel = CpuKernel(contract.MIN_P)
_gumbel_sample_kernel = CpuKernel(contract.GUMBEL_SAMPLE)
